//! `GET /metrics` (SPEC §23): the kernel's Prometheus metrics, for the
//! operator token on the API's listener, or for anyone on the listener of
//! `OPKERNEL_METRICS_LISTEN` (loopback unless the operator binds it
//! elsewhere).

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::{require_operator, ApiResult, AppState};
use crate::surfaces::auth::Principal;

/// The exposition, with the levels read now from the control plane and
/// Docker (an unreachable Docker leaves the container levels out, as the
/// rest is still worth a scrape).
async fn exposition(k: &AppState) -> ApiResult<Response> {
    let mut levels = k.store.levels().await?;
    match k.backend.list_managed().await {
        Ok(list) => {
            for c in list {
                if let Some(role) = k.pool.role(&c) {
                    *levels.pool.entry(role.as_str().to_owned()).or_default() += 1;
                }
                *levels.containers.entry(c.state).or_default() += 1;
            }
        }
        Err(e) => tracing::warn!(%e, "metrics: containers not listed"),
    }
    if k.node.is_some() {
        for n in k.store.nodes().await? {
            levels.node_lease_age_ms.insert(n.name, n.lease_age_ms);
        }
    }
    let text = k.store.metrics().render(&levels);
    Ok(([(CONTENT_TYPE, crate::base::metrics::CONTENT_TYPE)], text).into_response())
}

/// `GET /metrics` on the API: the operator token only.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operators",
    responses((status = 200, description = "The metrics, Prometheus text format 0.0.4", body = String, content_type = "text/plain")),
)]
pub async fn metrics(State(k): State<AppState>, principal: Principal) -> ApiResult<Response> {
    require_operator(&principal)?;
    exposition(&k).await
}

/// The unauthenticated metrics listener's routes: `/metrics` alone.
pub fn open_router(kernel: AppState) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(k): State<AppState>| async move { exposition(&k).await }),
        )
        .fallback(|| async { super::ApiError::not_found("only /metrics is served here") })
        .with_state(kernel)
}
