//! Reports (wait + drain + ack), notes and finishing a run.

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::Json;
use serde::Deserialize;

use super::{authorize_run, ApiError, ApiResult, AppState, Body, Params, Scope, Seg};
use crate::store::Report;
use crate::surfaces::auth::Principal;
use crate::surfaces::requests::Note;
use crate::surfaces::views::{FinishView, NoteAdded, OpView, ReportAck};

/// Longest a report call may wait.
pub const MAX_REPORT_WAIT_SEC: u64 = 3600;
use crate::report_text::MAX_NOTE_BYTES;
use crate::store::MAX_PENDING_NOTES;

/// `?wait=SEC` of a report request: seconds to wait for something to
/// deliver (absent: 0, answer at once; at most [`MAX_REPORT_WAIT_SEC`]).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    /// Seconds to wait for something to deliver (at most 3600).
    #[serde(default)]
    #[param(maximum = 3600)]
    wait: Option<u64>,
}

/// Waits (up to `wait`) until something resolved or a note arrived, then
/// drains one report; with nothing to deliver, a report with `report_id: null`.
pub async fn wait_report(k: &AppState, run: &str, wait: Duration) -> ApiResult<Report> {
    let deadline = Instant::now() + wait;
    let mut events = k.run_events(run);
    loop {
        events.borrow_and_update();
        if let Some(report) = k.store.drain_report(run).await? {
            return Ok(report);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(k.store.empty_report(run).await?);
        }
        // the safety-net period bounds a missed wake-up
        let _ = tokio::time::timeout(left.min(Duration::from_secs(5)), events.changed()).await;
    }
}

/// `GET /v1/runs/{run}/report?wait=SEC`: the run's own token (or the
/// operator) waits and drains one report. Until it is acked, asking again
/// returns the same report.
#[utoipa::path(
    get,
    path = "/v1/runs/{run}/report",
    tag = "reports",
    params(super::params::RunPath, WaitQuery),
    responses((status = 200, description = "Success", body = Report)),
)]
pub async fn report(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    Params(q): Params<WaitQuery>,
) -> ApiResult<Json<Report>> {
    authorize_run(&k, &principal, &run, Scope::Own).await?;
    let wait = q.wait.unwrap_or(0);
    if wait > MAX_REPORT_WAIT_SEC {
        return Err(ApiError::bad_request(format!(
            "wait must be at most {MAX_REPORT_WAIT_SEC} s"
        )));
    }
    Ok(Json(
        wait_report(&k, &run, Duration::from_secs(wait)).await?,
    ))
}

/// `POST /v1/runs/{run}/report/{report_id}/ack`: the caller has the
/// report, so it is not served again. Acking twice is harmless; an unknown
/// report is 404.
#[utoipa::path(
    post,
    path = "/v1/runs/{run}/report/{report_id}/ack",
    tag = "reports",
    params(super::params::RunPath, ("report_id" = String, Path, description = "The report to acknowledge (a UUID)", pattern = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")),
    responses((status = 200, description = "Success", body = ReportAck)),
)]
pub async fn ack(
    State(k): State<AppState>,
    principal: Principal,
    Seg((run, report_id)): Seg<(String, String)>,
) -> ApiResult<Json<ReportAck>> {
    authorize_run(&k, &principal, &run, Scope::Own).await?;
    if uuid::Uuid::parse_str(&report_id).is_err() {
        return Err(ApiError::bad_request("report id must be a uuid"));
    }
    if !k.store.ack_report(&run, &report_id).await? {
        return Err(ApiError::not_found(format!(
            "no report {report_id} in run {run}"
        )));
    }
    k.bump_run(&run);
    Ok(Json(ReportAck {
        report_id,
        acked: true,
    }))
}

/// `POST /v1/runs/{run}/notes`: stores a note for the next report and
/// wakes a waiting report call at once. 429 while the run already holds
/// [`MAX_PENDING_NOTES`] undelivered notes.
#[utoipa::path(
    post,
    path = "/v1/runs/{run}/notes",
    tag = "reports",
    params(super::params::RunPath),
    request_body = Note,
    responses((status = 200, description = "Success", body = NoteAdded)),
)]
pub async fn note(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    via: super::origin::Via,
    Body(note): Body<Note>,
) -> ApiResult<Json<NoteAdded>> {
    authorize_run(&k, &principal, &run, Scope::Own).await?;
    if note.text.trim().is_empty() || note.text.len() > MAX_NOTE_BYTES || note.text.contains('\0') {
        return Err(ApiError::bad_request(format!(
            "note text must be non-empty, without NUL bytes and at most {MAX_NOTE_BYTES} bytes"
        )));
    }
    let Some(id) = k
        .store
        .add_note_from(&run, &note.text, Some(&via.origin(&principal)))
        .await?
    else {
        return Err(ApiError::too_many(format!(
            "run {run} already holds {MAX_PENDING_NOTES} undelivered notes; they reach the agent with its next report"
        )));
    };
    k.bump_run(&run);
    Ok(Json(NoteAdded {
        run_id: run,
        note_id: id,
    }))
}

/// Waits until every op of the run is terminal, marks the run finished and
/// returns every outcome plus the report of what was not yet delivered.
#[utoipa::path(
    post,
    path = "/v1/runs/{run}/finish",
    tag = "reports",
    params(super::params::RunPath),
    responses((status = 200, description = "Success", body = FinishView)),
)]
pub async fn finish(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
) -> ApiResult<Json<FinishView>> {
    authorize_run(&k, &principal, &run, Scope::Own).await?;
    let mut events = k.run_events(&run);
    let ops = loop {
        events.borrow_and_update();
        let ops = k.store.run_ops(&run).await?;
        // an op held for approval waits for a person, not for the run:
        // finish returns it as it is (awaiting_approval)
        if ops.iter().all(|op| !op.status.is_observed()) {
            break ops;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), events.changed()).await;
    };
    k.store.mark_run_finished(&run).await?;
    let report = k.store.drain_report(&run).await?;
    Ok(Json(FinishView {
        run_id: run,
        operations: ops.iter().map(OpView::of).collect(),
        report,
    }))
}
