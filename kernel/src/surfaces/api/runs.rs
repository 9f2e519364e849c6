//! Runs as durable tasks (SPEC §14): creating runs and child runs, their
//! state, the state changes and model usage. The run's trace and served
//! reports are in `events.rs`.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;

use super::{authorize_run, ApiError, ApiResult, AppState, Body, Params, Scope, Seg};
use crate::base::tokens::{new_token, token_sha256};
use crate::runs::{Budget, EnvelopeError, RunAction, Used, MAX_AMOUNT};
use crate::store::{CreatedRun, ModelUsage, NewRun, RunChange, RunRecord, UsageRecorded};
use crate::surfaces::auth::Principal;
use crate::surfaces::requests::{Complete, CreateRun, UsageRequest};
use crate::surfaces::views::{
    Amounts, ChildView, RunChangeAnswer, RunCreated, RunList, RunSummary, RunView, UsageAnswer,
};

/// An envelope or budget error as the API answers it; `what` names the
/// part of the request (`envelope` or `budget`).
fn envelope_error(what: &'static str) -> impl Fn(EnvelopeError) -> ApiError {
    move |e| {
        match e {
        EnvelopeError::Invalid(m) => ApiError::bad_request(m),
        EnvelopeError::Wider {
            field,
            asked,
            allowed,
        } => ApiError::envelope_exceeded(format!(
            "{what}.{field}: {asked} is wider than the parent allows ({allowed}): a child run may only narrow its parent's envelope and budget"
        )),
    }
    }
}

fn who(principal: &Principal) -> String {
    match principal {
        Principal::Operator => "operator".to_owned(),
        Principal::Run(run) => format!("run:{run}"),
    }
}

/// `POST /v1/runs`: the operator registers a top-level run (or re-keys
/// one); a run token creates a child of its own run, whose envelope and
/// budget may only narrow the parent's. Parent, chain and principal come
/// from the token, never from the body.
#[utoipa::path(
    post,
    path = "/v1/runs",
    tag = "runs",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry return the first answer (1 to 128 printable ASCII characters)", pattern = r"^[!-~]{1,128}$")),
    request_body = CreateRun,
    responses((status = 200, description = "Success", body = RunCreated)),
)]
pub async fn create_run(
    State(k): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    via: super::origin::Via,
    Body(req): Body<CreateRun>,
) -> ApiResult<axum::response::Response> {
    let key = super::params::idempotency_key(&headers)?;
    // in a cluster, a fork is made where its source's workspace is
    if let Some(there) = super::workspaces::fork_elsewhere(&k, &principal, &headers, &req).await? {
        return Ok(there);
    }
    let mut req = req;
    req.run_id = run_id_of(&principal, &req.run_id)?;
    let budget = req.budget.unwrap_or_default();
    budget.validate().map_err(envelope_error("budget"))?;
    let (parent, envelope) = resolve_envelope(&k, &principal, &req, &budget).await?;
    super::network::check_served(&k, envelope.as_ref())?;
    check_runtime(&k, envelope.as_ref()).await?;
    let image = super::workspaces::run_image(&k, &principal, &req).await?;
    let fork = match &req.fork_from {
        Some(from) => {
            let source = super::workspaces::fork_source(&k, &principal, from).await?;
            let (temp, copied) =
                super::workspaces::copy_fork(&k, &source, req.consistent, None).await?;
            Some((source, temp, copied))
        }
        None => None,
    };
    let token = new_token();
    let new = NewRun {
        run_id: req.run_id.clone(),
        parent,
        envelope,
        budget,
        token_sha256: token_sha256(&token),
        idempotency_key: key,
        limits: k.config.admission(),
        image,
        origin: via.origin(&principal),
    };
    let (created, forked_from) =
        super::workspaces::create_placing(&k, &new, fork.as_ref(), req.consistent).await?;
    let record = match created {
        CreatedRun::Created(record) => record,
        CreatedRun::Exists(record) => {
            // a retry of the same creation gets a fresh token (the first
            // answer may never have arrived); anything else is a conflict
            if !is_retry(&record, &new, &req) {
                return Err(ApiError::conflict(format!(
                    "run {} already exists (a retry of a child's creation needs the same body and Idempotency-Key)",
                    req.run_id
                )));
            }
            k.store.rekey_run(&record.run_id, &new.token_sha256).await?;
            record
        }
        CreatedRun::Refused(refusal) => return Err(ApiError::refused(&refusal)),
        CreatedRun::NoParent => return Err(ApiError::not_found("the token's run is gone")),
    };
    let meta = k.remember_run(&record);
    let created = RunCreated {
        run_id: record.run_id,
        token,
        parent_run_id: record.parent_run_id,
        chain: record.chain,
        state: record.state,
        envelope: meta.envelope.clone(),
        budget: record.budget,
        image: meta.image.clone(),
        forked_from,
    };
    Ok(axum::response::IntoResponse::into_response(Json(created)))
}

/// The new run's parent and envelope: the operator's top-level run gets
/// its envelope over the kernel's defaults; a run token's child narrows
/// its parent's envelope and budget, within the depth bound.
async fn resolve_envelope(
    k: &AppState,
    principal: &Principal,
    req: &CreateRun,
    budget: &Budget,
) -> ApiResult<(Option<String>, Option<crate::runs::Envelope>)> {
    let parent = match principal {
        Principal::Operator => {
            let envelope = req
                .envelope
                .as_ref()
                .map(|e| e.resolve_top_level(&k.config.default_envelope()))
                .transpose()
                .map_err(envelope_error("envelope"))?;
            return Ok((None, envelope));
        }
        Principal::Run(parent) => parent,
    };
    let meta = k
        .run_meta(parent)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no run {parent}")))?;
    if meta.chain.len() + 1 > k.config.runs.max_depth {
        return Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "depth_exceeded",
            format!(
                "run {parent} is at depth {} and children may be at most {} deep (OPKERNEL_MAX_DEPTH)",
                meta.chain.len(),
                k.config.runs.max_depth
            ),
        ));
    }
    // an allow list may have changed since the run was cached (SPEC §27)
    let mut parent_envelope = meta.envelope.clone();
    if let crate::egress::Network::Allow(_) = parent_envelope.network {
        if let Some(now) = k.store.get_run(parent).await?.and_then(|r| r.envelope) {
            parent_envelope.network = now.network;
        }
    }
    let envelope = req
        .envelope
        .clone()
        .unwrap_or_default()
        .narrow(&parent_envelope)
        .map_err(envelope_error("envelope"))?;
    budget
        .narrow(&k.store.tightest_budget(parent).await?)
        .map_err(envelope_error("budget"))?;
    Ok((Some(parent.clone()), Some(envelope)))
}

/// Refuses an envelope whose runtime this node's engine has not
/// registered (SPEC §30): the run would never get a container.
async fn check_runtime(k: &AppState, envelope: Option<&crate::runs::Envelope>) -> ApiResult<()> {
    let Some(runtime) = envelope.map(|e| e.runtime).filter(|r| !r.is_runc()) else {
        return Ok(());
    };
    if k.config.profile.runs_as_root() {
        return Err(ApiError::bad_request(
            "envelope runtime runsc needs commands that do not run as root \
             (this kernel runs them as root: OPKERNEL_RUN_AS)",
        ));
    }
    let known = k.backend.runtimes().await.map_err(|e| {
        ApiError::unavailable(format!("cannot ask the engine for its runtimes: {e}"))
    })?;
    if known.iter().any(|name| name == runtime.as_str()) {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "envelope {}",
        crate::runtime::home::missing_runtime(runtime, &known)
    )))
}

/// The new run's id: a child's lives in its parent's namespace
/// (`<parent>.<name>`); checked.
fn run_id_of(principal: &Principal, asked: &str) -> ApiResult<String> {
    let id = match principal {
        Principal::Run(parent) => crate::runs::child_run_id(parent, asked),
        Principal::Operator => asked.to_owned(),
    };
    sandbox::profile::validate_run_id(&id).map_err(|e| match principal {
        Principal::Run(_) => {
            ApiError::bad_request(format!("{e} (a child run's id is <parent>.<name>)"))
        }
        Principal::Operator => ApiError::bad_request(e.to_string()),
    })?;
    Ok(id)
}

/// Whether a creation that found its run already there is a retry of the
/// one that made it: the operator re-keys a top-level run (what it
/// restates must match; a child's token comes from its parent); a parent
/// retries a creation whose answer it lost with the same request under
/// the same `Idempotency-Key`.
fn is_retry(record: &RunRecord, new: &NewRun, req: &CreateRun) -> bool {
    match &new.parent {
        None => {
            record.parent_run_id.is_none()
                && (req.image.is_none() || record.image == new.image)
                && (req.envelope.is_none() || record.envelope == new.envelope)
                && (req.budget.is_none() || record.budget == new.budget)
        }
        Some(_) => {
            record.parent_run_id == new.parent
                && record.image == new.image
                && record.envelope == new.envelope
                && record.budget == new.budget
                && new.idempotency_key.is_some()
                && record.idempotency_key == new.idempotency_key
        }
    }
}

/// The usage and remaining amounts of a run's view.
fn amounts(used: Used, budget: &Budget) -> ApiResult<(Amounts, Amounts)> {
    let bad = |e: serde_json::Error| ApiError::internal(format!("usage amounts: {e}"));
    Ok((
        Amounts::used(used).map_err(bad)?,
        Amounts::remaining(used, budget).map_err(bad)?,
    ))
}

async fn run_view(k: &AppState, record: RunRecord) -> ApiResult<RunView> {
    let meta = k.remember_run(&record);
    let used = k.store.usage_over_subtree(&record.run_id).await?;
    let children = k
        .store
        .children(&record.run_id)
        .await?
        .into_iter()
        .map(|(run_id, state)| ChildView { run_id, state })
        .collect();
    let (used, remaining) = amounts(used, &record.budget)?;
    // a tree lives on its root's node
    let node = match record.chain.first() {
        None => record.node.clone(),
        Some(root) => k.store.get_run(root).await?.and_then(|r| r.node),
    };
    Ok(RunView {
        node,
        state: record.state,
        parent_run_id: record.parent_run_id,
        chain: record.chain,
        principal: record.principal,
        children,
        envelope: meta.envelope.clone(),
        used,
        remaining,
        budget: record.budget,
        created_at: record.created_at,
        state_changed_at: record.state_changed_at,
        summary: record.summary,
        decided_by: record.decided_by,
        run_id: record.run_id,
        image: meta.image.clone(),
        origin: record.origin,
    })
}

pub(super) async fn load_run(k: &AppState, run: &str) -> ApiResult<RunRecord> {
    k.store
        .get_run(run)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no run {run}")))
}

#[utoipa::path(
    get,
    path = "/v1/runs/{run}",
    tag = "runs",
    params(super::params::RunPath),
    responses((status = 200, description = "Success", body = RunView)),
)]
pub async fn get_run(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
) -> ApiResult<Json<RunView>> {
    authorize_run(&k, &principal, &run, Scope::Subtree).await?;
    let record = load_run(&k, &run).await?;
    Ok(Json(run_view(&k, record).await?))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListRunsQuery {
    /// Runs at most.
    #[param(value_type = Option<u64>, maximum = 4294967295_u64)]
    limit: Option<u32>,
}

/// Every run (operator) or the token's run and its descendants, oldest
/// first, each with its parent, state and live-op count.
#[utoipa::path(
    get,
    path = "/v1/runs",
    tag = "runs",
    params(ListRunsQuery),
    responses((status = 200, description = "Success", body = RunList)),
)]
pub async fn list_runs(
    State(k): State<AppState>,
    principal: Principal,
    Params(q): Params<ListRunsQuery>,
) -> ApiResult<Json<RunList>> {
    let root = match &principal {
        Principal::Operator => None,
        Principal::Run(own) => Some(own.clone()),
    };
    let runs = k
        .store
        .list_runs(root, q.limit.unwrap_or(1000).min(10_000))
        .await?;
    let runs = runs
        .into_iter()
        .map(|(r, live_ops)| RunSummary {
            depth: r.chain.len(),
            run_id: r.run_id,
            parent_run_id: r.parent_run_id,
            state: r.state,
            live_ops,
            budget: r.budget,
            created_at: r.created_at,
        })
        .collect();
    Ok(Json(RunList { runs }))
}

/// Applies a state change and answers with the run as it is now.
async fn change(
    k: AppState,
    principal: Principal,
    run: String,
    action: RunAction,
    scope: Scope,
    summary: Option<String>,
) -> ApiResult<Json<RunChangeAnswer>> {
    authorize_run(&k, &principal, &run, scope).await?;
    let change =
        crate::runtime::control::change_run(&k, &run, action, &who(&principal), summary).await?;
    let (record, changed, kills, denied) = match change {
        RunChange::Done {
            run,
            changed,
            kills,
            denied,
        } => (run, changed, kills, denied),
        RunChange::NotFound => return Err(ApiError::not_found(format!("no run {run}"))),
        RunChange::Refused(state) => {
            return Err(ApiError::run_state(
                state,
                format!(
                    "run {run} is {}: it cannot {} any more",
                    state.as_str(),
                    action.as_str()
                ),
            ))
        }
        RunChange::PausedAbove(pauser) => {
            return Err(ApiError::forbidden(format!(
                "run {run} was paused by {pauser}: only it, a run above it or the operator may resume it"
            )))
        }
        RunChange::LiveOps(n) => {
            return Err(ApiError::new(
                axum::http::StatusCode::CONFLICT,
                "ops_live",
                format!(
                    "{n} operations of run {run} or its descendants are still live: \
                     wait for their results or kill them, then complete the run"
                ),
            ))
        }
    };
    // the kill requests are durable; observers act on them now (or the
    // next kernel does, after a restart): the control layer started them
    Ok(Json(RunChangeAnswer {
        run: run_view(&k, *record).await?,
        changed,
        kill_requested: kills,
        denied,
    }))
}

#[utoipa::path(
    post,
    operation_id = "pause_run",
    path = "/v1/runs/{run}/pause",
    tag = "runs",
    params(super::params::RunPath),
    responses((status = 200, description = "Success", body = RunChangeAnswer)),
)]
pub async fn pause(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
) -> ApiResult<Json<RunChangeAnswer>> {
    change(k, principal, run, RunAction::Pause, Scope::Subtree, None).await
}

#[utoipa::path(
    post,
    operation_id = "resume_run",
    path = "/v1/runs/{run}/resume",
    tag = "runs",
    params(super::params::RunPath),
    responses((status = 200, description = "Success", body = RunChangeAnswer)),
)]
pub async fn resume(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
) -> ApiResult<Json<RunChangeAnswer>> {
    change(k, principal, run, RunAction::Resume, Scope::Subtree, None).await
}

#[utoipa::path(
    post,
    operation_id = "cancel_run",
    path = "/v1/runs/{run}/cancel",
    tag = "runs",
    params(super::params::RunPath),
    responses((status = 200, description = "Success", body = RunChangeAnswer)),
)]
pub async fn cancel(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
) -> ApiResult<Json<RunChangeAnswer>> {
    change(k, principal, run, RunAction::Cancel, Scope::Subtree, None).await
}

/// Bytes of a completion summary.
const MAX_SUMMARY_BYTES: usize = 16 * 1024;

/// `complete` is an explicit decision of the run itself (or the operator):
/// silence or an idle run never completes it.
#[utoipa::path(
    post,
    operation_id = "complete_run",
    path = "/v1/runs/{run}/complete",
    tag = "runs",
    params(super::params::RunPath),
    request_body = Complete,
    responses((status = 200, description = "Success", body = RunChangeAnswer)),
)]
pub async fn complete(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    Body(req): Body<Complete>,
) -> ApiResult<Json<RunChangeAnswer>> {
    if req.summary.trim().is_empty()
        || req.summary.len() > MAX_SUMMARY_BYTES
        || req.summary.contains('\0')
    {
        return Err(ApiError::bad_request(format!(
            "summary must be non-empty, without NUL bytes and at most {MAX_SUMMARY_BYTES} bytes"
        )));
    }
    change(
        k,
        principal,
        run,
        RunAction::Complete,
        Scope::Own,
        Some(req.summary),
    )
    .await
}

/// `POST /v1/runs/{run}/usage`: the agent runtime's model usage, one
/// append-only ledger fact (a retry under the same `Idempotency-Key`
/// records nothing more).
#[utoipa::path(
    post,
    operation_id = "record_usage",
    path = "/v1/runs/{run}/usage",
    tag = "runs",
    params(super::params::RunPath, ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry count once (1 to 128 printable ASCII characters)", pattern = r"^[!-~]{1,128}$")),
    request_body = UsageRequest,
    responses((status = 200, description = "Success", body = UsageAnswer)),
)]
pub async fn usage(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    headers: HeaderMap,
    Body(req): Body<UsageRequest>,
) -> ApiResult<Json<UsageAnswer>> {
    authorize_run(&k, &principal, &run, Scope::Own).await?;
    let model_ok = !req.model.trim().is_empty()
        && req.model.chars().count() <= 128
        && !req.model.chars().any(char::is_control);
    if !model_ok {
        return Err(ApiError::bad_request(
            "model must be 1-128 characters without control characters",
        ));
    }
    for (name, v) in [
        ("input_tokens", req.input_tokens),
        ("output_tokens", req.output_tokens),
        ("cost_micros", req.cost_micros),
    ] {
        if v > MAX_AMOUNT {
            return Err(ApiError::bad_request(format!(
                "{name} must be at most {MAX_AMOUNT}"
            )));
        }
    }
    let record = load_run(&k, &run).await?;
    let key = super::params::idempotency_key(&headers)?;
    let usage = ModelUsage {
        model: req.model,
        input_tokens: req.input_tokens,
        output_tokens: req.output_tokens,
        cost_micros: req.cost_micros,
    };
    let (seq, recorded) = match k.store.record_model_usage(&run, usage, key).await? {
        UsageRecorded::Recorded(seq) => (seq, true),
        UsageRecorded::Existing(seq) => (seq, false),
        UsageRecorded::KeyConflict => {
            return Err(ApiError::conflict(
                "Idempotency-Key was already used for different usage of this run",
            ))
        }
    };
    let used = k.store.usage_over_subtree(&run).await?;
    let (used, remaining) = amounts(used, &record.budget)?;
    Ok(Json(UsageAnswer {
        run_id: run,
        seq,
        recorded,
        used,
        remaining,
    }))
}
