//! A call about another cluster node's op (SPEC §20, §25): its log, its
//! console and its stdin live on that node, so the call is forwarded to the node's advertised URL
//! with the caller's own token (checked again there) and its answer
//! streamed back. A forwarded call (its mark proven with the cluster's
//! operator token) is never forwarded again.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use futures::TryStreamExt;

use super::{ApiError, ApiResult, AppState};
use crate::store::Op;

/// Marks a call one node forwarded to another, with its proof: sha256 of
/// the cluster's operator token and the path (a client cannot forge it,
/// and a forged mark is ignored: the call is forwarded as any other).
pub(super) const FORWARDED: &str = "x-opkernel-forwarded";

/// Whether this call was forwarded by another node (its mark proven).
pub(super) fn is_forwarded(k: &AppState, headers: &HeaderMap, path: &str) -> bool {
    headers
        .get(FORWARDED)
        .is_some_and(|v| v.as_bytes() == proof(k, path).as_bytes())
}

/// The proof a forwarded call of `path` carries.
pub(super) fn proof(k: &AppState, path: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("opkernel-forward\n{}\n{path}", k.operator_token));
    hex::encode(digest)
}

/// `Some(answer)` when `op` runs on another node: the same call (`path`
/// with its query) answered by that node; `None` when it is this node's
/// to answer (a single kernel, its own op, or a call already forwarded).
pub(super) async fn elsewhere(
    k: &AppState,
    op: &Op,
    headers: &HeaderMap,
    path: &str,
) -> ApiResult<Option<Response>> {
    forward(k, op, headers, path, None).await
}

/// [`elsewhere`] for a `POST` with a JSON body (an interactive call,
/// SPEC §25): its `Idempotency-Key` goes along.
pub(super) async fn elsewhere_post(
    k: &AppState,
    op: &Op,
    headers: &HeaderMap,
    path: &str,
    body: &impl serde::Serialize,
) -> ApiResult<Option<Response>> {
    let body = serde_json::to_vec(body).map_err(|e| ApiError::internal(e.to_string()))?;
    forward(k, op, headers, path, Some(body)).await
}

async fn forward(
    k: &AppState,
    op: &Op,
    headers: &HeaderMap,
    path: &str,
    body: Option<Vec<u8>>,
) -> ApiResult<Option<Response>> {
    let (Some(_), Some(node)) = (&k.node, op.node.as_deref()) else {
        return Ok(None);
    };
    if k.runs_here(Some(node)) || is_forwarded(k, headers, path) {
        return Ok(None);
    }
    let hop = Hop {
        node,
        lost: format!(
            "op {} ran on node {node}, which is dead: its log was on it",
            op.id
        ),
        path,
        method: if body.is_some() {
            Method::POST
        } else {
            Method::GET
        },
        body: body.map(|b| {
            (
                reqwest::Body::from(b),
                HeaderValue::from_static("application/json"),
            )
        }),
    };
    relay(k, headers, hop).await.map(Some)
}

/// One call relayed to another node: where, what, and what to say when
/// that node is dead.
pub(super) struct Hop<'a> {
    /// The node's name.
    pub node: &'a str,
    /// The refusal when the node is dead.
    pub lost: String,
    /// The path with its query.
    pub path: &'a str,
    /// The caller's method.
    pub method: Method,
    /// The body and its type (streamed on as it comes).
    pub body: Option<(reqwest::Body, HeaderValue)>,
}

/// Sends `hop` to its node's advertised URL with the caller's token and
/// the headers a call's meaning depends on; streams the answer back.
pub(super) async fn relay(k: &AppState, headers: &HeaderMap, hop: Hop<'_>) -> ApiResult<Response> {
    let node = hop.node;
    let row = k.store.nodes().await?.into_iter().find(|n| n.name == node);
    let unavailable =
        |why: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "node_unavailable", why);
    let Some(row) = row.filter(|n| n.state != "dead") else {
        return Err(unavailable(hop.lost));
    };
    let url = format!("{}{}", row.advertise_url, hop.path);
    let mut req = client()
        .request(hop.method, url)
        .header(FORWARDED, proof(k, hop.path));
    if let Some((body, kind)) = hop.body {
        req = req.header(header::CONTENT_TYPE, kind).body(body);
    }
    for name in [
        header::AUTHORIZATION,
        header::ACCEPT,
        header::RANGE,
        header::HeaderName::from_static("last-event-id"),
        header::HeaderName::from_static("idempotency-key"),
    ] {
        if let Some(v) = headers.get(&name) {
            req = req.header(name, v);
        }
    }
    let answer = req.send().await.map_err(|e| {
        unavailable(format!(
            "node {node} at {} did not answer: {e}",
            row.advertise_url
        ))
    })?;
    answered(answer)
}

/// The other node's answer as this node's: its status, its end-to-end
/// headers, its body streamed.
fn answered(answer: reqwest::Response) -> ApiResult<Response> {
    let mut out = Response::builder().status(answer.status().as_u16());
    let named: Vec<String> = answer
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    for (name, value) in answer.headers() {
        if end_to_end(name.as_str()) && !named.iter().any(|n| n == name.as_str()) {
            if let Ok(value) = HeaderValue::from_bytes(value.as_bytes()) {
                out = out.header(name.as_str(), value);
            }
        }
    }
    let body = Body::from_stream(answer.bytes_stream().map_err(std::io::Error::other));
    out.body(body)
        .map_err(|e| ApiError::internal(format!("forwarded answer: {e}")))
}

/// The forwarding client: no redirects, no overall timeout (a console
/// follows its op), a bounded connect.
pub(super) fn client() -> reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            crate::base::tls::client()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(std::time::Duration::from_secs(5))
                .build()
                .unwrap_or_default()
        })
        .clone()
}

/// Whether an answer's header is passed back to the caller: every one but
/// the hop-by-hop headers (RFC 9110 §7.6.1; those its `Connection` names
/// are dropped too) and the length (the body is streamed again).
fn end_to_end(name: &str) -> bool {
    !matches!(
        name,
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
    )
}
