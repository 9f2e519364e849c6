//! Operator views (ops, containers), the tool schemas, health, the reaper
//! endpoint and the drill fault hook.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;

use super::{require_operator, visible_op, ApiError, ApiResult, AppState, Body, Params, Seg};
use crate::surfaces::auth::Principal;
use crate::surfaces::views::{
    ClockStepped, ContainerList, ContainerView, DrillFault, DrillWoken, Health, OpList, OpView,
    PrincipalKind, ReapList, ToolsView, WhoAmI,
};

#[utoipa::path(
    get,
    path = "/v1/health",
    tag = "kernel",
    responses((status = 200, description = "Success", body = Health)),
    security(()),
)]
pub async fn health(State(k): State<AppState>) -> Json<Health> {
    Json(Health {
        ok: true,
        kernel_id: k.id.clone(),
    })
}

/// `GET /v1/whoami`: who the token is (the operator, or a run).
#[utoipa::path(
    get,
    path = "/v1/whoami",
    tag = "kernel",
    responses((status = 200, description = "Success", body = WhoAmI)),
)]
pub async fn whoami(principal: Principal) -> Json<WhoAmI> {
    Json(match principal {
        Principal::Operator => WhoAmI {
            principal: PrincipalKind::Operator,
            run_id: None,
        },
        Principal::Run(run) => WhoAmI {
            principal: PrincipalKind::Run,
            run_id: Some(run),
        },
    })
}

/// JSON tool definitions for function calling, with the limits stated.
#[utoipa::path(
    get,
    path = "/v1/tools",
    tag = "kernel",
    responses((status = 200, description = "Success", body = ToolsView)),
    security(()),
)]
pub async fn tools(State(k): State<AppState>) -> Json<ToolsView> {
    Json(crate::surfaces::tools::tool_definitions(&k.config))
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
    let ops = if q.live {
        k.store.list_live_ops(run, limit).await?
    } else {
        k.store.list_ops(run, limit).await?
    };
    Ok(Json(OpList {
        operations: ops.iter().map(OpView::of).collect(),
    }))
}

#[utoipa::path(
    get,
    path = "/v1/containers",
    tag = "operators",
    responses((status = 200, description = "Success", body = ContainerList)),
)]
pub async fn containers(
    State(k): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
) -> ApiResult<Json<ContainerList>> {
    require_operator(&principal)?;
    let registered = k.registered_containers();
    let list = k.backend.list_managed().await?;
    let label = |c: &sandbox::ContainerInfo, name: &str| c.labels.get(name).cloned();
    let me = k.store.node().map(str::to_owned);
    let mut containers: Vec<ContainerView> = list
        .iter()
        .map(|c| ContainerView {
            container_id: c.id.clone(),
            name: c.name.clone(),
            state: c.state.clone(),
            run_id: k.run_of(c),
            pool: k.pool.role(c).map(|r| r.as_str().to_owned()),
            scratch_key: label(c, sandbox::profile::LABEL_SCRATCH_KEY),
            run_fingerprint: label(c, sandbox::profile::LABEL_FINGERPRINT),
            created_at: label(c, sandbox::profile::LABEL_CREATED_AT),
            registered: registered.contains(&c.id),
            node: me.clone(),
        })
        .collect();
    // in a cluster, every other node's too (SPEC §24)
    let get = reqwest::Method::GET;
    let (answers, unreachable) =
        super::fanout::others::<ContainerList>(&k, &headers, get, "/v1/containers").await?;
    for (node, list) in answers {
        containers.extend(list.containers.into_iter().map(|c| ContainerView {
            node: Some(node.clone()),
            ..c
        }));
    }
    Ok(Json(ContainerList {
        containers,
        unreachable,
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ReapQuery {
    #[serde(default)]
    dry_run: bool,
}

#[utoipa::path(
    post,
    path = "/v1/reap",
    tag = "operators",
    params(ReapQuery),
    responses((status = 200, description = "Success", body = ReapList)),
)]
pub async fn reap(
    State(k): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    Params(q): Params<ReapQuery>,
) -> ApiResult<Json<ReapList>> {
    require_operator(&principal)?;
    let me = k.store.node().map(str::to_owned);
    let mut decisions: Vec<_> = crate::runtime::reaper::reap(&k, q.dry_run)
        .await?
        .into_iter()
        .map(|d| crate::runtime::reaper::ReapDecision {
            node: me.clone(),
            ..d
        })
        .collect();
    // in a cluster, each node's reaper decides on its own containers
    let path = format!("/v1/reap?dry_run={}", q.dry_run);
    let post = reqwest::Method::POST;
    let (answers, unreachable) =
        super::fanout::others::<ReapList>(&k, &headers, post, &path).await?;
    for (node, list) in answers {
        decisions.extend(list.decisions.into_iter().map(|d| {
            crate::runtime::reaper::ReapDecision {
                node: Some(node.clone()),
                ..d
            }
        }));
    }
    Ok(Json(ReapList {
        dry_run: q.dry_run,
        decisions,
        unreachable,
    }))
}

/// Operator only, and only on a kernel started with drills enabled.
fn require_drills(k: &AppState, principal: &Principal) -> ApiResult<()> {
    require_operator(principal)?;
    if !k.config.drills.on {
        return Err(ApiError::not_found(
            "fault hooks need a kernel started with drills enabled",
        ));
    }
    Ok(())
}

/// Injects a fault into an op's observer through `hook` (drills only);
/// 409 when this kernel observes no such op.
async fn inject(
    k: &AppState,
    principal: &Principal,
    id: &str,
    hook: fn(&crate::runtime::kernel::Kernel, &str) -> bool,
    fault: &str,
) -> ApiResult<Json<DrillFault>> {
    require_drills(k, principal)?;
    let op = visible_op(k, principal, id).await?;
    if !hook(k, &op.id) {
        return Err(ApiError::conflict(format!(
            "operation {} has no observer in this kernel (it is terminal)",
            op.id
        )));
    }
    Ok(Json(DrillFault {
        operation_id: op.id,
        fault: fault.to_owned(),
    }))
}

/// Drill hook: the op's current observer attempt fails at its next step.
pub async fn observer_fault(
    State(k): State<AppState>,
    principal: Principal,
    Seg(id): Seg<String>,
) -> ApiResult<Json<DrillFault>> {
    let hook = crate::runtime::kernel::Kernel::inject_observer_fault;
    inject(
        &k,
        &principal,
        &id,
        hook,
        "observer attempt fails at its next step",
    )
    .await
}

/// Drill hook: the op's current observer attempt panics for real (a bug's
/// unwinding); the supervisor must start the next attempt.
pub async fn observer_panic(
    State(k): State<AppState>,
    principal: Principal,
    Seg(id): Seg<String>,
) -> ApiResult<Json<DrillFault>> {
    let hook = crate::runtime::kernel::Kernel::inject_observer_panic;
    let fault = "observer attempt panics at its next step";
    inject(&k, &principal, &id, hook, fault).await
}

/// Drill hook: the op's supervisor gives up without settling it (as one
/// whose final write failed); the watchdog must take the op over.
pub async fn supervisor_end(
    State(k): State<AppState>,
    principal: Principal,
    Seg(id): Seg<String>,
) -> ApiResult<Json<DrillFault>> {
    let hook = crate::runtime::kernel::Kernel::inject_supervisor_end;
    let fault = "the supervisor gives up at the attempt's next step";
    inject(&k, &principal, &id, hook, fault).await
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClockStep {
    ms: i64,
}

/// Drill hook: steps the kernel's view of the wall clock, as an NTP step or
/// `date -s` would.
pub async fn clock_step(
    State(k): State<AppState>,
    principal: Principal,
    Body(step): Body<ClockStep>,
) -> ApiResult<Json<ClockStepped>> {
    require_drills(&k, &principal)?;
    crate::store::step_wall_clock(step.ms);
    Ok(Json(ClockStepped {
        stepped_ms: step.ms,
        now: crate::surfaces::views::rfc3339(crate::store::now_ms()),
    }))
}

/// Drill hook: how many probes went to containers' launchers and how many
/// by `docker exec` since the kernel started.
pub async fn probe_counts(
    State(k): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<crate::runtime::probes::ProbeCounts>> {
    require_drills(&k, &principal)?;
    Ok(Json(k.probes.counts()))
}

/// Drill hook: a spurious wake-up of an op's observer.
pub async fn observer_wake(
    State(k): State<AppState>,
    principal: Principal,
    Seg(id): Seg<String>,
) -> ApiResult<Json<DrillWoken>> {
    require_drills(&k, &principal)?;
    let op = visible_op(&k, &principal, &id).await?;
    k.wake_observer(&op.id);
    Ok(Json(DrillWoken {
        operation_id: op.id,
        woken: true,
    }))
}
