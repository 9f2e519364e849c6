//! The recovery drills' fault hooks (served only with the drills' hooks
//! on, to the operator): observer faults, panics and wakes, a supervisor's
//! end, a wall-clock step, and the probe counts.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;

use super::{require_operator, visible_op, ApiError, ApiResult, AppState, Body, Seg};
use crate::surfaces::auth::Principal;
use crate::surfaces::views::{ClockStepped, DrillFault, DrillWoken};

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

/// The drill hooks' routes (only with `OPKERNEL_DRILLS` on).
pub(super) fn routes() -> axum::Router<super::AppState> {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/v1/drill/observer-fault/{id}", post(observer_fault))
        .route("/v1/drill/observer-panic/{id}", post(observer_panic))
        .route("/v1/drill/observer-wake/{id}", post(observer_wake))
        .route("/v1/drill/supervisor-end/{id}", post(supervisor_end))
        .route("/v1/drill/clock-step", post(clock_step))
        .route("/v1/drill/probes", get(probe_counts))
}
