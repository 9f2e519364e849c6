//! Views of reports and notes (SPEC §5): the reports a run was served,
//! an acknowledgement, a note taken. A report itself is
//! [`crate::store::Report`] (stored and served as one body).

use serde::{Deserialize, Serialize};

pub use crate::store::Report;

/// `GET /v1/runs/{run}/reports`: the run's reports as served, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReportList {
    /// The run whose reports these are.
    pub run_id: String,
    /// Its most recent reports, newest first.
    pub reports: Vec<ReportSummary>,
}

/// One served report, and whether it was acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReportSummary {
    /// The report's id (always set for a served report).
    pub report_id: Option<String>,
    /// When it was drained (RFC 3339, UTC).
    pub created_at: String,
    /// Null until the report is acknowledged.
    pub acked_at: Option<String>,
    /// How many results it carries.
    pub resolved: usize,
    /// The `[Background operations report]` text the agent read.
    pub text: String,
}

/// `POST /v1/runs/{run}/report/{report_id}/ack`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReportAck {
    /// The report acknowledged.
    pub report_id: String,
    /// Always true: the report will not be served again.
    pub acked: bool,
}

/// `POST /v1/runs/{run}/notes`: the note waits for the next report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NoteAdded {
    /// The run the note is for.
    pub run_id: String,
    /// The note's id in the control plane.
    pub note_id: i64,
}
