//! The size limits of the code (issue "one control layer…"): no production
//! file of the workspace over 600 lines, no production function over 80.
//! Test files (`*_tests.rs`, `tests/`), build scripts' helpers and the
//! inline test modules that end a file are not production code.

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 80;

fn production_files(dir: &Path, out: &mut Vec<PathBuf>) {
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
fn production_lines(text: &str) -> Vec<&str> {
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
    for crate_dir in ["kernel/src", "sandbox/src", "sandbox/shim/src"] {
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
        let allowed =
            shown == "control.rs" || shown == "serve.rs" || shown.starts_with("observer/");
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

/// The store's modules import one another without a circle: row modules
/// below, transaction scripts above (`super::<module>` names an import).
#[test]
fn store_modules_import_without_a_circle() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store");
    let mut files = Vec::new();
    production_files(&dir, &mut files);
    let name = |p: &Path| {
        p.file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned()
    };
    let modules: Vec<String> = files
        .iter()
        .map(|p| name(p))
        .filter(|m| m != "mod")
        .collect();
    let edges: Vec<(String, Vec<String>)> = files
        .iter()
        .filter(|p| name(p) != "mod")
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let code = production_lines(&text).join("\n");
            let deps = modules
                .iter()
                .filter(|m| **m != name(p) && code.contains(&format!("super::{m}")))
                .cloned()
                .collect();
            (name(p), deps)
        })
        .collect();
    // depth-first search for a back edge
    fn visit<'a>(
        m: &'a str,
        edges: &'a [(String, Vec<String>)],
        path: &mut Vec<&'a str>,
        done: &mut Vec<&'a str>,
    ) -> Option<String> {
        if let Some(at) = path.iter().position(|p| *p == m) {
            return Some(format!("{} -> {m}", path[at..].join(" -> ")));
        }
        if done.contains(&m) {
            return None;
        }
        path.push(m);
        let deps = edges
            .iter()
            .find(|(n, _)| n == m)
            .map(|(_, d)| d.as_slice());
        for d in deps.unwrap_or_default() {
            if let Some(circle) = visit(d, edges, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.push(m);
        None
    }
    assert!(
        modules.len() > 8,
        "the scan found {} store modules",
        modules.len()
    );
    let (mut path, mut done) = (Vec::new(), Vec::new());
    for m in &modules {
        if let Some(circle) = visit(m, &edges, &mut path, &mut done) {
            panic!("store modules import in a circle: {circle}");
        }
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

/// API handlers answer with typed views (`crate::views`): `json!` builds
/// the error body alone (`api/error.rs`), never an answer by hand.
#[test]
fn api_handlers_build_no_json_by_hand() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api");
    let mut files = Vec::new();
    production_files(&dir, &mut files);
    assert!(files.len() > 5, "the scan found {} api files", files.len());
    let mut found = Vec::new();
    for file in &files {
        if file.file_name().is_some_and(|n| n == "error.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for n in json_macro_lines(&text) {
            found.push(format!("{}:{n}", file.display()));
        }
    }
    assert!(
        found.is_empty(),
        "json! in API handlers (answer with a view of crate::views): {found:?}"
    );
}
