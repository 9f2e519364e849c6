//! No import circle between the kernel crate's files (issue "one control
//! layer…"). A file's module imports another when its code names it by
//! `crate::…` or `super::…`; a `mod.rs` composing its own children (its
//! declarations, re-exports and routes) is the one edge not counted, so a
//! child may use what its parent defines. The pure rules are a crate of
//! their own (`opkernel-domain`), below everything here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::limits_tests::{production_files, production_lines};

/// The crate's production files but `main.rs` (the binary, its own crate).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    production_files(dir, out);
    out.retain(|p| !p.ends_with("main.rs"));
}

/// `api/runs.rs` is `api::runs`, `api/mod.rs` is `api`, `lib.rs` the root.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The code of a file before its inline tests, without comments.
fn code(text: &str) -> String {
    production_lines(text)
        .into_iter()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Paths that follow `prefix` in `code`, as segments (`crate::a::b::C`
/// gives `[a, b, C]`; a `{` list ends the path).
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<Vec<&'a str>> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    code.match_indices(prefix)
        .filter(|(at, _)| !code[..*at].ends_with(ident))
        .map(|(at, _)| {
            let rest = &code[at + prefix.len()..];
            let end = rest
                .find(|c: char| !(ident(c) || c == ':'))
                .unwrap_or(rest.len());
            rest[..end].split("::").filter(|s| !s.is_empty()).collect()
        })
        .collect()
}

/// The longest known module that `segments` (from `base`) name.
fn resolve(
    base: &[String],
    segments: &[&str],
    known: &BTreeMap<Vec<String>, String>,
) -> Option<Vec<String>> {
    let mut full: Vec<String> = base.to_vec();
    full.extend(segments.iter().map(|s| s.to_string()));
    (0..=full.len())
        .rev()
        .map(|n| full[..n].to_vec())
        .find(|m| known.contains_key(m))
}

fn edges(src: &Path) -> BTreeMap<Vec<String>, Vec<Vec<String>>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let known: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|f| {
            (
                module_of(f.strip_prefix(src).unwrap_or(f)),
                std::fs::read_to_string(f).unwrap_or_default(),
            )
        })
        .collect();
    let mut graph = BTreeMap::new();
    for (module, text) in &known {
        let text = code(text);
        // `super` of `a::b` is `a`, whether the file is `a/b.rs` or `a/b/mod.rs`
        let parent = &module[..module.len().saturating_sub(1)];
        let mut deps: Vec<Vec<String>> = paths_after(&text, "crate::")
            .iter()
            .filter_map(|p| resolve(&[], p, &known))
            .chain(
                paths_after(&text, "super::")
                    .iter()
                    .filter_map(|p| resolve(parent, p, &known)),
            )
            // the root (`lib.rs`) names no module; items re-exported there
            // (the domain crate's modules) are below every file
            .filter(|dep| dep != module && !dep.is_empty())
            // a module composing its own children
            .filter(|dep| !(dep.len() == module.len() + 1 && dep.starts_with(module)))
            .collect();
        deps.sort();
        deps.dedup();
        graph.insert(module.clone(), deps);
    }
    graph
}

fn circle_from(
    m: &[String],
    graph: &BTreeMap<Vec<String>, Vec<Vec<String>>>,
    path: &mut Vec<Vec<String>>,
    done: &mut Vec<Vec<String>>,
) -> Option<String> {
    if let Some(at) = path.iter().position(|p| p == m) {
        let mut names: Vec<String> = path[at..].iter().map(|p| p.join("::")).collect();
        names.push(m.join("::"));
        return Some(names.join(" -> "));
    }
    if done.iter().any(|d| d == m) {
        return None;
    }
    path.push(m.to_vec());
    for dep in graph.get(m).map(Vec::as_slice).unwrap_or_default() {
        if let Some(circle) = circle_from(dep, graph, path, done) {
            return Some(circle);
        }
    }
    path.pop();
    done.push(m.to_vec());
    None
}

#[test]
fn the_kernel_crates_files_import_without_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = edges(&src);
    assert!(graph.len() > 60, "the scan found {} modules", graph.len());
    let deps: usize = graph.values().map(Vec::len).sum();
    assert!(deps > 100, "the scan found {deps} imports");
    let (mut path, mut done) = (Vec::new(), Vec::new());
    for m in graph.keys() {
        if let Some(circle) = circle_from(m, &graph, &mut path, &mut done) {
            panic!("files import in a circle: {circle}");
        }
    }
}

#[test]
fn the_scanner_resolves_crate_and_super_paths() {
    let text = "use crate::store::{Op, Store};\nuse super::ApiError;\nlet x = crate::runtime::kernel::Kernel::open;\n// crate::surfaces::api";
    let code = code(text);
    assert_eq!(
        paths_after(&code, "crate::"),
        [vec!["store"], vec!["runtime", "kernel", "Kernel", "open"]]
    );
    assert_eq!(paths_after(&code, "super::"), [vec!["ApiError"]]);
    let known: BTreeMap<Vec<String>, String> = [(vec!["api".to_owned()], String::new())].into();
    let got = resolve(&["api".to_owned()], &["runs", "X"], &known);
    assert_eq!(got, Some(vec!["api".to_owned()]));
}
