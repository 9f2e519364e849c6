//! The operator's container views: the run containers (across the
//! cluster's nodes) and the reaper's decisions, with `POST /v1/reap`.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;

use super::{require_operator, ApiResult, AppState, Params};
use crate::surfaces::auth::Principal;
use crate::surfaces::views::{ContainerList, ContainerView, ReapList};

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
