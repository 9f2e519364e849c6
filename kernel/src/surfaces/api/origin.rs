//! A call's origin (SPEC §28): the surface and channel its transport
//! tells, with the principal its token proves. Read from the request's
//! context only: the kernel's own in-process calls (its `/mcp`) carry it
//! as a request extension no client can set; a client program names its
//! surface in a header (`X-Opkernel-Surface: cli|mcp|panel`), its channel
//! in another (else the `User-Agent` is the channel); no body field and
//! no tool argument can say anything of it (bodies refuse unknown
//! fields), and `schedule` is only ever the kernel's own scheduler.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::{ApiError, AppState};
use crate::origin::{Origin, Surface};
use crate::surfaces::auth::{Principal, CHANNEL_HEADER, SURFACE_HEADER};

/// The surface and channel of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Via {
    /// The surface it entered by.
    pub surface: Surface,
    /// The channel on it.
    pub channel: String,
    /// The API route it came by (`POST /v1/runs/{run}/tools/run_command`).
    pub route: String,
}

/// The origin the kernel gives a request it sends to its own router: it
/// wins over any header (a client cannot set a request extension).
#[derive(Debug, Clone)]
pub struct InProcess(pub Via);

impl Via {
    /// The origin of a call by `principal`.
    pub fn origin(&self, principal: &Principal) -> Origin {
        Origin::new(self.surface, &self.channel, &principal.name()).with_route(&self.route)
    }
}

fn header(parts: &Parts, name: &str) -> Option<String> {
    let value = parts.headers.get(name)?;
    Some(String::from_utf8_lossy(value.as_bytes()).into_owned())
}

impl FromRequestParts<AppState> for Via {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<Self, Self::Rejection> {
        let route = parts
            .extensions
            .get::<axum::extract::MatchedPath>()
            .map_or_else(|| parts.uri.path().to_owned(), |m| m.as_str().to_owned());
        let route = format!("{} {route}", parts.method);
        if let Some(InProcess(via)) = parts.extensions.get::<InProcess>() {
            return Ok(Via {
                route,
                ..via.clone()
            });
        }
        let agent = header(parts, "user-agent").unwrap_or_default();
        let surface = match header(parts, SURFACE_HEADER).as_deref() {
            None | Some("http") => Surface::Http,
            Some("cli") => Surface::Cli,
            Some("mcp") => Surface::Mcp,
            Some("panel") => Surface::Panel,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "X-Opkernel-Surface {other:?}: a client names cli, mcp or panel (without it a \
                     call is http; schedule is the kernel's own)"
                )))
            }
        };
        let channel = match surface {
            Surface::Http => agent,
            _ => header(parts, CHANNEL_HEADER).unwrap_or(agent),
        };
        Ok(Via {
            surface,
            channel: crate::origin::clean_channel(&channel),
            route,
        })
    }
}
