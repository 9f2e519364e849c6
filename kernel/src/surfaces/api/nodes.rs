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
    params(("name" = String, Path, description = "The node's name")),
    responses((status = 200, description = "Success", body = NodeDrained)),
)]
pub async fn drain(
    State(k): State<AppState>,
    principal: Principal,
    Seg(name): Seg<String>,
) -> ApiResult<Json<NodeDrained>> {
    require_operator(&principal)?;
    if k.store.drain_node(&name).await? {
        return Ok(Json(NodeDrained {
            name,
            state: "draining".into(),
        }));
    }
    let known = k.store.nodes().await?.into_iter().find(|n| n.name == name);
    match known {
        Some(n) if n.state == "draining" => Ok(Json(NodeDrained {
            name,
            state: n.state,
        })),
        Some(n) => Err(ApiError::conflict(format!(
            "node {name} is {}: only an active node is drained",
            n.state
        ))),
        None => Err(ApiError::not_found(format!("no node {name}"))),
    }
}

#[utoipa::path(
    post,
    path = "/v1/nodes/{name}/activate",
    tag = "operators",
    params(("name" = String, Path, description = "The node's name")),
    responses((status = 200, description = "Success", body = NodeDrained)),
)]
pub async fn activate(
    State(k): State<AppState>,
    principal: Principal,
    Seg(name): Seg<String>,
) -> ApiResult<Json<NodeDrained>> {
    require_operator(&principal)?;
    if k.store.activate_node(&name).await? {
        return Ok(Json(NodeDrained {
            name,
            state: "active".into(),
        }));
    }
    let known = k.store.nodes().await?.into_iter().find(|n| n.name == name);
    match known {
        Some(n) if n.state == "active" => Ok(Json(NodeDrained {
            name,
            state: n.state,
        })),
        Some(n) => Err(ApiError::conflict(format!(
            "node {name} is {}: only a draining node is activated (a dead one joins again by itself)",
            n.state
        ))),
        None => Err(ApiError::not_found(format!("no node {name}"))),
    }
}
