//! The settings' reference, rendered from the table: the Markdown of
//! `docs/settings.md` (between its markers) and `opkernel settings`.

use super::table::ALL;
use super::{OldUnit, Scope, Setting};

/// Where the generated table starts in `docs/settings.md`.
pub const BEGIN: &str = "<!-- settings table: generated from kernel/src/app/settings/table.rs -->";
/// Where it ends.
pub const END: &str = "<!-- end of settings table -->";

fn scope(s: &Setting) -> &'static str {
    match s.scope {
        Scope::Serve => "serve",
        Scope::Client => "client",
        Scope::Both => "serve, client",
        Scope::Drills => "drills",
    }
}

fn old_name(s: &Setting) -> String {
    match s.alias {
        None => String::new(),
        Some(a) => {
            let unit = match a.unit {
                OldUnit::Millis => " (whole ms)",
                OldUnit::Seconds => " (whole s)",
                OldUnit::Bytes => "",
            };
            format!("`{}`{unit}", a.env)
        }
    }
}

fn cell(text: &str) -> String {
    if text.is_empty() {
        "—".to_owned()
    } else {
        format!("`{text}`")
    }
}

/// The Markdown table, one row per setting.
pub fn markdown() -> String {
    let mut out = String::from(
        "| Variable | Flag | Kind | Default | Read by | What it does | Old name (read until 0.2.0) |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for s in ALL {
        let flag = s.flag.map(|f| format!("--{f}")).unwrap_or_default();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} |\n",
            s.env,
            cell(&flag),
            s.kind.name(),
            cell(s.default),
            scope(s),
            s.doc_line().replace('|', "\\|"),
            old_name(s),
        ));
    }
    out
}

/// `docs` with the text between its markers replaced by [`markdown`];
/// `None` when the markers are missing.
pub fn refreshed(docs: &str) -> Option<String> {
    let start = docs.find(BEGIN)? + BEGIN.len();
    let end = docs[start..].find(END)? + start;
    Some(format!(
        "{}\n{}{}",
        &docs[..start],
        markdown(),
        &docs[end..]
    ))
}

/// The plain listing of `opkernel settings`: each variable, its default
/// and what it does.
pub fn listing() -> String {
    let mut out = String::new();
    for s in ALL {
        let default = if s.default.is_empty() {
            "(none)"
        } else {
            s.default
        };
        out.push_str(&format!("{} [{}] = {default}\n", s.env, s.kind.name()));
        out.push_str(&format!("    {}\n", s.doc_line()));
        if let Some(a) = s.alias {
            out.push_str(&format!("    old name: {}\n", a.env));
        }
    }
    out
}
