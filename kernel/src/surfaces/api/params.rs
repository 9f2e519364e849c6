//! The path parameters of the API document, each declared once (the
//! handlers read them with `Seg`/`Params`; these only describe them).

/// `{run}`: a run id.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct RunPath {
    /// A run id
    #[param(pattern = r"^[A-Za-z0-9_.-]{1,64}$")]
    run: String,
}

/// `{run}` and `{path}` of a files call (SPEC §26).
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct FilePath {
    /// A run id
    #[param(pattern = r"^[A-Za-z0-9_.-]{1,64}$")]
    pub run: String,
    /// The container path without its leading `/` (a trailing `/` lists a
    /// directory)
    pub path: String,
}

/// `{id}` of an operation.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct OpPath {
    /// An operation id (a lowercase UUID)
    #[param(pattern = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    id: String,
}

/// `{id}` of a schedule (beside its run's `{run}`).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct SchedulePath {
    /// A schedule id (a UUID)
    #[param(
        pattern = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    id: String,
}

/// `{name}` of a cluster node.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct NodePath {
    /// The node's name
    name: String,
}

/// The `Idempotency-Key` header, checked (none: `None`).
pub(super) fn idempotency_key(headers: &axum::http::HeaderMap) -> super::ApiResult<Option<String>> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 128 && k.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| {
            super::ApiError::bad_request("Idempotency-Key must be 1-128 printable ASCII characters")
        })?;
    // the kernel's own keys (a schedule's due times) are not the caller's
    if key.starts_with("schedule:") {
        return Err(super::ApiError::bad_request(
            "Idempotency-Key may not start with \"schedule:\" (reserved for schedules)",
        ));
    }
    Ok(Some(key.to_owned()))
}
