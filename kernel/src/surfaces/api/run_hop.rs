//! Calls about a run's workspace in a cluster (SPEC §26): its files, its
//! archives and its snapshots live on the disk of the node its tree is
//! placed on, so a call that reaches another node is relayed there whole,
//! its body streamed as it comes, with the caller's own token (checked
//! here first, and again there). A tree not placed yet is placed by the
//! call, as its first op would place it: a file written before any command
//! goes where the commands will run.

use axum::extract::{FromRequestParts, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::proxy::{self, Hop};
use super::{authorize_run, ApiError, ApiResult, AppState, Scope};
use crate::surfaces::auth::Principal;

/// Where a call is answered.
enum Routed {
    /// By this node's handler.
    Here(Request),
    /// By the run's node: its answer.
    There(Response),
}

/// The layer on the workspace routes: answers here what is this node's,
/// relays the rest to the run's node.
pub(super) async fn on_its_node(State(k): State<AppState>, req: Request, next: Next) -> Response {
    match route(&k, req).await {
        Ok(Routed::Here(req)) => next.run(req).await,
        Ok(Routed::There(answer)) => answer,
        Err(e) => e.into_response(),
    }
}

/// The run a workspace path names (`/v1/runs/{run}/…`), as sent: a
/// segment that is not a run id as it stands (percent-encoded, say) is
/// refused rather than decoded here and routed otherwise.
fn run_of(path: &str) -> ApiResult<Option<&str>> {
    let Some(rest) = path.strip_prefix("/v1/runs/") else {
        return Ok(None);
    };
    let run = rest.split('/').next().unwrap_or_default();
    sandbox::profile::validate_run_id(run)
        .map_err(|e| ApiError::bad_request(format!("run id in the path: {e}")))?;
    Ok(Some(run))
}

/// Whether the path is the snapshot list's own (`/v1/runs/{run}/snapshots`).
fn is_snapshot_list(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    matches!(parts.as_slice(), ["", "v1", "runs", _, "snapshots"])
}

async fn route(k: &AppState, req: Request) -> ApiResult<Routed> {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    // the snapshot list is the control plane's: answered by any node
    let listing = req.method() == Method::GET && is_snapshot_list(req.uri().path());
    let Some(run) = run_of(req.uri().path())?.map(str::to_owned) else {
        return Ok(Routed::Here(req));
    };
    if k.node.is_none() || listing || proxy::is_forwarded(k, req.headers(), &path) {
        return Ok(Routed::Here(req));
    }
    let (mut parts, body) = req.into_parts();
    let principal = Principal::from_request_parts(&mut parts, k).await?;
    authorize_run(k, &principal, &run, Scope::Own).await?;
    let Some(node) = k.store.workspace_node(&run).await? else {
        if k.run_meta(&run).await?.is_none() {
            // the handler's own answer (no such run)
            return Ok(Routed::Here(Request::from_parts(parts, body)));
        }
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "node_unavailable",
            format!("no active node can take run {run}'s tree (and its workspace) now"),
        ));
    };
    if k.runs_here(Some(&node)) {
        return Ok(Routed::Here(Request::from_parts(parts, body)));
    }
    let carries = matches!(parts.method, Method::PUT | Method::POST);
    let kind = parts
        .headers
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("application/octet-stream"));
    let hop = Hop {
        node: &node,
        lost: format!("run {run}'s workspace was on node {node}, which is dead"),
        path: &path,
        method: parts.method.clone(),
        body: carries.then(|| (reqwest::Body::wrap_stream(body.into_data_stream()), kind)),
    };
    proxy::relay(k, &parts.headers, hop)
        .await
        .map(Routed::There)
}

#[cfg(test)]
mod tests {
    use super::{is_snapshot_list, run_of};

    #[test]
    fn the_run_is_the_third_segment_and_a_valid_id() {
        assert_eq!(run_of("/v1/runs/r1/files/a/b").ok(), Some(Some("r1")));
        assert_eq!(run_of("/v1/runs/r.c/snapshots").ok(), Some(Some("r.c")));
        assert!(run_of("/v1/runs/../files/x").is_err());
        assert!(
            run_of("/v1/runs/r%31/files/x").is_err(),
            "never decoded here"
        );
        assert_eq!(run_of("/v1/ops").ok(), Some(None));
    }

    #[test]
    fn only_the_list_itself_is_the_snapshot_list() {
        assert!(is_snapshot_list("/v1/runs/r1/snapshots"));
        assert!(!is_snapshot_list("/v1/runs/r1/files/scratch/snapshots"));
        assert!(!is_snapshot_list("/v1/runs/r1/archive/snapshots"));
    }
}
