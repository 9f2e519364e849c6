//! Views of schedules (SPEC §15): one schedule with its derived state and
//! timing text, a list, a creation's and a deletion's answers.

use serde::{Deserialize, Serialize};

use super::rfc3339;
use crate::store::Schedule;
use crate::timing::{ScheduleState, Timing};

/// A schedule as the API shows it (`GET /v1/runs/{run}/schedules/{id}`,
/// and the answer of a pause or resume).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleView {
    pub schedule_id: String,
    pub run_id: String,
    pub command: Vec<String>,
    pub timeout_sec: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub every_sec: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    pub catch_up: bool,
    pub delete_after_success: bool,
    pub enabled: bool,
    pub paused: bool,
    /// `waiting`, `running`, `paused` or `done` (derived:
    /// [`ScheduleState::of`]).
    pub state: ScheduleState,
    /// The timing as text: the cron expression, `every Ns` or `at <rfc3339>`.
    pub when: String,
    pub next_due_at: Option<String>,
    /// The op its current due time fired, while that op lives.
    pub current_operation_id: Option<String>,
    pub last_due_at: Option<String>,
    pub last_operation_id: Option<String>,
    pub last_status: Option<String>,
    pub last_exit_code: Option<i32>,
    pub last_output_tail: Option<String>,
    pub last_finished_at: Option<String>,
    pub created_at: String,
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
        }
    }
}

/// `POST /v1/runs/{run}/schedules`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleCreated {
    pub schedule_id: String,
    pub next_due_at: Option<String>,
    pub schedule: ScheduleView,
}

/// `GET /v1/runs/{run}/schedules` and `GET /v1/schedules`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleList {
    pub schedules: Vec<ScheduleView>,
}

/// `DELETE /v1/runs/{run}/schedules/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleDeleted {
    pub schedule_id: String,
    pub deleted: bool,
    /// An op it fired, which goes on as an ordinary op of the run.
    pub running_operation_id: Option<String>,
}
