//! The one error shape of the API: `{"error": {"code", "message"}}` with a
//! fitting HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// An error answer: the HTTP status plus the body's stable `code` and
/// human `message`.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status the answer carries.
    pub status: StatusCode,
    /// Machine-readable cause (`not_found`, `budget_exhausted`, ...);
    /// clients match on it, so it never changes for a given cause.
    pub code: &'static str,
    /// Lowercase human explanation, naming the op, run or limit at fault.
    pub message: String,
}

impl ApiError {
    /// An error with any status and code.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
    /// 400 `bad_request`: a malformed or invalid request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
    /// 401 `unauthorized`: no bearer token, or one the kernel does not know.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or invalid bearer token",
        )
    }
    /// 403 `forbidden`: a valid token acting outside its reach.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }
    /// 404 `not_found`: no such op, run, report or schedule (or one the
    /// caller may not see).
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    /// 409 `conflict`: the request clashes with the current state.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }
    /// 429 `limit_reached`: a per-run limit is full (live ops, pending
    /// notes, schedules).
    pub fn too_many(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "limit_reached", message)
    }
    /// An admission refused by the run's state, a budget or a live-op limit.
    pub fn refused(refusal: &crate::store::Refusal) -> Self {
        use crate::store::Refusal;
        let message = refusal.to_string();
        match refusal {
            Refusal::Limit(_) => Self::too_many(message),
            Refusal::Budget(_) => Self::new(StatusCode::CONFLICT, "budget_exhausted", message),
            Refusal::State { state, .. } => Self::run_state(*state, message),
            Refusal::NoRun(_) => Self::not_found(message),
            Refusal::NoNode(_) => Self::new(StatusCode::SERVICE_UNAVAILABLE, "no_node", message),
            Refusal::Ceiling(_) => Self::envelope_exceeded(message),
        }
    }
    /// 409 naming a run state that forbids the request.
    pub fn run_state(state: crate::runs::RunState, message: impl Into<String>) -> Self {
        use crate::runs::RunState;
        let code = match state {
            RunState::Paused => "run_paused",
            RunState::Completed => "run_completed",
            RunState::Cancelled => "run_cancelled",
            RunState::Active => "conflict",
        };
        Self::new(StatusCode::CONFLICT, code, message)
    }
    /// 403: a request over its run's envelope, or a child's envelope or
    /// budget wider than its parent's.
    pub fn envelope_exceeded(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "envelope_exceeded", message)
    }
    /// 500 `internal`: a failure of the kernel itself.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
    /// 503 `unavailable`: a dependency (Docker) cannot be reached now;
    /// retrying later may succeed.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
}

/// Seconds a client is asked to wait before retrying while the control
/// plane's database is unreachable.
pub const STORE_RETRY_AFTER_SEC: u64 = 2;

impl ApiError {
    /// 503 `store_unavailable` (with `Retry-After`): the control plane's
    /// database cannot be reached; running commands go on. Usually nothing
    /// changed, but a write whose commit's answer was lost may have
    /// happened: a start is retried with its `Idempotency-Key` (SPEC §19).
    pub fn store_unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            message,
        )
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        if let crate::store::StoreError::Unavailable(m) = &e {
            tracing::warn!(%m, "control plane unreachable");
            return ApiError::store_unavailable(format!("the control plane is unreachable: {m}"));
        }
        tracing::error!(%e, "control plane error");
        ApiError::internal(format!("control plane error: {e}"))
    }
}

impl From<sandbox::SandboxError> for ApiError {
    fn from(e: sandbox::SandboxError) -> Self {
        match e {
            sandbox::SandboxError::Invalid(m) => ApiError::bad_request(m),
            sandbox::SandboxError::Unreachable(m) => {
                ApiError::unavailable(format!("docker is unreachable: {m}"))
            }
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.code == "store_unavailable" {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(STORE_RETRY_AFTER_SEC),
            );
        }
        response
    }
}

/// The body of every error answer: `{"error": {"code", "message"}}`.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// An error's stable code and human message.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable cause (`not_found`, `budget_exhausted`,
    /// `store_unavailable`, ...): clients match on it.
    pub code: String,
    /// Lowercase human explanation.
    pub message: String,
}

/// What a handler returns: its answer or an [`ApiError`].
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_store_is_503_store_unavailable_with_retry_after() {
        let e = ApiError::from(crate::store::StoreError::Unavailable("refused".into()));
        assert_eq!(
            (e.status, e.code),
            (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable")
        );
        let r = e.into_response();
        assert_eq!(r.headers()[axum::http::header::RETRY_AFTER], "2");
        let other = ApiError::from(crate::store::StoreError::database(
            crate::store::db::Dialect::Postgres,
            "23505: dup",
        ));
        assert_eq!(other.code, "internal");
        assert!(other
            .into_response()
            .headers()
            .get(axum::http::header::RETRY_AFTER)
            .is_none());
    }
}
