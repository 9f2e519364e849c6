//! Views of schedules (SPEC §15): one schedule with its derived state and
//! timing text, a list, a creation's and a deletion's answers.

use serde::{Deserialize, Serialize};

use super::rfc3339;
use crate::store::Schedule;
use crate::timing::{ScheduleState, Timing};

/// A schedule as the API shows it (`GET /v1/runs/{run}/schedules/{id}`,
/// and the answer of a pause or resume).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScheduleView {
    /// The schedule's id, a UUID.
    pub schedule_id: String,
    /// The run it belongs to and fires as.
    pub run_id: String,
    /// The argv each fire runs.
    pub command: Vec<String>,
    /// Each fired op's timeout, in seconds.
    pub timeout_sec: u64,
    /// Its 5-field cron expression (UTC), for a cron schedule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// Its period in seconds, for an `every_sec` schedule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub every_sec: Option<u64>,
    /// Its one time (RFC 3339), for a one-shot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// An overdue schedule fires once at start (else a one-shot is
    /// skipped and a recurring one advances).
    pub catch_up: bool,
    /// A one-shot that succeeded is deleted rather than disabled.
    pub delete_after_success: bool,
    /// False once it can fire no more: a finished or skipped one-shot,
    /// or a schedule of a run that is over.
    pub enabled: bool,
    /// Paused: due times pass until it is resumed.
    pub paused: bool,
    /// `waiting`, `running`, `paused` or `done` (derived:
    /// [`ScheduleState::of`]).
    pub state: ScheduleState,
    /// The timing as text: the cron expression, `every Ns` or `at <rfc3339>`.
    pub when: String,
    /// Its next due time (RFC 3339); null when none is left.
    pub next_due_at: Option<String>,
    /// The op its current due time fired, while that op lives.
    pub current_operation_id: Option<String>,
    /// The due time of the last finished fire; null before one.
    pub last_due_at: Option<String>,
    /// The last finished fire's op.
    pub last_operation_id: Option<String>,
    /// That op's terminal status, or `skipped`.
    pub last_status: Option<String>,
    /// That op's exit code, when it had one.
    pub last_exit_code: Option<i32>,
    /// That op's output tail, at most 4 KiB.
    pub last_output_tail: Option<String>,
    /// When that op finished.
    pub last_finished_at: Option<String>,
    /// When the schedule was made (RFC 3339, UTC).
    pub created_at: String,
    /// `config` for a schedule the operator's file declares (SPEC §28:
    /// the API neither edits nor deletes it), else `api`.
    pub source: String,
    /// The file that declares it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared_in: Option<String>,
}

impl ScheduleView {
    /// The view of a stored schedule, its state and timing text derived.
    pub fn of(s: &Schedule) -> ScheduleView {
        let (cron, every_sec, at) = match &s.timing {
            Timing::Cron { expr, .. } => (Some(expr.clone()), None, None),
            Timing::Every { seconds } => (None, Some(*seconds), None),
            Timing::At { at_ms } => (None, None, Some(rfc3339(*at_ms))),
        };
        ScheduleView {
            schedule_id: s.id.clone(),
            run_id: s.run_id.clone(),
            command: s.command.clone(),
            timeout_sec: s.timeout_sec,
            cron,
            every_sec,
            at,
            catch_up: s.catch_up,
            delete_after_success: s.delete_after_success,
            enabled: s.enabled,
            paused: s.paused,
            state: ScheduleState::of(s.enabled, s.paused, s.current_op_id.is_some()),
            when: s.timing.when(),
            next_due_at: s.next_due_at.map(rfc3339),
            current_operation_id: s.current_op_id.clone(),
            last_due_at: s.last_due_at.map(rfc3339),
            last_operation_id: s.last_op_id.clone(),
            last_status: s.last_status.clone(),
            last_exit_code: s.last_exit_code,
            last_output_tail: s.last_output_tail.clone(),
            last_finished_at: s.last_finished_at.map(rfc3339),
            created_at: rfc3339(s.created_at),
            source: match s.declared_in {
                Some(_) => "config".to_owned(),
                None => "api".to_owned(),
            },
            declared_in: s.declared_in.clone(),
        }
    }
}

/// `POST /v1/runs/{run}/schedules`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScheduleCreated {
    /// The new schedule's id.
    pub schedule_id: String,
    /// Its first due time (RFC 3339).
    pub next_due_at: Option<String>,
    /// The whole schedule as created.
    pub schedule: ScheduleView,
}

/// `GET /v1/runs/{run}/schedules` and `GET /v1/schedules`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScheduleList {
    /// The schedules, oldest first.
    pub schedules: Vec<ScheduleView>,
}

/// `DELETE /v1/runs/{run}/schedules/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScheduleDeleted {
    /// The schedule asked for.
    pub schedule_id: String,
    /// It was there and is gone (false: it was already deleted).
    pub deleted: bool,
    /// An op it fired, which goes on as an ordinary op of the run.
    pub running_operation_id: Option<String>,
}
