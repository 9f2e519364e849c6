//! The live panel (SPEC §18): three hand-written files embedded in the
//! binary (it works offline, nothing is fetched from elsewhere). The page
//! itself holds no data: it signs in with a token kept in the tab's session
//! storage and reads the API like any client.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("../panel/index.html");
const SCRIPT: &str = include_str!("../panel/app.js");
const STYLE: &str = include_str!("../panel/app.css");

/// Only this origin's script, style and API: no inline code, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
    img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

/// The bytes the browser loads for the panel (page weight).
pub fn weight() -> usize {
    INDEX.len() + SCRIPT.len() + STYLE.len()
}
