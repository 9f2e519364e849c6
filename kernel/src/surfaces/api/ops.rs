//! Starting, killing and inspecting operations; registering runs.

use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;

use super::{
    authorize_run, require_operator, visible_op, ApiError, ApiResult, AppState, Body, Params,
    Scope, Seg,
};
use crate::lifecycle::{KillReason, Status};
use crate::store::{NewOp, Op, StartRequest, BY_KILL, BY_OPERATOR};
use crate::surfaces::auth::Principal;
use crate::surfaces::requests::{Deny, KillOperation, RunCommand};
use crate::surfaces::views::{OpList, OpView};

/// The reply of a start held for approval.
pub fn awaiting_message(id: &str) -> String {
    format!(
        "Awaiting operator approval as operation {id}. Nothing runs until an operator approves it; it may \
         also be denied. Do not wait idle: continue with other work, and the outcome (the result, or the \
         denial with its reason) will arrive automatically as a follow-up message. Use kill_operation to \
         withdraw it."
    )
}

/// The exact reply of a background start.
pub fn started_message(id: &str, timeout_sec: u64) -> String {
    format!(
        "Started in background as operation {id}. Do not wait idle: continue with other work, and the result \
         (exit code + output tail) will arrive automatically as a follow-up message. The operation times out \
         after {timeout_sec} s. Use kill_operation to cancel it."
    )
}

/// The command's timeout: the one asked for, or the default (never above
/// the kernel's ceiling nor the run's envelope). A timeout above the
/// kernel's ceiling is bad input; one above the envelope is refused.
fn validate(k: &AppState, req: &RunCommand, envelope: &crate::runs::Envelope) -> ApiResult<u64> {
    sandbox::shim::validate_command(&req.command)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let (default, max, var) = if req.background {
        (
            k.config.ops.bg_default_sec,
            k.config.ops.bg_max_sec,
            "OPKERNEL_BG_MAX_TIMEOUT",
        )
    } else {
        (
            k.config.ops.fg_default_sec,
            k.config.ops.fg_max_sec,
            "OPKERNEL_FG_MAX_TIMEOUT",
        )
    };
    let ceiling = envelope.max_timeout_sec.unwrap_or(u64::MAX);
    let timeout = req.timeout_sec.unwrap_or(default.min(max).min(ceiling));
    if timeout == 0 || timeout > max {
        let kind = if req.background {
            "background"
        } else {
            "foreground"
        };
        return Err(ApiError::bad_request(format!(
            "timeout_sec must be between 1 and {max} for a {kind} command (limit set by {var}), got {timeout}"
        )));
    }
    if timeout > ceiling {
        return Err(ApiError::envelope_exceeded(format!(
            "timeout_sec {timeout} is over this run's envelope (max_timeout_sec {ceiling})"
        )));
    }
    Ok(timeout)
}

#[utoipa::path(
    post,
    path = "/v1/runs/{run}/tools/run_command",
    tag = "operations",
    params(super::params::RunPath, ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried start return the first op (1 to 128 printable ASCII characters)", pattern = r"^[!-~]{1,128}$")),
    request_body = RunCommand,
    responses((status = 200, description = "Success", body = OpView)),
)]
pub async fn run_command(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    headers: HeaderMap,
    via: super::origin::Via,
    Body(req): Body<RunCommand>,
) -> ApiResult<Json<OpView>> {
    authorize_run(&k, &principal, &run, Scope::Own).await?;
    let origin = via.origin(&principal);
    let meta = run_meta_for(&k, &principal, &run, &origin).await?;
    let timeout = validate(&k, &req, &meta.envelope)?;
    let (io, yield_after) = super::interactive::interactive_of(&req)?;
    let key = super::params::idempotency_key(&headers)?;
    // a command an approval rule holds waits for an operator: its result
    // comes in a report, as a background op's does (a caller cannot be
    // kept waiting for a human)
    let approval = k.approval_hold(&meta, &req.command);
    let start = StartRequest {
        scratch_key: sandbox::profile::scratch_key(&run),
        run_id: run,
        command: req.command,
        background: req.background || approval.is_some(),
        timeout_sec: timeout,
        io,
        idempotency_key: key,
        approval,
        schedule_id: None,
        origin,
    };
    let limits = crate::store::Admission {
        implicit_run: principal == Principal::Operator,
        ..k.config.admission()
    };
    start_and_answer(&k, start, limits, yield_after).await
}

/// The run's facts for a start: the operator's run is created when it is
/// not recorded yet; a run token's run must exist (it may have been
/// purged since the token was checked).
pub async fn run_meta_for(
    k: &AppState,
    principal: &Principal,
    run: &str,
    origin: &crate::origin::Origin,
) -> ApiResult<std::sync::Arc<crate::runtime::kernel::RunMeta>> {
    match principal {
        Principal::Operator => Ok(k.run_meta_or_create(run, Some(origin)).await?),
        Principal::Run(_) => k.run_meta(run).await?.ok_or_else(|| {
            ApiError::not_found(format!(
                "run {run} does not exist (a finished run tree is purged after OPKERNEL_RETENTION)"
            ))
        }),
    }
}

/// Inserts the op durably, hands it to its observer and answers: at once
/// for a background op, at its end for a foreground one.
async fn start_and_answer(
    k: &AppState,
    start: StartRequest,
    limits: crate::store::Admission,
    yield_after: Option<Duration>,
) -> ApiResult<Json<OpView>> {
    let background = start.background;
    // the limits, the run's state and its budgets are checked in the
    // insert's transaction: an idempotent retry finds its op first, and
    // concurrent starts (or a start and a cancel) cannot pass together
    let op = match crate::runtime::control::start_op(k, start, limits).await? {
        NewOp::Created(op) | NewOp::Existing(op) => op,
        NewOp::KeyConflict(id) => {
            return Err(ApiError::conflict(format!(
                "Idempotency-Key was already used for operation {id} with a different request"
            )))
        }
        NewOp::Refused(why) => return Err(ApiError::refused(&why)),
    };
    // a waiting op has no observer until it is approved
    if op.status == Status::AwaitingApproval {
        return Ok(Json(OpView::of(&op).saying(awaiting_message(&op.id))));
    }
    if background {
        return Ok(Json(
            OpView::of(&op).saying(started_message(&op.id, op.timeout_sec)),
        ));
    }
    // a retried foreground call whose op already yielded: it is a
    // background op now, its result the report's (never also inline)
    if op.background {
        let after = yield_after.unwrap_or_default();
        return Ok(Json(super::interactive::yielded(k, op, after).await));
    }
    match yield_after {
        None => Ok(Json(wait_foreground(k, &op, None).await?)),
        // the wait and its flip go on if the caller leaves: a yield never
        // leaves its op a foreground one nobody answers
        Some(after) => {
            let (k, op) = (k.clone(), op.clone());
            let wait = tokio::spawn(async move { wait_foreground(&k, &op, Some(after)).await });
            let view = wait
                .await
                .map_err(|e| ApiError::internal(format!("the foreground wait failed: {e}")))??;
            Ok(Json(view))
        }
    }
}

async fn wait_foreground(
    k: &AppState,
    op: &Op,
    yield_after: Option<Duration>,
) -> ApiResult<OpView> {
    let budget =
        Duration::from_secs(op.timeout_sec) + k.config.ops.kill_grace * 3 + Duration::from_secs(30);
    let mut op =
        super::waits::after_observer(k, &op.id, yield_after.unwrap_or(budget).min(budget)).await?;
    if let (false, Some(after)) = (op.status.is_terminal(), yield_after) {
        // the op becomes a background one unless it has just settled
        if let Some(flipped) = k.store.yield_to_background(&op.id).await? {
            return Ok(super::interactive::yielded(k, flipped, after).await);
        }
        op = super::waits::after_observer(k, &op.id, Duration::ZERO).await?;
    }
    let delivered = op.status.is_terminal() && k.store.mark_delivered_inline(&op.id).await?;
    let (output, _) = super::waits::output_so_far(k, &op);
    Ok(OpView {
        output: Some(output),
        delivered,
        ..OpView::of(&op)
    })
}

/// A foreground command in a throwaway container, removed afterwards.
#[utoipa::path(
    post,
    path = "/v1/tools/run_command",
    tag = "operations",
    request_body = RunCommand,
    responses((status = 200, description = "Success", body = OpView)),
)]
pub async fn run_oneshot(
    State(k): State<AppState>,
    principal: Principal,
    via: super::origin::Via,
    Body(req): Body<RunCommand>,
) -> ApiResult<Json<OpView>> {
    require_operator(&principal)?;
    if req.background {
        return Err(ApiError::bad_request(
            "background commands need a run: use /v1/runs/{run}/tools/run_command",
        ));
    }
    if req.stdin || req.tty.is_some() || req.yield_ms.is_some() {
        return Err(ApiError::bad_request(
            "stdin, tty and yield_ms need a run (a throwaway container is removed when the call \
             answers): use /v1/runs/{run}/tools/run_command",
        ));
    }
    let timeout = validate(&k, &req, &k.config.default_envelope())?;
    let run = format!("oneshot-{}", uuid::Uuid::new_v4().simple());
    // in a cluster, on this node: its container is removed here afterwards
    if let Some(me) = k.store.node() {
        k.store.pin_run(&run, me, &via.origin(&principal)).await?;
    }
    let start = StartRequest {
        scratch_key: sandbox::profile::scratch_key(&run),
        run_id: run.clone(),
        command: req.command,
        background: false,
        timeout_sec: timeout,
        io: sandbox::Io::Null,
        idempotency_key: None,
        approval: None,
        schedule_id: None,
        origin: via.origin(&principal),
    };
    let answer = start_and_answer(&k, start, k.config.admission(), None).await;
    // an op that outlived the wait keeps its container (the reaper takes
    // it once the op has ended)
    let ended = answer.as_ref().is_ok_and(|view| view.status.is_terminal());
    if ended {
        k.remove_run_container(&run).await;
        k.forget_run(&run);
    }
    answer
}

#[utoipa::path(
    post,
    path = "/v1/runs/{run}/tools/kill_operation",
    tag = "operations",
    params(super::params::RunPath),
    request_body = KillOperation,
    responses((status = 200, description = "Success", body = OpView)),
)]
pub async fn kill_operation(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    headers: HeaderMap,
    Body(req): Body<KillOperation>,
) -> ApiResult<axum::response::Response> {
    // an ancestor may kill a descendant's op (through the descendant's path)
    authorize_run(&k, &principal, &run, Scope::Subtree).await?;
    let op = visible_op(&k, &principal, &req.operation_id).await?;
    if op.run_id != run {
        return Err(ApiError::not_found(format!(
            "no operation {} in run {run}",
            op.id
        )));
    }
    if let (Some(name), false) = (req.signal, op.status.is_terminal()) {
        return super::interactive::signal(&k, &op, name, &headers, &req).await;
    }
    kill_whole(&k, op)
        .await
        .map(|view| Json(view).into_response())
}

/// `kill_operation` without a signal: TERM, the grace, KILL (or the
/// withdrawal of an op awaiting approval).
async fn kill_whole(k: &AppState, op: Op) -> ApiResult<OpView> {
    if op.status.is_terminal() {
        let mut ended = format!("operation already ended: {}", op.status.as_str());
        // a lost op's command may still run: its node stops it (SPEC §24)
        if op.status == Status::Lost && crate::runtime::stop::stop_settled_anywhere(k, &op).await {
            ended.push_str("; what of its command may still run is being stopped");
        }
        return Ok(OpView::of(&op).saying(ended));
    }
    if op.status == Status::AwaitingApproval {
        let reason = "cancelled before approval";
        crate::runtime::control::deny(k, &op, reason, BY_KILL).await?;
        let op = k
            .store
            .get_op(&op.id)
            .await?
            .ok_or_else(|| ApiError::internal("operation vanished"))?;
        if op.status == Status::Denied {
            // it may have been denied just before, for another reason
            let why = op.error.clone().unwrap_or_else(|| reason.to_owned());
            return Ok(OpView::of(&op).saying(format!("operation denied: {why}")));
        }
        // approved meanwhile: it is an ordinary op now, killed as one
    }
    crate::runtime::control::kill(k, &op.id, KillReason::Kill).await?;
    // give the TERM → grace → KILL sequence time to finish, then answer with the state
    let budget = k.config.ops.kill_grace * 2 + Duration::from_secs(5);
    let op = super::waits::after_observer(k, &op.id, budget).await?;
    let message = if op.status.is_terminal() {
        format!("operation killed: {}", op.status.as_str())
    } else {
        "kill under way: SIGTERM sent, SIGKILL follows after the grace period; the outcome arrives as a normal resolution".to_owned()
    };
    Ok(OpView::of(&op).saying(message))
}

#[utoipa::path(
    get,
    path = "/v1/operations/{id}",
    tag = "operations",
    params(super::params::OpPath),
    responses((status = 200, description = "Success", body = OpView)),
)]
pub async fn get_operation(
    State(k): State<AppState>,
    principal: Principal,
    Seg(id): Seg<String>,
) -> ApiResult<Json<OpView>> {
    let op = visible_op(&k, &principal, &id).await?;
    Ok(Json(OpView::of(&op)))
}

/// `POST /v1/operations/{id}/approve`: operator only (a run token, even the
/// op's own, is refused: an agent cannot approve itself). The op starts
/// like a new one; its timeout counts from its start.
#[utoipa::path(
    post,
    path = "/v1/operations/{id}/approve",
    tag = "approvals",
    params(super::params::OpPath),
    responses((status = 200, description = "Success", body = OpView)),
)]
pub async fn approve(
    State(k): State<AppState>,
    principal: Principal,
    Seg(id): Seg<String>,
) -> ApiResult<Json<OpView>> {
    require_operator(&principal)?;
    let op = visible_op(&k, &principal, &id).await?;
    match crate::runtime::control::approve(&k, &op.id).await? {
        Err(refusal) => Err(ApiError::refused(&refusal)),
        Ok(Some(op)) => Ok(Json(
            OpView::of(&op).saying("approved: the operation starts now"),
        )),
        Ok(None) => Err(ApiError::conflict(format!(
            "operation {id} is not awaiting approval (it is {})",
            op.status.as_str()
        ))),
    }
}

/// Bytes of a denial reason.
const MAX_REASON_BYTES: usize = 4096;

/// `POST /v1/operations/{id}/deny {"reason"}`: operator only. The op ends
/// `denied` with the reason, delivered in the run's next report.
#[utoipa::path(
    post,
    path = "/v1/operations/{id}/deny",
    tag = "approvals",
    params(super::params::OpPath),
    request_body = Deny,
    responses((status = 200, description = "Success", body = OpView)),
)]
pub async fn deny(
    State(k): State<AppState>,
    principal: Principal,
    Seg(id): Seg<String>,
    Body(req): Body<Deny>,
) -> ApiResult<Json<OpView>> {
    require_operator(&principal)?;
    let op = visible_op(&k, &principal, &id).await?;
    let reason = req.reason.unwrap_or_default();
    if reason.len() > MAX_REASON_BYTES || reason.contains('\0') {
        return Err(ApiError::bad_request(format!(
            "reason must be at most {MAX_REASON_BYTES} bytes, without NUL bytes"
        )));
    }
    // one line in the report: control characters become spaces
    let reason: String = reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let reason = match reason.trim() {
        "" => "no reason given".to_owned(),
        r => r.to_owned(),
    };
    if !crate::runtime::control::deny(&k, &op, &reason, BY_OPERATOR).await? {
        return Err(ApiError::conflict(format!(
            "operation {id} is not awaiting approval (it is {})",
            op.status.as_str()
        )));
    }
    let op = k
        .store
        .get_op(&op.id)
        .await?
        .ok_or_else(|| ApiError::internal("operation vanished"))?;
    Ok(Json(OpView::of(&op).saying(format!("denied: {reason}"))))
}

/// `GET /v1/approvals`: ops waiting for approval (the operator sees all; a
/// run token its own run's and its descendants').
#[utoipa::path(
    get,
    path = "/v1/approvals",
    tag = "approvals",
    responses((status = 200, description = "Success", body = OpList)),
)]
pub async fn approvals(State(k): State<AppState>, principal: Principal) -> ApiResult<Json<OpList>> {
    let root = match &principal {
        Principal::Operator => None,
        Principal::Run(own) => Some(own.clone()),
    };
    let ops = k.store.waiting_ops(root).await?;
    Ok(Json(OpList {
        operations: ops.iter().map(OpView::of).collect(),
    }))
}
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only this run's ops.
    #[param(pattern = r"^[A-Za-z0-9_.-]{1,64}$")]
    run: Option<String>,
    /// Ops at most, newest first.
    #[param(value_type = Option<u64>, maximum = 4294967295_u64)]
    limit: Option<u32>,
    /// Only ops that are not terminal.
    #[serde(default)]
    live: bool,
    /// Only ops that came in by this surface (SPEC §28).
    #[param(value_type = Option<String>, pattern = r"^(http|cli|mcp|panel|schedule)$")]
    surface: Option<crate::origin::Surface>,
}

#[utoipa::path(
    get,
    path = "/v1/ops",
    tag = "operations",
    params(ListQuery),
    responses((status = 200, description = "Success", body = OpList)),
)]
pub async fn list_ops(
    State(k): State<AppState>,
    principal: Principal,
    Params(q): Params<ListQuery>,
) -> ApiResult<Json<OpList>> {
    let run = match (&principal, q.run) {
        (Principal::Operator, run) => run,
        (Principal::Run(own), None) => Some(own.clone()),
        (Principal::Run(_), Some(run)) => Some(run),
    };
    if let Some(run) = &run {
        super::authorize_run(&k, &principal, run, super::Scope::Subtree).await?;
    }
    let limit = q.limit.unwrap_or(200).min(5000);
    let ops = k.store.list_ops_by(run, q.surface, q.live, limit).await?;
    Ok(Json(OpList {
        operations: ops.iter().map(OpView::of).collect(),
    }))
}
