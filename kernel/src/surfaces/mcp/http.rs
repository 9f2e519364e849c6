//! The two MCP transports: streamable HTTP at `/mcp` on the daemon (the run
//! token as bearer; legacy 2025 sessions per `Mcp-Session-Id` and the
//! stateless 2026-07-28 revision), and stdio for `opkernel mcp --run RUN`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;

use super::backend::{self, Backend, HttpBackend, RouterBackend};
use super::delivery::{LedgerOf, TrackedBody, TrackedWriter};
use super::{tools_from_api, OpkernelMcp, RunAuth, Sessions};
use crate::base::tokens::{constant_time_eq, token_sha256};
use crate::runtime::kernel::Kernel;
use crate::surfaces::api::ApiError;
use crate::surfaces::views::{PrincipalKind, ToolsView, WhoAmI};

/// What `/mcp`'s layer keeps: the kernel, and which run each legacy
/// session (`Mcp-Session-Id`) belongs to.
#[derive(Clone)]
struct Gate {
    k: Arc<Kernel>,
    sessions: Arc<crate::base::sync::Lock<std::collections::HashMap<String, String>>>,
    handlers: Sessions,
}

/// Authenticates every `/mcp` request: a run token only (the run comes
/// from the token, never from tool arguments); the operator token names no
/// run and is refused. A legacy session is bound to the run that opened
/// it: another run's token cannot use, follow or close it.
async fn require_run_token(State(gate): State<Gate>, mut req: Request, next: Next) -> Response {
    let k = &gate.k;
    let token = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.len() <= 256)
        .map(str::to_owned);
    let Some(token) = token else {
        return ApiError::unauthorized().into_response();
    };
    let presented = token_sha256(&token);
    if constant_time_eq(
        presented.as_bytes(),
        token_sha256(&k.operator_token).as_bytes(),
    ) {
        return ApiError::forbidden(
            "MCP acts as one run: connect with that run's token (the operator token names no run)",
        )
        .into_response();
    }
    let run = match k.store.run_for_token(&presented).await {
        Ok(Some(run)) => run,
        Ok(None) => return ApiError::unauthorized().into_response(),
        Err(e) => return ApiError::from(e).into_response(),
    };
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(id) = &session {
        if gate
            .sessions
            .lock()
            .get(id)
            .is_some_and(|owner| *owner != run)
        {
            return ApiError::forbidden("this MCP session belongs to another run").into_response();
        }
    }
    let closing = req.method() == axum::http::Method::DELETE;
    if let (true, Some(id)) = (closing, &session) {
        // a clean close: the session has what it was served
        OpkernelMcp::close_session(&gate.handlers, id).await;
    }
    req.extensions_mut().insert(RunAuth {
        token,
        run: run.clone(),
        channel: String::new(),
    });
    let mut resp = next.run(req).await;
    if let Some(id) = &session {
        resp = track_delivery(resp, gate.handlers.clone(), id.clone());
    }
    // the official Python client counts only 200/204 as a closed session
    if closing && resp.status() == axum::http::StatusCode::ACCEPTED {
        *resp.status_mut() = axum::http::StatusCode::NO_CONTENT;
    }
    match (&session, resp.headers().get("mcp-session-id")) {
        // a session opened by this request: it is this run's
        (None, Some(id)) => {
            if let Ok(id) = id.to_str() {
                gate.sessions.lock().insert(id.to_owned(), run);
            }
        }
        (Some(id), _) if closing => {
            gate.sessions.lock().remove(id);
        }
        _ => {}
    }
    resp
}

/// A legacy session's SSE response (a POST's stream, or a GET stream):
/// its session learns which reports were written out to its client.
fn track_delivery(resp: Response, handlers: Sessions, session: String) -> Response {
    let sse = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !sse {
        return resp;
    }
    let ledger: LedgerOf = Arc::new(move || OpkernelMcp::ledger_of(&handlers, &session));
    resp.map(|body| {
        axum::body::Body::from_stream(TrackedBody::new(body.into_data_stream(), ledger))
    })
}

/// How often sessions rmcp closed without a `DELETE` (idle past its
/// keep-alive, 5 minutes) leave this layer's maps.
const SESSION_SWEEP: std::time::Duration = std::time::Duration::from_secs(30);

/// Keeps the session maps bounded by open sessions (SPEC §21): a client
/// that vanished without `DELETE` leaves rmcp's manager when idle, and
/// then here. Its unacknowledged reports are served again to the run's
/// next reader, never lost.
fn spawn_session_sweep(gate: Gate, manager: Arc<LocalSessionManager>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SESSION_SWEEP);
        loop {
            tick.tick().await;
            // ours first: a session opened after this snapshot is in
            // rmcp's set below, never taken for a closed one
            let ours: Vec<String> = gate.sessions.lock().keys().cloned().collect();
            let handled: Vec<String> = gate.handlers.lock().keys().cloned().collect();
            let open: std::collections::HashSet<String> = manager
                .sessions
                .read()
                .await
                .keys()
                .map(|id| id.to_string())
                .collect();
            let mut sessions = gate.sessions.lock();
            for id in ours.iter().filter(|id| !open.contains(*id)) {
                sessions.remove(id);
            }
            drop(sessions);
            let mut handlers = gate.handlers.lock();
            for id in handled.iter().filter(|id| !open.contains(*id)) {
                handlers.remove(id);
            }
        }
    });
}

/// `/mcp` on the daemon, served by the handler over the API router `api`
/// (called in-process).
pub fn routes(k: Arc<Kernel>, api: axum::Router) -> axum::Router {
    let tools = match tools_from_api(&crate::surfaces::tools::tool_definitions(&k.config)) {
        Ok(tools) => Arc::new(tools),
        Err(e) => {
            tracing::error!(%e, "MCP tool definitions are malformed; /mcp serves none");
            Arc::new(Vec::new())
        }
    };
    let backend: Arc<dyn Backend> = Arc::new(RouterBackend { router: api });
    let mut config = StreamableHttpServerConfig::default();
    // the Host check guards a loopback listener against DNS rebinding; a
    // kernel exposed on purpose (--allow-remote) is reached by other names
    if !k.config.listen.ip().is_loopback() {
        config = config.disable_allowed_hosts();
    }
    let handlers: Sessions = Arc::default();
    let manager = Arc::new(LocalSessionManager::default());
    let gate = Gate {
        k,
        sessions: Arc::default(),
        handlers: handlers.clone(),
    };
    spawn_session_sweep(gate.clone(), manager.clone());
    let service = StreamableHttpService::new(
        {
            let handlers = handlers.clone();
            move || {
                Ok(OpkernelMcp::new(backend.clone(), tools.clone(), None)
                    .with_sessions(handlers.clone()))
            }
        },
        manager,
        config,
    );
    axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(
            gate,
            require_run_token,
        ))
}

/// `opkernel mcp --run RUN`: the stdio transport, talking to the daemon at
/// `OPKERNEL_URL` with `OPKERNEL_TOKEN`. A report is acknowledged once its
/// answer was flushed to stdout and the host's next call (or a clean
/// close of its end) followed.
pub async fn serve_stdio(base: String, token: String, run: String) -> anyhow::Result<i32> {
    let backend = HttpBackend {
        base: base.trim_end_matches('/').to_owned(),
        http: crate::base::tls::client().build()?,
    };
    // MCP acts as one run, with that run's own token: never the operator
    // token (it would reach every run), never an ancestor's
    let caller = backend::Caller {
        token: &token,
        channel: "opkernel mcp (starting)",
    };
    let (status, me) = backend
        .call(caller, reqwest::Method::GET, "/v1/whoami", None)
        .await
        .map_err(anyhow::Error::msg)?;
    if status != 200 {
        anyhow::bail!(
            "the daemon refused this token: {} (HTTP {status})",
            me["error"]["message"].as_str().unwrap_or("refused")
        );
    }
    let me: WhoAmI = serde_json::from_value(me)
        .map_err(|e| anyhow::anyhow!("unexpected answer from GET /v1/whoami: {e}"))?;
    match (me.principal, me.run_id) {
        (PrincipalKind::Run, Some(own)) if own == run => {}
        (PrincipalKind::Run, Some(own)) => {
            anyhow::bail!("OPKERNEL_TOKEN is run {own}'s token, not run {run}'s")
        }
        _ => anyhow::bail!(
            "opkernel mcp acts as one run: set OPKERNEL_TOKEN to run {run}'s token \
             (`opkernel token --run {run}`), not the operator token"
        ),
    }
    let (status, api_tools) = backend
        .call(caller, reqwest::Method::GET, "/v1/tools", None)
        .await
        .map_err(anyhow::Error::msg)?;
    if status != 200 {
        anyhow::bail!("cannot read the daemon's tool definitions (HTTP {status})");
    }
    let api_tools: ToolsView = serde_json::from_value(api_tools)
        .map_err(|e| anyhow::anyhow!("unexpected answer from GET /v1/tools: {e}"))?;
    let tools = Arc::new(tools_from_api(&api_tools).map_err(anyhow::Error::msg)?);
    let handler = OpkernelMcp::new(
        Arc::new(backend),
        tools,
        Some(RunAuth {
            token,
            run,
            channel: String::new(),
        }),
    );
    let ledger = handler.ledger();
    let stdout = TrackedWriter::new(tokio::io::stdout(), Arc::new(move || Some(ledger.clone())));
    let service = match handler.clone().serve((tokio::io::stdin(), stdout)).await {
        Ok(service) => service,
        // the client went away before its first request: nothing served
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(0),
        Err(e) => anyhow::bail!("MCP session failed to start: {e}"),
    };
    match service.waiting().await {
        // the client closed its end: it has what was written out to it
        Ok(rmcp::service::QuitReason::Closed) => handler.finish().await,
        other => tracing::warn!(
            ?other,
            "MCP stdio session ended abnormally; its last report is served again"
        ),
    }
    Ok(0)
}
