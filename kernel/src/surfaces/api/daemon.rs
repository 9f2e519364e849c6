//! The kernel's own answers: health, who a token is, and the tool
//! definitions with their limits.

use axum::extract::State;
use axum::Json;

use super::AppState;
use crate::surfaces::auth::Principal;
use crate::surfaces::views::{Health, PrincipalKind, ToolsView, WhoAmI};

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
