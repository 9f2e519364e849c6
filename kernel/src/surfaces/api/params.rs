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
