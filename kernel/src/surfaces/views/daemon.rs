//! Views of the daemon itself: health, who a token is, the published tool
//! definitions, and the drill hooks' answers.

use serde::{Deserialize, Serialize};

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Health {
    /// Always true: the kernel answers.
    pub ok: bool,
    /// This kernel process's identity (`boot_id:pid:start_ticks`).
    pub kernel_id: String,
}

/// Who a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PrincipalKind {
    /// The operator token: every run.
    Operator,
    /// A run token: its run and (for state-like actions) its descendants.
    Run,
}

/// `GET /v1/whoami`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WhoAmI {
    /// The operator, or a run.
    pub principal: PrincipalKind,
    /// The token's run (null for the operator).
    pub run_id: Option<String>,
}

/// `GET /v1/tools`: the tools for function calling, limits stated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolsView {
    /// `run_command` and `kill_operation`.
    pub tools: Vec<ToolDefinition>,
}

/// One tool definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolDefinition {
    /// The tool's name, as a model calls it.
    pub name: String,
    /// What a model reads: the tool, its limits and its replies.
    pub description: String,
    /// The arguments' JSON schema (an object schema).
    pub parameters: serde_json::Value,
}

/// A drill hook's fault injected into an op's observer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DrillFault {
    /// The op whose observer the fault is aimed at.
    pub operation_id: String,
    /// What the observer will do.
    pub fault: String,
}

/// A drill hook's spurious wake-up of an op's observer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DrillWoken {
    /// The op whose observer was woken.
    pub operation_id: String,
    /// Always true: the wake-up was sent.
    pub woken: bool,
}

/// A drill hook's step of the kernel's wall clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClockStepped {
    /// The step applied, in ms (negative: backwards).
    pub stepped_ms: i64,
    /// The kernel's wall clock after the step (RFC 3339).
    pub now: String,
}
