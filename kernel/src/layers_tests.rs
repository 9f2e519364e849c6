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
