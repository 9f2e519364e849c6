//! The HTTP JSON API (axum): bearer auth, strict request parsing into
//! closed types, and one error shape. Handlers live in submodules by concern.

mod console;
mod containers;
mod daemon;
mod drill_hooks;
pub mod error;
mod events;
mod fanout;
mod files;
mod files_range;
mod files_tools;
mod inspect;
mod interactive;
pub mod metrics;
mod network;
mod nodes;
pub mod openapi;
mod ops;
pub mod origin;
pub mod panel;
mod params;
mod proxy;
pub mod reports;
mod run_hop;
mod runs;
pub mod schedules;
pub(crate) mod schema;
mod snapshots;
mod streams_doc;
mod waits;
mod workspaces;

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;

use crate::base::tokens::{constant_time_eq, token_sha256};
use crate::runtime::kernel::Kernel;
use crate::surfaces::auth::Principal;
pub use error::{ApiError, ApiResult};

/// Request bodies above this size are refused (413).
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// The state every handler shares: the one kernel.
pub type AppState = Arc<Kernel>;

/// The API's routes (the panel's assets among them); MCP is mounted
/// beside them by `crate::app::serve::app`.
pub fn router(kernel: Arc<Kernel>) -> Router {
    let mut app = Router::new()
        .route("/", get(panel::index))
        .route("/ui/{file}", get(panel::file))
        .route("/metrics", get(metrics::metrics))
        .route("/v1/health", get(daemon::health))
        .route("/v1/openapi.json", get(openapi::openapi_json))
        .route("/v1/whoami", get(daemon::whoami))
        .route("/v1/tools", get(daemon::tools))
        .merge(run_routes())
        .merge(workspace_routes(&kernel))
        .merge(op_routes())
        .merge(operator_routes());
    if kernel.config.drills.on {
        app = app.merge(drill_hooks::routes());
    }
    app.layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .with_state(kernel)
}

/// A run's own endpoints: its state, events, reports and schedules.
fn run_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/runs", post(runs::create_run).get(runs::list_runs))
        .route("/v1/runs/{run}", get(runs::get_run))
        .route("/v1/runs/{run}/pause", post(runs::pause))
        .route("/v1/runs/{run}/resume", post(runs::resume))
        .route("/v1/runs/{run}/cancel", post(runs::cancel))
        .route("/v1/runs/{run}/complete", post(runs::complete))
        .route("/v1/runs/{run}/usage", post(runs::usage))
        .route("/v1/runs/{run}/network", post(network::change))
        .route("/v1/runs/{run}/events", get(events::events))
        .route("/v1/runs/{run}/events/stream", get(events::events_stream))
        .route("/v1/runs/{run}/reports", get(events::reports))
        .route("/v1/runs/{run}/report", get(reports::report))
        .route("/v1/runs/{run}/report/{report_id}/ack", post(reports::ack))
        .route("/v1/runs/{run}/notes", post(reports::note))
        .route("/v1/runs/{run}/finish", post(reports::finish))
        .route(
            "/v1/runs/{run}/schedules",
            post(schedules::create).get(schedules::list),
        )
        .route(
            "/v1/runs/{run}/schedules/{id}",
            get(schedules::get_one).delete(schedules::delete),
        )
        .route(
            "/v1/runs/{run}/schedules/{id}/pause",
            post(schedules::pause),
        )
        .route(
            "/v1/runs/{run}/schedules/{id}/resume",
            post(schedules::resume),
        )
        .route("/v1/schedules", get(schedules::list_all))
        .route("/v1/images", get(workspaces::images))
}

/// A run's workspace: its files, archives and snapshots, answered by the
/// node that holds it (`run_hop`).
fn workspace_routes(kernel: &AppState) -> Router<AppState> {
    Router::new()
        .route(
            "/v1/runs/{run}/files/{*path}",
            get(files::get_file)
                .put(files::put_file)
                .delete(files::delete_file),
        )
        .route(
            "/v1/runs/{run}/tools/read_file",
            post(files_tools::read_file),
        )
        .route(
            "/v1/runs/{run}/tools/write_file",
            post(files_tools::write_file),
        )
        .route("/v1/runs/{run}/tools/list_dir", post(files_tools::list_dir))
        .route(
            "/v1/runs/{run}/archive/{*path}",
            get(files::get_archive).put(files::put_archive),
        )
        .route(
            "/v1/runs/{run}/snapshots",
            post(snapshots::make).get(snapshots::list),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            kernel.clone(),
            run_hop::on_its_node,
        ))
}

/// The tools and an op's own endpoints.
fn op_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/tools/run_command", post(ops::run_oneshot))
        .route("/v1/runs/{run}/tools/run_command", post(ops::run_command))
        .route(
            "/v1/runs/{run}/tools/kill_operation",
            post(ops::kill_operation),
        )
        .route(
            "/v1/runs/{run}/tools/write_stdin",
            post(interactive::write_stdin),
        )
        .route(
            "/v1/runs/{run}/tools/read_output",
            post(interactive::read_output),
        )
        .route(
            "/v1/runs/{run}/tools/resize_tty",
            post(interactive::resize_tty),
        )
        .route("/v1/operations/{id}/nudge", post(interactive::nudge))
        .route("/v1/operations/{id}", get(ops::get_operation))
        .route("/v1/operations/{id}/approve", post(ops::approve))
        .route("/v1/operations/{id}/deny", post(ops::deny))
        .route("/v1/operations/{id}/log", get(console::raw_log))
        .route("/v1/operations/{id}/console", get(console::console))
        .route("/v1/approvals", get(ops::approvals))
        .route("/v1/ops", get(ops::list_ops))
}

/// The operator's views of the host: containers, nodes, the reaper.
fn operator_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/containers", get(containers::containers))
        .route("/v1/containers/{id}", get(inspect::inspect))
        .route("/v1/reap", post(containers::reap))
        .route("/v1/nodes", get(nodes::nodes))
        .route("/v1/nodes/{name}/drain", post(nodes::drain))
        .route("/v1/nodes/{name}/activate", post(nodes::activate))
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        kernel: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(ApiError::unauthorized)?;
        let token = header
            .strip_prefix("Bearer ")
            .ok_or_else(ApiError::unauthorized)?
            .trim();
        if token.is_empty() || token.len() > 256 {
            return Err(ApiError::unauthorized());
        }
        let presented = token_sha256(token);
        if constant_time_eq(
            presented.as_bytes(),
            token_sha256(&kernel.operator_token).as_bytes(),
        ) {
            return Ok(Principal::Operator);
        }
        match kernel.store.run_for_token(&presented).await? {
            Some(run) => Ok(Principal::Run(run)),
            None => Err(ApiError::unauthorized()),
        }
    }
}

/// JSON body extractor whose rejections use the API's error shape.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Body(v)),
            Err(JsonRejection::BytesRejection(e)) => Err(ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("request body refused: {e} (limit {MAX_BODY_BYTES} bytes)"),
            )),
            Err(e) => Err(ApiError::bad_request(format!(
                "invalid JSON body: {}",
                e.body_text()
            ))),
        }
    }
}

/// Parses a `run_command` body exactly as the endpoint does (for tests and
/// fuzzing of the request parser).
pub fn parse_run_command(body: &[u8]) -> Result<crate::surfaces::requests::RunCommand, String> {
    serde_json::from_slice(body).map_err(|e| e.to_string())
}

/// How far a run token reaches for an action (SPEC §14): its own run
/// alone (run commands, drain and ack reports, notes, finish, complete,
/// usage, children), or also its descendants (list, state, console,
/// events, kill, pause, resume, cancel). The operator reaches every run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The token's own run only.
    Own,
    /// The token's run and every run whose chain contains it.
    Subtree,
}

/// Whether `principal` may act on `run_id` within `scope`.
pub async fn may_act(
    kernel: &Kernel,
    principal: &Principal,
    run_id: &str,
    scope: Scope,
) -> ApiResult<bool> {
    if principal.may_act_on(run_id) {
        return Ok(true);
    }
    let Principal::Run(own) = principal else {
        return Ok(false);
    };
    if scope == Scope::Own {
        return Ok(false);
    }
    Ok(kernel
        .run_meta(run_id)
        .await?
        .is_some_and(|meta| meta.chain.iter().any(|a| a == own)))
}

/// Checks a run id from a path and that the caller may act on it.
pub async fn authorize_run(
    kernel: &Kernel,
    principal: &Principal,
    run_id: &str,
    scope: Scope,
) -> ApiResult<()> {
    sandbox::profile::validate_run_id(run_id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    if may_act(kernel, principal, run_id, scope).await? {
        return Ok(());
    }
    let own_descendant = match principal {
        Principal::Run(own) => kernel
            .run_meta(run_id)
            .await?
            .is_some_and(|meta| meta.chain.contains(own)),
        Principal::Operator => false,
    };
    Err(ApiError::forbidden(if own_descendant {
        "a run token acts on its descendants' state, never on their reports, notes, commands or completion"
    } else {
        "this token acts on another run"
    }))
}

/// Refuses (403) anything but the operator token: approve and deny,
/// one-shot commands, containers, reaping and the drill hooks.
pub fn require_operator(principal: &Principal) -> ApiResult<()> {
    match principal {
        Principal::Operator => Ok(()),
        Principal::Run(_) => Err(ApiError::forbidden(
            "this endpoint needs the operator token",
        )),
    }
}

/// Loads an op the caller may see (its run's or a descendant's); any
/// other run's op is "not found".
pub async fn visible_op(
    kernel: &Kernel,
    principal: &Principal,
    id: &str,
) -> ApiResult<crate::store::Op> {
    sandbox::shim::validate_op_id(id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    match kernel.store.get_op(id).await? {
        Some(op) if may_act(kernel, principal, &op.run_id, Scope::Subtree).await? => Ok(op),
        _ => Err(ApiError::not_found(format!("no operation {id}"))),
    }
}

/// Query-string extractor whose rejections use the API's error shape.
pub struct Params<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Params(q.0))
            .map_err(|e| ApiError::bad_request(format!("invalid query string: {}", e.body_text())))
    }
}

/// Path-segment extractor whose rejections use the API's error shape.
pub struct Seg<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Seg<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Seg(p.0))
            .map_err(|e| ApiError::bad_request(format!("invalid path: {}", e.body_text())))
    }
}
