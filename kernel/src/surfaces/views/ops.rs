//! Views of ops: one op, lists of ops (also the approvals waiting), a
//! finished run's outcomes and the console's SSE events.

use serde::{Deserialize, Serialize};

use super::rfc3339;
use crate::lifecycle::Status;
use crate::report_text::{bounded_argv, MAX_VIEW_ARGV_BYTES};
use crate::store::{now_ms, Op};

/// An op as the API shows it (`GET /v1/operations/{id}`, and the answer
/// of every call that starts, kills, approves or denies one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OpView {
    /// The op's id, a UUID.
    pub operation_id: String,
    /// The run it belongs to.
    pub run_id: String,
    /// Its argv, cut to `MAX_VIEW_ARGV_BYTES` (4 KiB).
    pub command: Vec<String>,
    /// `command` was cut.
    pub command_truncated: bool,
    /// Started in the background (its result comes in a report) or in
    /// the foreground.
    pub background: bool,
    /// `awaiting_approval`, `starting`, `running`, or a terminal status:
    /// `completed`, `timed_out`, `lost`, `failed`, `denied`.
    pub status: Status,
    /// Not terminal (starting, running or awaiting approval): derived by
    /// the server so clients only display it. Absent from a kernel older
    /// than the field (read as false; [`OpView::is_live`] goes by status).
    #[serde(default)]
    pub live: bool,
    /// The command's exit code; null when it has none (never made up).
    pub exit_code: Option<i32>,
    /// Ended by a kill or timeout signal (exit 143 on TERM, 137 on KILL).
    pub killed: bool,
    /// `uncertain` for a lost or timed-out op: the command may or may
    /// not have done its work.
    pub effect: Option<String>,
    /// The observer attempt; only attempt 1 executed the command.
    pub attempt: u32,
    /// The container it was launched in; null until claimed.
    pub container_id: Option<String>,
    /// Its wrapper's pid inside the container (from the `.pid` file);
    /// null until recorded.
    pub pid: Option<u32>,
    /// When it was admitted (RFC 3339, UTC).
    pub created_at: String,
    /// When its start was confirmed; null before.
    pub started_at: Option<String>,
    /// When its observer last refreshed it; null before the first beat.
    pub heartbeat_at: Option<String>,
    /// When it was settled; null while live.
    pub finished_at: Option<String>,
    /// Seconds from the start of its timeout budget (start, else
    /// approval, else admission) to its end, or to now while live.
    pub duration_sec: f64,
    /// Its timeout in seconds, counted from its start.
    pub timeout_sec: u64,
    /// A kill or timeout has been requested.
    pub kill_requested: bool,
    /// The end of its output, kept after its log file is pruned; null
    /// until it settles.
    pub output_tail: Option<String>,
    /// Hex sha256 of its final log (its output artifact); null until
    /// it settles.
    pub log_sha256: Option<String>,
    /// Its final log's size in bytes; null until it settles.
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
    /// Its result reached the agent: in a report, or in a foreground
    /// reply.
    pub delivered: bool,
    /// The report that delivered it; null until drained (and for a
    /// foreground op).
    pub report_id: Option<String>,
    /// A foreground op's output (in its reply only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// In a foreground reply: the op still runs (its `yield_ms` passed);
    /// its result comes in a report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<bool>,
    /// In a foreground reply: the offset after `output`, for `read_output`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// Its stdin is open to `write_stdin` (started with `stdin` or `tty`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin: bool,
    /// It runs on a terminal (`resize_tty` applies).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tty: bool,
    /// The approval hold, for an op an approval rule matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalView>,
    /// The schedule that fired it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_id: Option<String>,
    /// The cluster node it is placed on (it ran there); absent on a single
    /// kernel (SPEC §24).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Where it came from (SPEC §28): surface, channel, principal; absent
    /// for an op admitted before origins were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<crate::origin::Origin>,
}

/// An op's approval hold and its decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApprovalView {
    /// The approval rule (regex) that matched its command.
    pub rule: String,
    /// How long it may wait for a decision, seconds; null: forever.
    pub timeout_sec: Option<u64>,
    /// `escalate` or `deny` when the wait times out; null: escalate.
    pub on_timeout: Option<String>,
    /// When the wait was escalated (it keeps waiting); null if not.
    pub escalated_at: Option<String>,
    /// `operator` (approved or denied), `timeout` or `kill` (denied).
    pub decided_by: Option<String>,
    /// When it was approved or denied; null while waiting.
    pub decided_at: Option<String>,
}

impl OpView {
    /// Whether the op is not terminal, by its status (what `live` says,
    /// also for an answer from a kernel that did not send `live`).
    pub fn is_live(&self) -> bool {
        !self.status.is_terminal()
    }

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
            status: op.status,
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
            running: None,
            next_offset: None,
            stdin: op.io.has_stdin(),
            tty: op.io.is_tty(),
            approval: op.approval_rule.as_ref().map(|rule| ApprovalView {
                rule: rule.clone(),
                timeout_sec: op.approval_timeout_sec,
                on_timeout: op.approval_on_timeout.map(|o| o.as_str().to_owned()),
                escalated_at: op.approval_escalated_at.map(rfc3339),
                decided_by: op.approval_decided_by.clone(),
                decided_at: op.approval_decided_at.map(rfc3339),
            }),
            schedule_id: op.schedule_id.clone(),
            node: op.node.clone(),
            origin: op.origin.clone(),
        }
    }

    /// The view with `message` set to what the answering call says.
    pub fn saying(mut self, message: impl Into<String>) -> OpView {
        self.message = Some(message.into());
        self
    }
}

/// `GET /v1/ops`, and `GET /v1/approvals` (the ops waiting for one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OpList {
    /// The ops: newest first in `/v1/ops`, oldest first in `/v1/approvals`.
    pub operations: Vec<OpView>,
}

/// A finished run's outcomes (`POST /v1/runs/{run}/finish`): every op,
/// and the report of what was not yet delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FinishView {
    /// The run that finished.
    pub run_id: String,
    /// Every op of the run: terminal, or still awaiting approval.
    pub operations: Vec<OpView>,
    /// The report of the results not yet delivered; null when there
    /// was nothing to deliver.
    pub report: Option<crate::store::Report>,
}

/// The console's `output` event: bytes of the log up to `offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ConsoleOutput {
    /// The log offset after this chunk (also the SSE event id).
    pub offset: u64,
    /// The chunk, as UTF-8 (invalid bytes replaced).
    pub text: String,
}

/// The console's last event, `done`: how the op ended (only `status`,
/// `unknown`, when the op is gone).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ConsoleDone {
    /// The op.
    pub operation_id: String,
    /// Its terminal status, or `unknown` (`None`) when the op is gone.
    #[serde(with = "status_or_unknown", default)]
    #[schema(value_type = String, default = "unknown", example = "completed")]
    pub status: Option<Status>,
    /// Its exit code, when it has one.
    pub exit_code: Option<i32>,
    /// Ended by a kill or timeout signal.
    pub killed: bool,
    /// `uncertain` for a lost or timed-out op.
    pub effect: Option<String>,
    /// Why it was lost, failed or denied.
    pub message: Option<String>,
}

/// A console's end status on the wire: an op's status, or `unknown` when
/// the op is gone.
mod status_or_unknown {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::lifecycle::Status;

    const UNKNOWN: &str = "unknown";

    pub fn serialize<S: Serializer>(status: &Option<Status>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(status.map_or(UNKNOWN, Status::as_str))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Status>, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            UNKNOWN => Ok(None),
            other => Status::parse(other)
                .map(Some)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown status {other:?}"))),
        }
    }
}
