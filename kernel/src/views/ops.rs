//! Views of ops: one op, lists of ops (also the approvals waiting), a
//! finished run's outcomes and the console's SSE events.

use serde::{Deserialize, Serialize};

use super::rfc3339;
use crate::report_text::{bounded_argv, MAX_VIEW_ARGV_BYTES};
use crate::store::{now_ms, Op};

/// An op as the API shows it (`GET /v1/operations/{id}`, and the answer
/// of every call that starts, kills, approves or denies one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpView {
    pub operation_id: String,
    pub run_id: String,
    pub command: Vec<String>,
    pub command_truncated: bool,
    pub background: bool,
    pub status: String,
    /// Not terminal (starting, running or awaiting approval): derived by
    /// the server so clients only display it.
    pub live: bool,
    pub exit_code: Option<i32>,
    pub killed: bool,
    pub effect: Option<String>,
    pub attempt: u32,
    pub container_id: Option<String>,
    pub pid: Option<u32>,
    pub created_at: String,
    pub started_at: Option<String>,
    pub heartbeat_at: Option<String>,
    pub finished_at: Option<String>,
    pub duration_sec: f64,
    pub timeout_sec: u64,
    pub kill_requested: bool,
    pub output_tail: Option<String>,
    pub log_sha256: Option<String>,
    pub log_size: Option<u64>,
    /// CPU time (user + system, ms) of the command's process tree; null
    /// when unknown.
    pub cpu_ms: Option<u64>,
    /// Largest resident set (KiB) of one process of the tree; null when unknown.
    pub max_rss_kb: Option<u64>,
    /// Processes the command left behind that were stopped (TERM, grace,
    /// KILL) when it exited, before its code was recorded (SPEC §21).
    #[serde(default)]
    pub leftovers_stopped: u32,
    /// The op's error, or what the answering call has to say about it.
    pub message: Option<String>,
    pub delivered: bool,
    pub report_id: Option<String>,
    /// A foreground op's output (in its reply only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// The approval hold, for an op an approval rule matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalView>,
    /// The schedule that fired it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_id: Option<String>,
}

/// An op's approval hold and its decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalView {
    pub rule: String,
    pub timeout_sec: Option<u64>,
    pub on_timeout: Option<String>,
    pub escalated_at: Option<String>,
    /// `operator` (approved or denied), `timeout` or `kill` (denied).
    pub decided_by: Option<String>,
    pub decided_at: Option<String>,
}

impl OpView {
    /// The view of a stored op (`live`, `duration_sec` and `delivered`
    /// derived now).
    pub fn of(op: &Op) -> OpView {
        let end = op.finished_at.unwrap_or_else(now_ms);
        let (command, command_truncated) = bounded_argv(&op.command, MAX_VIEW_ARGV_BYTES);
        OpView {
            operation_id: op.id.clone(),
            run_id: op.run_id.clone(),
            command,
            command_truncated,
            background: op.background,
            status: op.status.as_str().to_owned(),
            live: !op.status.is_terminal(),
            exit_code: op.exit_code,
            killed: op.killed,
            effect: op.effect.clone(),
            attempt: op.attempt,
            container_id: op.container_id.clone(),
            pid: op.pid.as_ref().map(|p| p.pid),
            created_at: rfc3339(op.created_at),
            started_at: op.started_at.map(rfc3339),
            heartbeat_at: op.heartbeat_at.map(rfc3339),
            finished_at: op.finished_at.map(rfc3339),
            duration_sec: ((end - op.budget_start_ms()).max(0) as f64) / 1000.0,
            timeout_sec: op.timeout_sec,
            kill_requested: op.kill_requested_at.is_some(),
            output_tail: op.output_tail.clone(),
            log_sha256: op.log_sha256.clone(),
            log_size: op.log_size,
            cpu_ms: op.usage.map(|u| u.cpu_ms),
            max_rss_kb: op.usage.map(|u| u.max_rss_kb),
            leftovers_stopped: op.leftovers,
            message: op.error.clone(),
            delivered: op.report_id.is_some() || op.delivered_inline,
            report_id: op.report_id.clone(),
            output: None,
            approval: op.approval_rule.as_ref().map(|rule| ApprovalView {
                rule: rule.clone(),
                timeout_sec: op.approval_timeout_sec,
                on_timeout: op.approval_on_timeout.map(|o| o.as_str().to_owned()),
                escalated_at: op.approval_escalated_at.map(rfc3339),
                decided_by: op.approval_decided_by.clone(),
                decided_at: op.approval_decided_at.map(rfc3339),
            }),
            schedule_id: op.schedule_id.clone(),
        }
    }

    /// The view with `message` set to what the answering call says.
    pub fn saying(mut self, message: impl Into<String>) -> OpView {
        self.message = Some(message.into());
        self
    }
}

/// `GET /v1/ops`, and `GET /v1/approvals` (the ops waiting for one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpList {
    pub operations: Vec<OpView>,
}

/// A finished run's outcomes (`POST /v1/runs/{run}/finish`): every op,
/// and the report of what was not yet delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinishView {
    pub run_id: String,
    pub operations: Vec<OpView>,
    pub report: Option<crate::store::Report>,
}

/// The console's `output` event: bytes of the log up to `offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsoleOutput {
    /// The log offset after this chunk (also the SSE event id).
    pub offset: u64,
    /// The chunk, as UTF-8 (invalid bytes replaced).
    pub text: String,
}

/// The console's last event, `done`: how the op ended (only `status`,
/// `unknown`, when the op is gone).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConsoleDone {
    pub operation_id: String,
    pub status: String,
    pub exit_code: Option<i32>,
    pub killed: bool,
    pub effect: Option<String>,
    pub message: Option<String>,
}
