//! The live panel (SPEC §18): hand-written files embedded in the binary (it
//! works offline, nothing is fetched from elsewhere): the page, its
//! stylesheet and its script as ES modules (`main.js` imports the others).
//! The page itself holds no data: it signs in with a token kept in the
//! tab's session storage and reads the API like any client.

use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::ApiError;

const INDEX: &str = include_str!("../panel/index.html");

const JS: &str = "text/javascript; charset=utf-8";

/// A file served under `/ui/`.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const fn module(name: &'static str, body: &'static str) -> Asset {
    Asset {
        name,
        content_type: JS,
        body,
    }
}

/// Every file of `panel/` but the page: its stylesheet, its entry module
/// and the modules that entry imports (`views.js` holds JSDoc types only).
const ASSETS: &[Asset] = &[
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("../panel/app.css"),
    },
    module("main.js", include_str!("../panel/main.js")),
    module("api.js", include_str!("../panel/api.js")),
    module("dom.js", include_str!("../panel/dom.js")),
    module("errors.js", include_str!("../panel/errors.js")),
    module("session.js", include_str!("../panel/session.js")),
    module("live.js", include_str!("../panel/live.js")),
    module("start.js", include_str!("../panel/start.js")),
    module("runs.js", include_str!("../panel/runs.js")),
    module("approvals.js", include_str!("../panel/approvals.js")),
    module("schedules.js", include_str!("../panel/schedules.js")),
    module("containers.js", include_str!("../panel/containers.js")),
    module("views.js", include_str!("../panel/views.js")),
];

/// Only this origin's scripts, style and API: no inline code, no framing.
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

/// `GET /`: the page.
pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/{file}`: the stylesheet or a script module; any other name is 404.
pub async fn file(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => asset(a.content_type, a.body),
        None => ApiError::not_found(format!("no panel file {name}")).into_response(),
    }
}

/// The bytes the browser may load for the panel (page weight): the page
/// and every file under `/ui/`.
pub fn weight() -> usize {
    INDEX.len() + ASSETS.iter().map(|a| a.body.len()).sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::{weight, ASSETS, INDEX};

    /// The panel stays a light page: today about 50 KB in all.
    const MAX_WEIGHT: usize = 96 * 1024;

    #[test]
    fn every_panel_file_is_served_and_weighed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/surfaces/panel");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "index.html")
            .collect();
        files.sort();
        let mut served: Vec<String> = ASSETS.iter().map(|a| a.name.to_owned()).collect();
        served.sort();
        assert_eq!(files, served, "panel/ and the files served under /ui/");
        let on_disk: usize = ASSETS
            .iter()
            .map(|a| std::fs::read_to_string(dir.join(a.name)).unwrap().len())
            .sum();
        assert_eq!(weight(), INDEX.len() + on_disk);
        assert!(weight() < MAX_WEIGHT, "the panel weighs {} bytes", weight());
    }

    /// Each relative import of a module names a module served next to it,
    /// and the page loads its entry as a module, with no inline script.
    #[test]
    fn modules_import_served_modules_only() {
        let mut imports = 0;
        for a in ASSETS.iter().filter(|a| a.name.ends_with(".js")) {
            for line in a.body.lines().filter(|l| l.starts_with("import ")) {
                let target = line
                    .rsplit_once(" from \"./")
                    .and_then(|(_, t)| t.strip_suffix("\";"))
                    .unwrap_or_else(|| panic!("{}: an import not of ./<module>: {line}", a.name));
                assert!(
                    ASSETS
                        .iter()
                        .any(|b| b.name == target && b.content_type == super::JS),
                    "{} imports {target}, which is not served",
                    a.name
                );
                imports += 1;
            }
        }
        assert!(imports > 10, "only {imports} imports found");
        assert!(INDEX.contains(r#"<script type="module" src="/ui/main.js"></script>"#));
        assert_eq!(INDEX.matches("<script").count(), 1, "one script: the entry");
        assert!(INDEX.contains(r#"href="/ui/app.css""#));
    }
}
