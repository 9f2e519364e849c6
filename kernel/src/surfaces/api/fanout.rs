//! Operator views that cover the cluster (SPEC §24): `GET /v1/containers`,
//! `POST /v1/reap` and `GET /v1/containers/{id}` through any node answer
//! for every node. The call is sent on to each other node that is not dead
//! (its advertised URL, the caller's own token, checked again there, and a
//! mark proving it was forwarded, so it goes no further); a node that does
//! not answer, or is dead, is listed as unreachable, never silently left
//! out.

use axum::http::{header, HeaderMap};
use serde::de::DeserializeOwned;

use super::{proxy, ApiResult, AppState};
use crate::surfaces::views::UnreachableNode;

/// What the other nodes answered to `method path`: each node's answer
/// read as `T`, and the nodes that could not answer. Nothing for a single
/// kernel, or for a call that was itself forwarded.
pub(super) async fn others<T: DeserializeOwned>(
    k: &AppState,
    headers: &HeaderMap,
    method: reqwest::Method,
    path: &str,
) -> ApiResult<(Vec<(String, T)>, Vec<UnreachableNode>)> {
    let (mut answers, mut unreachable) = (Vec::new(), Vec::new());
    if k.node.is_none() || proxy::is_forwarded(k, headers, path) {
        return Ok((answers, unreachable));
    }
    for node in k.store.nodes().await? {
        if k.runs_here(Some(&node.name)) {
            continue;
        }
        if node.state == "dead" {
            unreachable.push(UnreachableNode {
                node: node.name,
                reason: "declared dead: its containers are out of reach".into(),
            });
            continue;
        }
        match ask(k, headers, method.clone(), &node.advertise_url, path).await {
            Ok(Some(answer)) => answers.push((node.name, answer)),
            // it answered: it has nothing of that name
            Ok(None) => {}
            Err(reason) => unreachable.push(UnreachableNode {
                node: node.name,
                reason,
            }),
        }
    }
    Ok((answers, unreachable))
}

/// One node's answer to the forwarded call, read as `T` (`None`: it has
/// no such thing, a 404); why it gave none, else.
async fn ask<T: DeserializeOwned>(
    k: &AppState,
    headers: &HeaderMap,
    method: reqwest::Method,
    base: &str,
    path: &str,
) -> Result<Option<T>, String> {
    let mut req = proxy::client()
        .request(method, format!("{base}{path}"))
        .timeout(std::time::Duration::from_secs(30))
        .header(proxy::FORWARDED, proxy::proof(k, path));
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        req = req.header(header::AUTHORIZATION, v);
    }
    let answer = req
        .send()
        .await
        .map_err(|e| format!("did not answer at {base}: {e}"))?;
    let status = answer.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(format!("answered {status} at {base}"));
    }
    answer
        .json::<T>()
        .await
        .map(Some)
        .map_err(|e| format!("answered something unreadable at {base}: {e}"))
}
