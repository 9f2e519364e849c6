//! The request bodies of the HTTP API: the one definition the handlers
//! parse and the CLI and MCP send (the answers are in `views`). Their
//! limits beyond what a type says are checked by the handlers.

use serde::{Deserialize, Serialize};

use crate::runs::{Budget, EnvelopeRequest};

/// The body of `run_command` (`POST /v1/runs/{run}/tools/run_command`,
/// `POST /v1/tools/run_command`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommand {
    /// The argv (no shell unless it names one).
    #[schema(schema_with = crate::surfaces::api::schema::argv)]
    pub command: Vec<String>,
    /// Run in the background: the answer is the op's id at once, its
    /// result comes in a report.
    #[serde(default)]
    pub background: bool,
    /// Seconds from the command's start (at least 1; at most the kernel's
    /// ceiling: 900 in the foreground and 3600 in the background by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub timeout_sec: Option<u64>,
}

/// The body of `kill_operation` (`POST /v1/runs/{run}/tools/kill_operation`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KillOperation {
    /// The op to kill (a lowercase UUID).
    #[schema(pattern = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub operation_id: String,
}

/// The body of `POST /v1/operations/{id}/deny`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Deny {
    /// Why, for the run's report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The body of `POST /v1/runs`: a top-level run (operator) or a child of
/// the token's run, whose envelope and budget only narrow the parent's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    /// The new run's id.
    #[schema(pattern = r"^[A-Za-z0-9_.-]{1,64}$")]
    pub run_id: String,
    /// Its envelope (a child's: within its parent's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envelope: Option<EnvelopeRequest>,
    /// Its budget (a child's: within what its parent has left).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
}

/// The body of `POST /v1/runs/{run}/complete`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Complete {
    /// What the run achieved (1 to 16384 bytes, no NUL).
    #[schema(
        min_length = 1,
        max_length = 4096,
        pattern = r"^[^\u0000]*\S[^\u0000]*$"
    )]
    pub summary: String,
}

/// The body of `POST /v1/runs/{run}/usage`: one model call's usage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageRequest {
    /// The model used (1 to 128 characters, no control characters).
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\u0000-\u001f\u007f-\u009f]*[^\s\u0000-\u001f\u007f-\u009f][^\u0000-\u001f\u007f-\u009f]*$"
    )]
    pub model: String,
    /// Input tokens (at most 2^48).
    #[serde(default)]
    #[schema(maximum = 281474976710656_u64)]
    pub input_tokens: u64,
    /// Output tokens (at most 2^48).
    #[serde(default)]
    #[schema(maximum = 281474976710656_u64)]
    pub output_tokens: u64,
    /// Cost in millionths of the currency unit (at most 2^48).
    #[serde(default)]
    #[schema(maximum = 281474976710656_u64)]
    pub cost_micros: u64,
}

/// Body of `POST /v1/runs/{run}/schedules`: the command, an optional
/// `timeout_sec`, exactly one of `cron` (5-field, UTC), `every_sec` or `at`
/// (RFC 3339), and the `catch_up` and `delete_after_success` flags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSchedule {
    /// The argv each firing runs.
    #[schema(schema_with = crate::surfaces::api::schema::argv)]
    pub command: Vec<String>,
    /// Seconds from the command's start (at least 1; at most the kernel's
    /// ceiling: 900 in the foreground and 3600 in the background by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub timeout_sec: Option<u64>,
    /// A 5-field cron expression, in UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The period, in seconds (1 to 366 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 31_622_400)]
    pub every_sec: Option<u64>,
    /// One time (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// Fire once for the due times missed while the kernel was down.
    #[serde(default)]
    pub catch_up: bool,
    /// Delete the schedule once a firing succeeds.
    #[serde(default)]
    pub delete_after_success: bool,
}

/// Body of `POST /v1/runs/{run}/notes`: `{"text"}`, a human steer for
/// the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Note {
    /// The note (1 to 16384 bytes, no NUL).
    #[schema(
        min_length = 1,
        max_length = 4096,
        pattern = r"^[^\u0000]*\S[^\u0000]*$"
    )]
    pub text: String,
}
