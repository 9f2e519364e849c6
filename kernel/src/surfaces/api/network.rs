//! A live run's egress allow list (SPEC §27): `POST /v1/runs/{run}/network`.
//! A run token narrows its own run's list (and with it its descendants');
//! the operator sets any list, wider too. New connections follow at once:
//! the proxy reads the list at each connection.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use super::{authorize_run, ApiError, ApiResult, AppState, Body, Scope, Seg};
use crate::egress::{AllowList, Network};
use crate::store::NetChanged;
use crate::surfaces::auth::Principal;
use crate::surfaces::requests::ChangeNetwork;
use crate::surfaces::views::NetworkView;

/// `POST /v1/runs/{run}/network`: the run's allow list from now on.
#[utoipa::path(
    post,
    path = "/v1/runs/{run}/network",
    tag = "runs",
    params(super::params::RunPath),
    request_body = ChangeNetwork,
    responses((status = 200, description = "Changed", body = NetworkView)),
)]
pub async fn change(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    Body(req): Body<ChangeNetwork>,
) -> ApiResult<Json<NetworkView>> {
    authorize_run(&k, &principal, &run, Scope::Own).await?;
    let asked = AllowList::parse(&req.allow).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let (by, may_widen) = match &principal {
        Principal::Operator => ("operator".to_owned(), true),
        Principal::Run(own) => (format!("run:{own}"), false),
    };
    match k
        .store
        .change_allow_list(&run, asked, &by, may_widen)
        .await?
    {
        NetChanged::Changed { allow, narrowed } => {
            for r in std::iter::once(&run).chain(&narrowed) {
                k.forget_run(r);
            }
            Ok(Json(NetworkView {
                run_id: run,
                allow,
                narrowed,
            }))
        }
        NetChanged::NoRun => Err(ApiError::not_found(format!("no run {run}"))),
        NetChanged::NotAllowList(now) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_allow_list",
            format!(
                "run {run}'s network is {now}: only an allow list changes while a run lives \
                 (its container was made for its network)"
            ),
        )),
        NetChanged::Wider(why) => Err(ApiError::envelope_exceeded(format!(
            "network: allow {why} (a run only narrows its own list; the operator may widen \
             it within its parent's)"
        ))),
    }
}

/// Refuses an envelope whose allow list this kernel cannot serve.
pub(super) fn check_served(
    k: &AppState,
    envelope: Option<&crate::runs::Envelope>,
) -> ApiResult<()> {
    let listed = envelope.is_some_and(|e| matches!(e.network, Network::Allow(_)));
    if listed && !k.config.egress.on {
        return Err(ApiError::bad_request(
            "envelope network: this kernel serves no allow lists (OPKERNEL_EGRESS=off)",
        ));
    }
    Ok(())
}
