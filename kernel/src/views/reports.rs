//! Views of reports and notes (SPEC §5): the reports a run was served,
//! an acknowledgement, a note taken. A report itself is
//! [`crate::store::Report`] (stored and served as one body).

use serde::{Deserialize, Serialize};

pub use crate::store::Report;

/// `GET /v1/runs/{run}/reports`: the run's reports as served, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportList {
    pub run_id: String,
    pub reports: Vec<ReportSummary>,
}

/// One served report, and whether it was acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportSummary {
    pub report_id: Option<String>,
    pub created_at: String,
    /// Null until the report is acknowledged.
    pub acked_at: Option<String>,
    /// How many results it carries.
    pub resolved: usize,
    pub text: String,
}

/// `POST /v1/runs/{run}/report/{report_id}/ack`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportAck {
    pub report_id: String,
    pub acked: bool,
}

/// `POST /v1/runs/{run}/notes`: the note waits for the next report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoteAdded {
    pub run_id: String,
    pub note_id: i64,
}
