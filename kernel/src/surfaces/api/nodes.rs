//! The cluster's nodes (SPEC §20), for the operator: `GET /v1/nodes`,
//! `POST /v1/nodes/{name}/drain` and `POST /v1/nodes/{name}/activate`.

use axum::extract::State;
use axum::Json;

use super::{require_operator, ApiError, ApiResult, AppState, Seg};
use crate::surfaces::auth::Principal;
use crate::surfaces::views::{NodeDrained, NodeList, NodeView};

#[utoipa::path(
    get,
    path = "/v1/nodes",
    tag = "operators",
    responses((status = 200, description = "Success", body = NodeList)),
)]
pub async fn nodes(State(k): State<AppState>, principal: Principal) -> ApiResult<Json<NodeList>> {
    require_operator(&principal)?;
    let nodes = k.store.nodes().await?;
    Ok(Json(NodeList {
        nodes: nodes.into_iter().map(NodeView::from).collect(),
    }))
}

#[utoipa::path(
    post,
    path = "/v1/nodes/{name}/drain",
    tag = "operators",
    params(super::params::NodePath),
    responses((status = 200, description = "Success", body = NodeDrained)),
)]
pub async fn drain(
    State(k): State<AppState>,
    principal: Principal,
    Seg(name): Seg<String>,
) -> ApiResult<Json<NodeDrained>> {
    require_operator(&principal)?;
    let drained = k.store.drain_node(&name).await?;
    now_in(
        &k,
        name,
        drained,
        ("draining", "only an active node is drained"),
    )
    .await
}

#[utoipa::path(
    post,
    path = "/v1/nodes/{name}/activate",
    tag = "operators",
    params(super::params::NodePath),
    responses((status = 200, description = "Success", body = NodeDrained)),
)]
pub async fn activate(
    State(k): State<AppState>,
    principal: Principal,
    Seg(name): Seg<String>,
) -> ApiResult<Json<NodeDrained>> {
    require_operator(&principal)?;
    let activated = k.store.activate_node(&name).await?;
    let refused = "only a draining node is activated (a dead one joins again by itself)";
    now_in(&k, name, activated, ("active", refused)).await
}

/// The answer to a state change of a node: done (`changed`), already in
/// `want` (the same answer: the call is idempotent), else a conflict naming
/// its state, or 404 for no such node.
async fn now_in(
    k: &AppState,
    name: String,
    changed: bool,
    (want, refused): (&str, &str),
) -> ApiResult<Json<NodeDrained>> {
    let state = match changed {
        true => want.to_owned(),
        false => match k.store.nodes().await?.into_iter().find(|n| n.name == name) {
            Some(n) if n.state == want => n.state,
            Some(n) => {
                return Err(ApiError::conflict(format!(
                    "node {name} is {}: {refused}",
                    n.state
                )))
            }
            None => return Err(ApiError::not_found(format!("no node {name}"))),
        },
    };
    Ok(Json(NodeDrained { name, state }))
}
