//! The size limits of the code (issue "one control layer…"): no production
//! file of the workspace over 600 lines, no production function over 80.
//! Test files (`*_tests.rs`, `tests/`), build scripts' helpers and the
//! inline test modules that end a file are not production code.

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 80;

pub(crate) fn production_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && name != "tests" {
                production_files(&path, out);
            }
        } else if name.ends_with(".rs") && !name.ends_with("_tests.rs") {
            out.push(path);
        }
    }
}

/// The lines of a file before its inline test module.
pub(crate) fn production_lines(text: &str) -> Vec<&str> {
    text.lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .collect()
}

/// Each function's name and length: from its `fn` line to the closing
/// brace at the same indentation (rustfmt's layout).
fn functions<'a>(lines: &[&'a str]) -> Vec<(&'a str, usize)> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let code = line.trim_start();
        let indent = line.len() - code.len();
        let after = code
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ")
            .trim_start_matches("async ")
            .trim_start_matches("unsafe ");
        if let Some(rest) = after.strip_prefix("fn ") {
            let name = rest.split(['(', '<']).next().unwrap_or(rest);
            let close = format!("{}}}", " ".repeat(indent));
            let end = (i..lines.len())
                .find(|&j| lines[j] == close || (j == i && line.trim_end().ends_with(';')))
                .unwrap_or(i);
            found.push((name, end - i + 1));
            i = end;
        }
        i += 1;
    }
    found
}

#[test]
fn no_production_file_or_function_is_too_long() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for crate_dir in [
        "kernel/src",
        "domain/src",
        "sandbox/src",
        "sandbox/shim/src",
    ] {
        production_files(&root.join(crate_dir), &mut files);
    }
    assert!(
        files.len() > 40,
        "the scan found only {} files",
        files.len()
    );
    let mut over = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let lines = production_lines(&text);
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        if lines.len() > MAX_FILE_LINES {
            over.push(format!("{shown}: {} lines", lines.len()));
        }
        for (name, len) in functions(&lines) {
            if len > MAX_FN_LINES {
                over.push(format!("{shown}: fn {name} is {len} lines"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "over the limits ({MAX_FILE_LINES} lines a file, {MAX_FN_LINES} a function):\n{}",
        over.join("\n")
    );
}

#[test]
fn the_scanner_measures_functions() {
    let text = "fn a() {\n    x;\n}\n\n    pub async fn b(\n        y: u8,\n    ) {\n    }\n";
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(functions(&lines), [("a", 3), ("b", 4)]);
}

/// Observers are spawned from one place: the control layer (after the
/// store transaction that makes an op observable), plus recovery and the
/// watchdog inside `observer/` and the serve loop that starts them.
#[test]
fn observers_are_spawned_only_by_the_control_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    production_files(&src, &mut files);
    let mut found = Vec::new();
    for file in &files {
        let shown = file
            .strip_prefix(&src)
            .unwrap_or(file)
            .display()
            .to_string();
        // the control layer (a cluster node's hand-off included); recovery
        // and the watchdog (observer/)
        let allowed = shown == "runtime/control.rs" || shown.starts_with("runtime/observer/");
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for (n, line) in production_lines(&text).iter().enumerate() {
            let code = line.trim_start();
            if !allowed && !code.starts_with("//") && code.contains("observer::spawn") {
                found.push(format!("{shown}:{}", n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "observers spawned outside the control layer: {found:?}"
    );
}
/// The panel's files (`panel/`: page, stylesheet, script modules): short
/// lines, modules of a readable size.
const MAX_PANEL_LINE_CHARS: usize = 120;
const MAX_PANEL_FILE_LINES: usize = 300;

/// What a panel file breaks: a line over the width, the file over its
/// length, and in a script an error swallowed (an empty `catch`, an empty
/// handler such as a rejection's `() => {}`) or put where the page does
/// not show it (`alert`, the console).
fn panel_findings(name: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() > MAX_PANEL_FILE_LINES {
        found.push(format!("{name}: {} lines", lines.len()));
    }
    for (n, line) in lines.iter().enumerate() {
        let width = line.chars().count();
        if width > MAX_PANEL_LINE_CHARS {
            found.push(format!("{name}:{}: {width} characters", n + 1));
        }
    }
    if !name.ends_with(".js") {
        return found;
    }
    // the code without comment lines, trailing comments and spaces
    let code: String = lines
        .iter()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| l.split(" // ").next().unwrap_or(l))
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect();
    let empty_catch = code.match_indices("catch").any(|(at, _)| {
        let rest = &code[at + "catch".len()..];
        let body = match rest.strip_prefix('(') {
            Some(bound) => bound.split_once(')').map_or("", |(_, after)| after),
            None => rest,
        };
        body.starts_with("{}")
    });
    for (bad, what) in [
        (empty_catch, "an empty catch"),
        (code.contains("=>{}"), "an empty handler `() => {}`"),
        (code.contains("alert("), "alert()"),
        (code.contains("console."), "the console"),
    ] {
        if bad {
            found.push(format!("{name}: {what} (show errors in the page)"));
        }
    }
    found
}

#[test]
fn panel_files_have_short_lines_and_show_errors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/surfaces/panel");
    let mut names = Vec::new();
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(entry.path()).unwrap();
        found.extend(panel_findings(&name, &text));
        names.push(name);
    }
    let modules = names.iter().filter(|n| n.ends_with(".js")).count();
    assert!(modules > 5, "the scan found {modules} panel modules");
    assert!(
        names.iter().any(|n| n == "index.html") && names.iter().any(|n| n == "app.css"),
        "{names:?}"
    );
    assert!(
        found.is_empty(),
        "panel files over the limits ({MAX_PANEL_LINE_CHARS} characters a line, \
         {MAX_PANEL_FILE_LINES} lines a file) or swallowing errors:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_panel_scanner_finds_what_it_should() {
    let long = format!("const a = \"{}\";\n", "é".repeat(MAX_PANEL_LINE_CHARS));
    let at_limit = format!("{}\n", "é".repeat(MAX_PANEL_LINE_CHARS));
    let many = "x\n".repeat(MAX_PANEL_FILE_LINES + 1);
    let cases: [(&str, &str, usize); 13] = [
        ("a.js", &long, 1),
        ("a.css", &long, 1),
        ("a.js", &at_limit, 0),
        ("a.html", &many, 1),
        ("a.js", "try { f(); } catch (e) {}\n", 1),
        ("a.js", "try { f(); } catch {\n}\n", 1),
        ("a.js", "try { f(); } catch (e) {\n  // dropped\n}\n", 1),
        ("a.js", "try { f(); } catch (e) { show(e); }\n", 0),
        ("a.js", "p.then(ok, () => {});\n", 1),
        ("a.js", "p.catch((e) => alert(e.message));\n", 1),
        ("a.js", "console.warn(e);\n", 1),
        (
            "a.js",
            "r.json().catch(() => null); // not JSON: the status says it\n",
            0,
        ),
        ("a.css", "a { b: c; }\n", 0),
    ];
    for (name, text, n) in cases {
        let found = panel_findings(name, text);
        assert_eq!(found.len(), n, "{name} {text:?}: {found:?}");
    }
}

/// The dependency names in a manifest's `[dependencies]` table.
fn dependencies(manifest: &str) -> Vec<String> {
    manifest
        .split("\n[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(['.', ' ', '=']).next())
        .filter(|n| !n.is_empty() && !n.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// ARCHITECTURE invariant 1: the kernel reaches Docker only through the
/// sandbox crate, and the sandbox never touches the control plane.
#[test]
fn the_crates_keep_their_dependencies_apart() {
    let kernel = dependencies(include_str!("../Cargo.toml"));
    let sandbox = dependencies(include_str!("../../sandbox/Cargo.toml"));
    assert!(kernel.iter().any(|d| d == "sandbox"), "{kernel:?}");
    assert!(sandbox.iter().any(|d| d == "opkernel-shim"), "{sandbox:?}");
    assert!(
        !kernel.iter().any(|d| d == "bollard"),
        "the kernel names bollard"
    );
    for store in ["rusqlite", "tokio-postgres", "deadpool-postgres", "sqlx"] {
        assert!(
            !sandbox.iter().any(|d| d == store),
            "the sandbox names {store}"
        );
    }
}

/// Lines of production code (before a file's inline test module, comments
/// aside) that build JSON with the `json!` macro.
fn json_macro_lines(text: &str) -> Vec<usize> {
    production_lines(text)
        .iter()
        .enumerate()
        .filter(|(_, line)| {
            let code = line.trim_start();
            !code.starts_with("//") && code.contains("json!")
        })
        .map(|(n, _)| n + 1)
        .collect()
}

#[test]
fn the_json_scanner_sees_code_only() {
    let text = "use serde_json::json;\n// json!({}) in a comment\n    /// json! in a doc\n\
                fn f() -> Value {\n    serde_json::json!({\"a\": 1})\n}\n\
                #[cfg(test)]\nmod tests {\n    fn g() { json!(1); }\n}\n";
    assert_eq!(json_macro_lines(text), [5]);
}

/// API handlers answer with typed views (`crate::surfaces::views`) and errors
/// with the typed `ErrorBody`: `json!` builds no answer by hand (the OpenAPI
/// document describes those very types).
#[test]
fn api_handlers_build_no_json_by_hand() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/surfaces/api");
    let mut files = Vec::new();
    production_files(&dir, &mut files);
    assert!(files.len() > 5, "the scan found {} api files", files.len());
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for n in json_macro_lines(&text) {
            found.push(format!("{}:{n}", file.display()));
        }
    }
    assert!(
        found.is_empty(),
        "json! in API handlers (answer with a view of crate::surfaces::views): {found:?}"
    );
}

/// A file's code before its inline test module (`#[cfg(test)]` followed by
/// `mod … {`), comment lines aside: other `#[cfg(test)]` items count.
fn code_before_inline_tests(text: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            lines[i].trim() == "#[cfg(test)]"
                && lines.get(i + 1).is_some_and(|next| {
                    let next = next.trim();
                    next.starts_with("mod ") && next.ends_with('{')
                })
        })
        .unwrap_or(lines.len());
    lines[..end]
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(n, l)| (n + 1, *l))
        .collect()
}

#[test]
fn the_inline_test_scanner_stops_at_the_test_module_only() {
    let text = "use a;\n// rusqlite in a comment\n#[cfg(test)]\nmod pg_tests;\nuse rusqlite;\n\
                #[cfg(test)]\nmod tests {\n    use rusqlite;\n}\n";
    let lines: Vec<usize> = code_before_inline_tests(text)
        .into_iter()
        .filter(|(_, l)| l.contains("rusqlite"))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(lines, [5]);
}

/// The store's transaction scripts talk to the database through the seam
/// (`store::db::Tx`), so PostgreSQL reuses every one: rusqlite is named
/// only where the SQLite file is opened and migrated (`store/mod.rs`), by
/// the SQLite side of the seam (`store/db/sqlite.rs`) and its group commit
/// (`store/db/batch.rs`), and by the drills' harness, which reads and edits the file of a kernel it has stopped.
#[test]
fn only_the_sqlite_edge_names_rusqlite() {
    const ALLOWED: [&str; 4] = [
        "store/mod.rs",
        "store/db/sqlite.rs",
        "store/db/batch.rs",
        "drills/harness.rs",
    ];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    production_files(&src, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("store/ops.rs")),
        "the scan missed the store"
    );
    let mut found = Vec::new();
    for file in &files {
        let shown = file
            .strip_prefix(&src)
            .unwrap_or(file)
            .display()
            .to_string();
        if ALLOWED.contains(&shown.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for (n, line) in code_before_inline_tests(&text) {
            if line.contains("rusqlite") {
                found.push(format!("{shown}:{n}: {}", line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "rusqlite outside the SQLite edge (talk through store::db::Tx):\n{}",
        found.join("\n")
    );
}
