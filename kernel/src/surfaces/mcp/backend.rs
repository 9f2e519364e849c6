//! How the MCP server reaches the kernel: through the kernel's own HTTP
//! API, so every limit, check and message is the API's (one definition).
//! `opkernel mcp` (stdio) sends real HTTP requests to the daemon; the
//! daemon's `/mcp` sends the same requests to its own router in-process.

use std::future::Future;
use std::pin::Pin;

use serde_json::Value;

/// An API answer: HTTP status and JSON body (`Null` when it had none).
pub type Answer = (u16, Value);

type Pending<'a> = Pin<Box<dyn Future<Output = Result<Answer, String>> + Send + 'a>>;

/// Who an API request is sent for: the run token, and the channel the
/// kernel records as its origin (the MCP client, its version, the session).
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    /// The run's bearer token.
    pub token: &'a str,
    /// The MCP client and session (SPEC §28).
    pub channel: &'a str,
}

/// One API request with a bearer token.
pub trait Backend: Send + Sync + 'static {
    /// Sends `method path` for `caller`, the JSON `body` and, when given,
    /// an `Idempotency-Key` header; an error only when no answer came (an
    /// error status is an [`Answer`]).
    fn call_keyed<'a>(
        &'a self,
        caller: Caller<'a>,
        method: reqwest::Method,
        path: &'a str,
        body: Option<Value>,
        key: Option<&'a str>,
    ) -> Pending<'a>;

    /// [`Backend::call_keyed`] without a key.
    fn call<'a>(
        &'a self,
        caller: Caller<'a>,
        method: reqwest::Method,
        path: &'a str,
        body: Option<Value>,
    ) -> Pending<'a> {
        self.call_keyed(caller, method, path, body, None)
    }
}

/// The daemon over HTTP (`opkernel mcp`, stdio).
pub struct HttpBackend {
    /// The daemon's base URL (`OPKERNEL_URL`), without a trailing `/`.
    pub base: String,
    /// The HTTP client the requests go through.
    pub http: reqwest::Client,
}

impl Backend for HttpBackend {
    fn call_keyed<'a>(
        &'a self,
        caller: Caller<'a>,
        method: reqwest::Method,
        path: &'a str,
        body: Option<Value>,
        key: Option<&'a str>,
    ) -> Pending<'a> {
        Box::pin(async move {
            let mut req = self
                .http
                .request(method, format!("{}{path}", self.base))
                .bearer_auth(caller.token)
                .header(crate::surfaces::auth::SURFACE_HEADER, "mcp")
                .header(
                    crate::surfaces::auth::CHANNEL_HEADER,
                    crate::origin::clean_channel(caller.channel),
                );
            if let Some(key) = key {
                req = req.header("Idempotency-Key", key);
            }
            if let Some(body) = body {
                req = req.json(&body);
            }
            let resp = req
                .send()
                .await
                .map_err(|e| format!("cannot reach the opkernel daemon at {}: {e}", self.base))?;
            let status = resp.status().as_u16();
            let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
            Ok((
                status,
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            ))
        })
    }
}

/// The daemon's own API router, called in-process (`/mcp`).
pub struct RouterBackend {
    /// The API's router, with its state, called without a socket.
    pub router: axum::Router,
}

impl Backend for RouterBackend {
    fn call_keyed<'a>(
        &'a self,
        caller: Caller<'a>,
        method: reqwest::Method,
        path: &'a str,
        body: Option<Value>,
        key: Option<&'a str>,
    ) -> Pending<'a> {
        Box::pin(async move {
            use tower::ServiceExt;
            let method = axum::http::Method::from_bytes(method.as_str().as_bytes())
                .map_err(|e| e.to_string())?;
            let mut req = axum::http::Request::builder()
                .method(method)
                .uri(path)
                .header(
                    axum::http::header::AUTHORIZATION,
                    format!("Bearer {}", caller.token),
                )
                // the kernel's own call: its origin no client can claim
                .extension(crate::surfaces::api::origin::InProcess(
                    crate::surfaces::api::origin::Via {
                        surface: crate::origin::Surface::Mcp,
                        channel: crate::origin::clean_channel(caller.channel),
                        route: String::new(),
                    },
                ));
            if let Some(key) = key {
                req = req.header("Idempotency-Key", key);
            }
            let body = match body {
                Some(v) => {
                    req = req.header(axum::http::header::CONTENT_TYPE, "application/json");
                    axum::body::Body::from(v.to_string())
                }
                None => axum::body::Body::empty(),
            };
            let req = req.body(body).map_err(|e| e.to_string())?;
            let resp = self
                .router
                .clone()
                .oneshot(req)
                .await
                .map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20)
                .await
                .map_err(|e| e.to_string())?;
            Ok((
                status,
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            ))
        })
    }
}

/// Sends a start with one `Idempotency-Key` made for this call, again
/// with the same key while the kernel does not answer or answers `503`
/// ([`crate::surfaces::retry`]): the command runs once and the host never
/// sees the blip.
pub async fn start_once(
    backend: &dyn Backend,
    caller: Caller<'_>,
    path: &str,
    body: Value,
) -> Result<Answer, String> {
    let key = uuid::Uuid::new_v4().to_string();
    let post = || {
        let body = Some(body.clone());
        backend.call_keyed(caller, reqwest::Method::POST, path, body, Some(&key))
    };
    let status = |a: &Result<Answer, String>| a.as_ref().ok().map(|(s, _)| *s);
    crate::surfaces::retry::until_answered(post, status).await
}
