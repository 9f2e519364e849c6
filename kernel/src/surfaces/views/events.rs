//! Views of a run's trace (SPEC §14): a page of events. The events
//! themselves and their kinds are [`crate::event_kind`]'s.

use serde::{Deserialize, Serialize};

pub use crate::event_kind::{Event, EventKind};

/// `GET /v1/runs/{run}/events`: events after a cursor (or the last few).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EventsPage {
    /// The run whose trace this is.
    pub run_id: String,
    /// Oldest first.
    pub events: Vec<Event>,
    /// The cursor to ask `after` next (the last event's `seq`, or the
    /// asked cursor when there was none).
    pub next_after: i64,
    /// The run's latest `seq` now: where a reader that wants only what
    /// comes next starts.
    pub last_seq: i64,
}
