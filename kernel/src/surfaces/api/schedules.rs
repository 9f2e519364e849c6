//! Schedules (SPEC §15): made by a run (its own), listed, paused, resumed
//! and deleted by it or an ancestor. A schedule fires as its run.

use axum::extract::State;
use axum::Json;

use super::{authorize_run, ApiError, ApiResult, AppState, Body, Scope, Seg};
use crate::store::{NewSchedule, Schedule};
use crate::surfaces::auth::Principal;
use crate::surfaces::requests::CreateSchedule;
use crate::surfaces::views::{ScheduleCreated, ScheduleDeleted, ScheduleList, ScheduleView};
use crate::timing::Timing;

/// `POST /v1/runs/{run}/schedules`: the run's own token (or the operator).
#[utoipa::path(
    post,
    operation_id = "create_schedule",
    path = "/v1/runs/{run}/schedules",
    tag = "schedules",
    params(super::params::RunPath),
    request_body = CreateSchedule,
    responses((status = 200, description = "Success", body = ScheduleCreated)),
)]
pub async fn create(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    via: super::origin::Via,
    Body(req): Body<CreateSchedule>,
) -> ApiResult<Json<ScheduleCreated>> {
    authorize_run(&k, &principal, &run, Scope::Own).await?;
    sandbox::shim::validate_command(&req.command)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let timing = Timing::from_request(req.cron.as_deref(), req.every_sec, req.at.as_deref())
        .map_err(ApiError::bad_request)?;
    if timing.first_due(crate::store::now_ms()).is_none() {
        return Err(ApiError::bad_request(
            "this cron expression never matches a future time",
        ));
    }
    if req.delete_after_success && timing.is_recurring() {
        return Err(ApiError::bad_request(
            "delete_after_success is for one-shots (at); a recurring schedule is deleted with DELETE",
        ));
    }
    let meta = super::ops::run_meta_for(&k, &principal, &run, &via.origin(&principal)).await?;
    // a run that is over admits nothing, so it gets no schedule either (a
    // paused run may: its schedule skips until it is resumed)
    if let Some(record) = k.store.get_run(&run).await? {
        if record.state.is_final() {
            return Err(ApiError::run_state(
                record.state,
                format!(
                    "run {run} is {}: it takes no schedules",
                    record.state.as_str()
                ),
            ));
        }
    }
    // a scheduled op is a background op: the same limits, the run's envelope
    let ceiling = meta.envelope.max_timeout_sec.unwrap_or(u64::MAX);
    let max = k.config.ops.bg_max_sec;
    let timeout = req
        .timeout_sec
        .unwrap_or(k.config.ops.bg_default_sec.min(max).min(ceiling));
    if timeout == 0 || timeout > max {
        return Err(ApiError::bad_request(format!(
            "timeout_sec must be between 1 and {max} (limit set by OPKERNEL_BG_MAX_TIMEOUT), got {timeout}"
        )));
    }
    if timeout > ceiling {
        return Err(ApiError::envelope_exceeded(format!(
            "timeout_sec {timeout} is over this run's envelope (max_timeout_sec {ceiling})"
        )));
    }
    let created = k
        .store
        .create_schedule(NewSchedule {
            run_id: run,
            command: req.command,
            timeout_sec: timeout,
            timing,
            catch_up: req.catch_up,
            delete_after_success: req.delete_after_success,
        })
        .await?
        .map_err(ApiError::too_many)?;
    let view = ScheduleView::of(&created);
    Ok(Json(ScheduleCreated {
        schedule_id: view.schedule_id.clone(),
        next_due_at: view.next_due_at.clone(),
        schedule: view,
    }))
}

/// `GET /v1/runs/{run}/schedules`: the run's and its descendants'.
#[utoipa::path(
    get,
    operation_id = "list_run_schedules",
    path = "/v1/runs/{run}/schedules",
    tag = "schedules",
    params(super::params::RunPath),
    responses((status = 200, description = "Success", body = ScheduleList)),
)]
pub async fn list(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
) -> ApiResult<Json<ScheduleList>> {
    authorize_run(&k, &principal, &run, Scope::Subtree).await?;
    let list = k.store.list_schedules(Some(run)).await?;
    Ok(Json(schedule_list(&list)))
}

fn schedule_list(list: &[Schedule]) -> ScheduleList {
    ScheduleList {
        schedules: list.iter().map(ScheduleView::of).collect(),
    }
}

/// `GET /v1/schedules`: every schedule the token reaches.
#[utoipa::path(
    get,
    operation_id = "list_schedules",
    path = "/v1/schedules",
    tag = "schedules",
    responses((status = 200, description = "Success", body = ScheduleList)),
)]
pub async fn list_all(
    State(k): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<ScheduleList>> {
    let root = match &principal {
        Principal::Operator => None,
        Principal::Run(own) => Some(own.clone()),
    };
    let list = k.store.list_schedules(root).await?;
    Ok(Json(schedule_list(&list)))
}

/// A schedule of `run` (or a descendant's, through its own path) the
/// caller may act on.
async fn load(k: &AppState, principal: &Principal, run: &str, id: &str) -> ApiResult<Schedule> {
    authorize_run(k, principal, run, Scope::Subtree).await?;
    if uuid::Uuid::parse_str(id).is_err() {
        return Err(ApiError::bad_request("schedule id must be a uuid"));
    }
    match k.store.get_schedule(id).await? {
        Some(s) if s.run_id == run => Ok(s),
        _ => Err(ApiError::not_found(format!(
            "no schedule {id} in run {run}"
        ))),
    }
}

/// `GET /v1/runs/{run}/schedules/{id}`: one schedule of the run or a
/// descendant.
#[utoipa::path(
    get,
    operation_id = "get_schedule",
    path = "/v1/runs/{run}/schedules/{id}",
    tag = "schedules",
    params(super::params::RunPath, super::params::SchedulePath),
    responses((status = 200, description = "Success", body = ScheduleView)),
)]
pub async fn get_one(
    State(k): State<AppState>,
    principal: Principal,
    Seg((run, id)): Seg<(String, String)>,
) -> ApiResult<Json<ScheduleView>> {
    let s = load(&k, &principal, &run, &id).await?;
    Ok(Json(ScheduleView::of(&s)))
}

/// `DELETE /v1/runs/{run}/schedules/{id}`: an op it already fired goes
/// on as an ordinary op of the run and is named in the answer.
#[utoipa::path(
    delete,
    operation_id = "delete_schedule",
    path = "/v1/runs/{run}/schedules/{id}",
    tag = "schedules",
    params(super::params::RunPath, super::params::SchedulePath),
    responses((status = 200, description = "Success", body = ScheduleDeleted)),
)]
pub async fn delete(
    State(k): State<AppState>,
    principal: Principal,
    Seg((run, id)): Seg<(String, String)>,
) -> ApiResult<Json<ScheduleDeleted>> {
    let s = load(&k, &principal, &run, &id).await?;
    if let Some(file) = &s.declared_in {
        return Err(ApiError::conflict(format!(
            "schedule {} is declared in {file}: change that file (the kernel reconciles it at \
             its next start)",
            s.id
        )));
    }
    let deleted = k.store.delete_schedule(&s.id).await?;
    Ok(Json(ScheduleDeleted {
        schedule_id: s.id,
        deleted,
        // an op it fired goes on as an ordinary op of the run
        running_operation_id: s.current_op_id,
    }))
}

async fn set_paused(
    k: AppState,
    principal: Principal,
    run: String,
    id: String,
    paused: bool,
) -> ApiResult<Json<ScheduleView>> {
    let s = load(&k, &principal, &run, &id).await?;
    // the operator's file declares it: only the operator pauses it
    if let (Some(file), Principal::Run(_)) = (&s.declared_in, &principal) {
        return Err(ApiError::forbidden(format!(
            "schedule {} is declared in {file}: only the operator pauses or resumes it",
            s.id
        )));
    }
    let s = k
        .store
        .pause_schedule(&s.id, paused)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no schedule {id} in run {run}")))?;
    Ok(Json(ScheduleView::of(&s)))
}

/// `POST /v1/runs/{run}/schedules/{id}/pause`: the schedule stops firing
/// until resumed.
#[utoipa::path(
    post,
    operation_id = "pause_schedule",
    path = "/v1/runs/{run}/schedules/{id}/pause",
    tag = "schedules",
    params(super::params::RunPath, super::params::SchedulePath),
    responses((status = 200, description = "Success", body = ScheduleView)),
)]
pub async fn pause(
    State(k): State<AppState>,
    principal: Principal,
    Seg((run, id)): Seg<(String, String)>,
) -> ApiResult<Json<ScheduleView>> {
    set_paused(k, principal, run, id, true).await
}

/// `POST /v1/runs/{run}/schedules/{id}/resume`: a recurring schedule whose
/// due time passed meanwhile goes on from its next future slot.
#[utoipa::path(
    post,
    operation_id = "resume_schedule",
    path = "/v1/runs/{run}/schedules/{id}/resume",
    tag = "schedules",
    params(super::params::RunPath, super::params::SchedulePath),
    responses((status = 200, description = "Success", body = ScheduleView)),
)]
pub async fn resume(
    State(k): State<AppState>,
    principal: Principal,
    Seg((run, id)): Seg<(String, String)>,
) -> ApiResult<Json<ScheduleView>> {
    set_paused(k, principal, run, id, false).await
}
