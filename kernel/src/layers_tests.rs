//! The folders are the layers: each production file names (by `crate::…`)
//! only its own folder and those below it. The rank, bottom up:
//! `base` < `store` < `runtime` < `surfaces` < `drills` < `app` (the pure
//! rules and `sandbox` are crates of their own, below all of them; Cargo
//! keeps them there).

use std::path::Path;

use crate::limits_tests::{production_files, production_lines};

const RANK: &[&str] = &["base", "store", "runtime", "surfaces", "drills", "app"];

fn rank(folder: &str) -> Option<usize> {
    RANK.iter().position(|f| *f == folder)
}

/// The top folders a file's code names by `crate::`, comments aside.
fn named_folders(text: &str) -> Vec<String> {
    let code: Vec<&str> = production_lines(text)
        .into_iter()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect();
    let code = code.join("\n");
    code.match_indices("crate::")
        .filter(|(at, _)| {
            !code[..*at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$')
        })
        .map(|(at, p)| {
            code[at + p.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

#[test]
fn each_file_names_only_its_own_layer_and_those_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    production_files(&src, &mut files);
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap_or(file);
        let mut parts = rel.iter().map(|p| p.to_string_lossy().into_owned());
        let top = parts.next().unwrap_or_default();
        if rel.components().count() == 1 {
            // lib.rs and main.rs sit above every layer; nothing else may
            assert!(
                matches!(top.as_str(), "lib.rs" | "main.rs"),
                "{top} is in no layer: move it into one of {RANK:?}"
            );
            continue;
        }
        let own = rank(&top).unwrap_or_else(|| panic!("{top}/ is in no layer of {RANK:?}"));
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for named in named_folders(&text) {
            checked += 1;
            // the domain crate's modules, re-exported at the root
            let Some(theirs) = rank(&named) else { continue };
            if theirs > own {
                broken.push(format!("{}: names crate::{named}", rel.display()));
            }
        }
    }
    assert!(checked > 300, "the scan found {checked} paths");
    broken.sort();
    broken.dedup();
    assert!(broken.is_empty(), "upward imports:\n{}", broken.join("\n"));
}

#[test]
fn the_scanner_sees_paths_but_not_comments_or_macros() {
    let text = "use crate::store::X;\n// crate::app\nlet a = $crate::app::y;\nf(crate::runtime::k)";
    assert_eq!(named_folders(text), ["store", "runtime"]);
}

/// Inside `runtime`, its core (the kernel's state and what it is made of)
/// sits below its loops: no core file names an observer, the reaper or a
/// background loop.
#[test]
fn the_runtime_core_never_names_its_loops() {
    const CORE: &[&str] = &[
        "kernel", "probes", "watcher", "inbox", "runmeta", "home", "config",
    ];
    const LOOPS: &[&str] = &[
        "observer",
        "reaper",
        "housekeeping",
        "control",
        "node",
        "scheduler",
        "stop",
        "webhooks",
        "retention",
    ];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/runtime");
    let mut files = Vec::new();
    production_files(&src, &mut files);
    let mut broken = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap_or(file);
        let first = rel.iter().next().map(|p| p.to_string_lossy().into_owned());
        let part = first.unwrap_or_default();
        if !CORE.contains(&part.trim_end_matches(".rs")) {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in production_lines(&text) {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for name in LOOPS {
                if code.contains(&format!("crate::runtime::{name}::")) {
                    broken.push(format!("runtime/{}: names {name}", rel.display()));
                }
            }
        }
    }
    assert!(files.len() > 20, "the scan found {} files", files.len());
    assert!(
        broken.is_empty(),
        "the runtime's core names its loops:\n{}",
        broken.join("\n")
    );
}

/// The pure rules stay pure: `opkernel-domain` depends on nothing that
/// does I/O (no runtime, store, Docker or HTTP client). Adding one is a
/// decision to make here, in the open.
#[test]
fn the_domain_crate_depends_on_no_runtime() {
    let manifest = include_str!("../../domain/Cargo.toml");
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .unwrap_or_default();
    let names: Vec<&str> = deps
        .lines()
        .filter_map(|l| l.split(['.', ' ', '=']).next())
        .filter(|n| !n.is_empty() && !n.starts_with('#'))
        .collect();
    let allowed = [
        "opkernel-shim",
        "chrono",
        "croner",
        "regex",
        "serde",
        "serde_json",
        "thiserror",
        // derives the API document's schemas of the domain's types
        // (SPEC §23): a description, no I/O
        "utoipa",
    ];
    let extra: Vec<&&str> = names.iter().filter(|n| !allowed.contains(n)).collect();
    assert!(extra.is_empty(), "domain depends on {extra:?}");
    assert!(names.len() >= 5, "scanned {names:?}");
}
