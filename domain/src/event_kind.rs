//! The events of a run's trace (SPEC §14), pure (serde only): one closed
//! [`EventKind`] per kind the kernel writes, each with its typed payload.
//! The journal stores `kind` as its wire string and the payload as JSON
//! `data`; the API sends `{seq, at, kind, operation_id, data}`. A kind
//! cannot be misspelled: writers name a variant, and the strings live in
//! the serde attributes below (and in [`EventKind::name`], kept equal by
//! a test).

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::runs::{Budget, Envelope, OnTimeout};

/// One event of a run's trace, as the journal holds it and the API sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Event {
    /// The run's journal sequence number (the events cursor).
    pub seq: i64,
    /// When it was recorded (unix ms).
    pub at: i64,
    /// The op it concerns, when any.
    pub operation_id: Option<String>,
    /// `kind` and `data` on the wire.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// Every kind of event, with its payload (`data` on the wire).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", content = "data")]
pub enum EventKind {
    /// `tool.started`: An op was admitted.
    #[serde(rename = "tool.started")]
    ToolStarted(ToolStarted),
    /// `tool.completed`: An op ended with a code.
    #[serde(rename = "tool.completed")]
    ToolCompleted(ToolCompleted),
    /// `tool.failed`: An op ended any other way.
    #[serde(rename = "tool.failed")]
    ToolFailed(ToolFailed),
    /// `tool.late_result`: A real exit code found for an op already
    /// settled `lost` (its node came back): recorded, the op unchanged.
    #[serde(rename = "tool.late_result")]
    ToolLateResult(ToolLateResult),
    /// `tool.stdin`: Bytes were written to an op's stdin (SPEC §25).
    #[serde(rename = "tool.stdin")]
    ToolStdin(ToolStdin),
    /// `tool.nudged`: A nudge was written to an op's stdin (seed 002).
    #[serde(rename = "tool.nudged")]
    ToolNudged(ToolNudged),
    /// `tool.signalled`: One signal was sent to an op's process group.
    #[serde(rename = "tool.signalled")]
    ToolSignalled(ToolSignalled),
    /// `note.received`: A note arrived for the next report.
    #[serde(rename = "note.received")]
    NoteReceived(NoteReceived),
    /// `report.delivered`: A report was drained.
    #[serde(rename = "report.delivered")]
    ReportDelivered(ReportDelivered),
    /// `run.paused`: The run was paused.
    #[serde(rename = "run.paused")]
    RunPaused(RunChanged),
    /// `run.resumed`: The run was resumed.
    #[serde(rename = "run.resumed")]
    RunResumed(RunChanged),
    /// `run.completed`: The run was completed (explicitly, with a summary).
    #[serde(rename = "run.completed")]
    RunCompleted(RunChanged),
    /// `run.cancelled`: The run was cancelled.
    #[serde(rename = "run.cancelled")]
    RunCancelled(RunChanged),
    /// `run.child_created`: A child run was created.
    #[serde(rename = "run.child_created")]
    RunChildCreated(ChildCreated),
    /// `usage.recorded`: The agent runtime reported model usage.
    #[serde(rename = "usage.recorded")]
    UsageRecorded(ModelUsage),
    /// `approval.requested`: An op waits for an operator.
    #[serde(rename = "approval.requested")]
    ApprovalRequested(ApprovalRequested),
    /// `approval.granted`: A waiting op was approved.
    #[serde(rename = "approval.granted")]
    ApprovalGranted(ApprovalGranted),
    /// `approval.denied`: A waiting op was denied.
    #[serde(rename = "approval.denied")]
    ApprovalDenied(ApprovalDenied),
    /// `approval.escalated`: A waiting op timed out and escalated.
    #[serde(rename = "approval.escalated")]
    ApprovalEscalated(ApprovalEscalated),
    /// `schedule.fired`: A schedule fired a due time.
    #[serde(rename = "schedule.fired")]
    ScheduleFired(ScheduleFired),
    /// `schedule.skipped`: A schedule skipped a due time.
    #[serde(rename = "schedule.skipped")]
    ScheduleSkipped(ScheduleSkipped),
    /// `file.written`: A file or an archive was written into the run's
    /// workspace through the files API.
    #[serde(rename = "file.written")]
    FileWritten(FileWritten),
    /// `run.forked`: The run started from a copy of another run's
    /// workspace (or a snapshot of it).
    #[serde(rename = "run.forked")]
    RunForked(RunForked),
    /// `snapshot.made`: A named copy of the run's workspace was kept.
    #[serde(rename = "snapshot.made")]
    SnapshotMade(SnapshotMade),
    /// `net.denied`: The egress proxy refused a connection of the run (at
    /// most once a minute per host).
    #[serde(rename = "net.denied")]
    NetDenied(NetDenied),
    /// `net.policy`: The run's network allow list was changed.
    #[serde(rename = "net.policy")]
    NetPolicy(NetPolicy),
}

impl EventKind {
    /// The kind's wire string (the journal's `kind` column).
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::ToolStarted(_) => "tool.started",
            EventKind::ToolCompleted(_) => "tool.completed",
            EventKind::ToolFailed(_) => "tool.failed",
            EventKind::ToolLateResult(_) => "tool.late_result",
            EventKind::ToolStdin(_) => "tool.stdin",
            EventKind::ToolNudged(_) => "tool.nudged",
            EventKind::ToolSignalled(_) => "tool.signalled",
            EventKind::NoteReceived(_) => "note.received",
            EventKind::ReportDelivered(_) => "report.delivered",
            EventKind::RunPaused(_) => "run.paused",
            EventKind::RunResumed(_) => "run.resumed",
            EventKind::RunCompleted(_) => "run.completed",
            EventKind::RunCancelled(_) => "run.cancelled",
            EventKind::RunChildCreated(_) => "run.child_created",
            EventKind::UsageRecorded(_) => "usage.recorded",
            EventKind::ApprovalRequested(_) => "approval.requested",
            EventKind::ApprovalGranted(_) => "approval.granted",
            EventKind::ApprovalDenied(_) => "approval.denied",
            EventKind::ApprovalEscalated(_) => "approval.escalated",
            EventKind::ScheduleFired(_) => "schedule.fired",
            EventKind::ScheduleSkipped(_) => "schedule.skipped",
            EventKind::FileWritten(_) => "file.written",
            EventKind::RunForked(_) => "run.forked",
            EventKind::SnapshotMade(_) => "snapshot.made",
            EventKind::NetDenied(_) => "net.denied",
            EventKind::NetPolicy(_) => "net.policy",
        }
    }

    /// The payload as JSON (the journal's `data` column).
    pub fn data(&self) -> serde_json::Result<Value> {
        match serde_json::to_value(self)? {
            Value::Object(mut tagged) => Ok(tagged.remove("data").unwrap_or(Value::Null)),
            other => Ok(other),
        }
    }

    /// An event read back from its `kind` string and `data`.
    pub fn from_parts(kind: &str, data: Value) -> serde_json::Result<EventKind> {
        let mut tagged = Map::new();
        tagged.insert("kind".to_owned(), Value::String(kind.to_owned()));
        tagged.insert("data".to_owned(), data);
        serde_json::from_value(Value::Object(tagged))
    }

    /// Whether the kind is posted to the operator's webhook (SPEC §23): an
    /// approval asked or escalated, an op's resolution, a run's state change.
    pub fn notifies(&self) -> bool {
        matches!(
            self,
            EventKind::ApprovalRequested(_)
                | EventKind::ApprovalEscalated(_)
                | EventKind::ToolCompleted(_)
                | EventKind::ToolFailed(_)
                | EventKind::RunPaused(_)
                | EventKind::RunResumed(_)
                | EventKind::RunCompleted(_)
                | EventKind::RunCancelled(_)
        )
    }

    /// The resolution of an op: `tool.completed` or `tool.failed`, with
    /// whether the op ran in the background.
    pub fn resolution_background(&self) -> Option<bool> {
        match self {
            EventKind::ToolCompleted(p) => Some(p.background),
            EventKind::ToolFailed(p) => Some(p.background),
            _ => None,
        }
    }
}

/// `tool.started`: an op was admitted (also one held for approval).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ToolStarted {
    /// The argv, bounded as views show it.
    pub command: Vec<String>,
    /// Whether the op ran in the background (its result goes to a report).
    pub background: bool,
    /// Its timeout, seconds.
    pub timeout_sec: u64,
    /// The schedule that fired it (null for a direct start).
    pub schedule_id: Option<String>,
    /// Where it came from (SPEC §28); absent in events of ops admitted
    /// before origins were recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<crate::origin::Origin>,
}

/// `tool.completed`: the command ended with a code (killed or not).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ToolCompleted {
    /// Whether the op ran in the background (its result goes to a report).
    pub background: bool,
    /// The exit code, when the command recorded one.
    pub exit_code: Option<i32>,
    /// Whether a kill (by request, timeout or cancel) ended it.
    pub killed: bool,
    /// Wall seconds from its start to its end.
    pub op_seconds: Option<f64>,
    /// CPU seconds of its process tree, when the shim measured them.
    pub cpu_seconds: Option<f64>,
}

/// `tool.stdin`: bytes written to an op's stdin; how many, never what.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ToolStdin {
    /// Bytes written.
    pub bytes: u64,
    /// The write closed stdin (EOF).
    pub eof: bool,
}

/// `tool.nudged`: a nudge (its text and a newline) written to an op's
/// stdin; its length, never its content.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ToolNudged {
    /// Bytes written (the newline included).
    pub bytes: u64,
}

/// `file.written`: the files API wrote a file, or unpacked an archive,
/// in the run's workspace (SPEC §26).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct FileWritten {
    /// The container path written (an archive's directory).
    pub path: String,
    /// Bytes written (an archive's file contents together).
    pub bytes: u64,
}

/// `net.denied`: a connection the run's allow list does not allow
/// (SPEC §27).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct NetDenied {
    /// The host the request named.
    pub host: String,
    /// Its port.
    pub port: u16,
}

/// `net.policy`: the run's allow list as it now is (SPEC §27).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct NetPolicy {
    /// The entries now allowed.
    pub allow: Vec<String>,
    /// Who changed it: `operator` or `run:<id>`.
    pub by: String,
    /// The run whose change this is (itself, or the ancestor that
    /// narrowed its descendants).
    pub from_run: String,
}

/// `run.forked`: the run's workspace started as a copy of another's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct RunForked {
    /// `RUN` or `RUN@SNAPSHOT`: what was copied.
    pub from: String,
    /// Bytes copied.
    pub bytes: u64,
    /// Whether the source's container was frozen during the copy.
    pub consistent: bool,
}

/// `snapshot.made`: a named copy of the run's workspace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct SnapshotMade {
    /// Its name.
    pub name: String,
    /// Bytes it holds.
    pub bytes: u64,
}

/// `tool.signalled`: one signal sent to an op's foreground process group
/// (`kill_operation` with a `signal`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ToolSignalled {
    /// Its name: `INT`, `TERM`, `KILL`, `HUP`, `QUIT`, `USR1` or `USR2`.
    pub signal: String,
    /// Processes it reached.
    pub processes: u32,
}

/// `tool.late_result`: the real end of an op settled `lost` before it was
/// known (its node's lease lapsed; the node came back and found the code).
/// Terminal stays terminal: the op and its delivered result do not change.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ToolLateResult {
    /// The exit code the command recorded.
    pub exit_code: i32,
    /// When it ended, unix milliseconds (its code record's time).
    pub ended_at: i64,
    /// The node that found it.
    pub node: String,
    /// The node stopped it (TERM, grace, KILL) when it found, on its
    /// return, that it had been declared dead (SPEC §24): nothing a settled
    /// op started outlives its node's return.
    pub stopped_on_rejoin: bool,
}

/// `tool.failed`: every other end (lost, failed, timed out, denied).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ToolFailed {
    /// Whether the op ran in the background (its result goes to a report).
    pub background: bool,
    /// The terminal status (`lost`, `failed`, `timed_out`, `denied`).
    pub status: String,
    /// `uncertain` when the command may or may not have done its work.
    pub effect: Option<String>,
    /// The exit code, when the command recorded one.
    pub exit_code: Option<i32>,
    /// Whether a kill (by request, timeout or cancel) ended it.
    pub killed: bool,
    /// What went wrong, in words.
    pub error: Option<String>,
    /// Wall seconds from its start to its end.
    pub op_seconds: Option<f64>,
}

/// `note.received`: a note waits for the run's next report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct NoteReceived {
    /// The note's id in the run's notes.
    pub note_id: i64,
    /// The note's size (its text is in the report).
    pub bytes: usize,
}

/// `report.delivered`: a report was drained (its ops and notes marked).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ReportDelivered {
    /// The report's id (what an ack names).
    pub report_id: String,
    /// The ops whose results it carries.
    pub operation_ids: Vec<String>,
    /// How many notes it carries.
    pub notes: usize,
}

/// `run.paused|resumed|completed|cancelled`: a run's state changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct RunChanged {
    /// Who changed it: `operator` or `run:<id>`.
    pub by: String,
    /// A completion's summary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// A descendant cancelled with this run (the run the cancel named).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled_with: Option<String>,
    /// A pause taken over from a lower pauser: the pauser it replaced
    /// (present, and null when none was recorded).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub over: Option<Option<String>>,
}

impl RunChanged {
    /// A change by `by` with nothing more to say.
    pub fn by(by: &str) -> RunChanged {
        RunChanged {
            by: by.to_owned(),
            ..RunChanged::default()
        }
    }
}

/// A field that is present (even as null) deserializes as `Some`.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// `run.child_created` (in the parent's trace).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ChildCreated {
    /// The child's run id (`<parent>.<name>`).
    pub child_run_id: String,
    /// The child's envelope (null: the kernel's default).
    pub envelope: Option<Envelope>,
    /// The child's own budget limits (any subset).
    pub budget: Budget,
}

/// Model usage reported by the agent runtime (`usage.recorded`; also the
/// ledger fact, whose request digest is its JSON in this field order).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ModelUsage {
    /// The model's name, as the agent runtime gives it.
    pub model: String,
    /// Input (prompt) tokens.
    pub input_tokens: u64,
    /// Output (completion) tokens.
    pub output_tokens: u64,
    /// What the call cost, in millionths of the currency unit.
    pub cost_micros: u64,
}

/// `approval.requested`: an approval rule holds the op.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApprovalRequested {
    /// The pattern that matched (`*` for a run whose rules hold every op).
    pub rule: String,
    /// Its timeout, seconds.
    #[serde(default)]
    pub timeout_sec: Option<u64>,
    /// What an unanswered wait turns into: `escalate` or `deny`.
    pub on_timeout: OnTimeout,
}

/// `approval.granted`: the operator approved; the op starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ApprovalGranted {
    /// Who approved (`operator`: nothing approves by itself).
    pub by: String,
    /// Whole seconds it waited for the approval.
    pub waited_sec: i64,
}

/// `approval.denied`: the op ends `denied`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ApprovalDenied {
    /// Why, in words.
    pub reason: String,
    /// `operator`, `timeout` or `kill`.
    pub by: String,
}

/// `approval.escalated`: the approval's timeout passed; the op keeps
/// waiting.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ApprovalEscalated {
    /// Whole seconds it waited.
    pub waited_sec: i64,
    /// Whether the op still waits (an escalation never decides).
    pub still_waiting: bool,
}

/// `schedule.fired`: a due time's op was admitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ScheduleFired {
    /// The schedule's id.
    pub schedule_id: String,
    /// The due time it fired for (RFC 3339).
    pub due_at: String,
    /// Slots that passed without a run before this one.
    pub missed_slots: u64,
}

/// `schedule.skipped`: a due time did not run, or the schedule ended, or
/// a one-shot waits to be tried again; the optional fields say which.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct ScheduleSkipped {
    /// The schedule's id.
    pub schedule_id: String,
    /// Why, in words.
    pub reason: String,
    /// The due time skipped (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due_at: Option<String>,
    /// How many slots were skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slots: Option<u64>,
    /// The schedule was disabled (its run is over).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// A one-shot refused for a passing reason is tried again after this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_in_sec: Option<i64>,
}

impl ScheduleSkipped {
    /// Due times skipped (`slots` of them, from `due_at`).
    pub fn slots(schedule_id: &str, reason: &str, due_at: String, slots: u64) -> Self {
        ScheduleSkipped {
            schedule_id: schedule_id.to_owned(),
            reason: reason.to_owned(),
            due_at: Some(due_at),
            slots: Some(slots),
            ..ScheduleSkipped::default()
        }
    }

    /// The schedule ended: disabled, for `reason`.
    pub fn ended(schedule_id: &str, reason: &str) -> Self {
        ScheduleSkipped {
            schedule_id: schedule_id.to_owned(),
            reason: reason.to_owned(),
            disabled: Some(true),
            ..ScheduleSkipped::default()
        }
    }

    /// A one-shot postponed for `reason`, tried again in `retry_in_sec`.
    pub fn postponed(schedule_id: &str, reason: &str, retry_in_sec: i64) -> Self {
        ScheduleSkipped {
            schedule_id: schedule_id.to_owned(),
            reason: reason.to_owned(),
            retry_in_sec: Some(retry_in_sec),
            ..ScheduleSkipped::default()
        }
    }
}

#[cfg(test)]
#[path = "event_kind_tests.rs"]
mod tests;
