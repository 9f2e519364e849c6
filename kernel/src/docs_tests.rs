//! The docs name only what exists: every repository path that
//! ARCHITECTURE.md, the README and `docs/` write in backticks is a file or
//! directory of the checkout (a rename that forgets the docs fails here).

use std::path::Path;

/// The top folders of the checkout a path may start with.
const TOP: &[&str] = &[
    "kernel", "domain", "sandbox", "tests", "docs", "scripts", "docker", ".ci",
];

/// The backticked words of a Markdown text that look like repository
/// paths: under a top folder of the checkout or with a source extension;
/// no spaces, no placeholders, no URL.
fn named_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, part) in text.split('`').enumerate() {
        // odd parts are inside backticks (code fences split evenly too)
        if i % 2 == 0 || part.contains(char::is_whitespace) || part.is_empty() {
            continue;
        }
        let first = part.split('/').next().unwrap_or_default();
        let pathish = (part.contains('/') && TOP.contains(&first))
            || [".rs", ".sql", ".sh", ".md", ".toml", ".py"]
                .iter()
                .any(|e| part.ends_with(e));
        let placeholder = part.contains(['{', '<', '*', '$', '…', '?', '=', ':', '@', '#']);
        let not_repo = part.starts_with('/') || part.starts_with("..") || part.starts_with("~");
        if pathish && !placeholder && !not_repo && !part.contains("://") {
            out.push(part.trim_end_matches('/').to_owned());
        }
    }
    out
}

#[test]
fn every_path_the_docs_name_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut docs = vec![root.join("ARCHITECTURE.md"), root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if entry.path().extension().is_some_and(|e| e == "md") {
            docs.push(entry.path());
        }
    }
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap_or_default();
        for path in named_paths(&text) {
            // a bare file name is looked up where the docs keep their kind
            let candidates = [root.join(&path), root.join("docs").join(&path)];
            checked += 1;
            if !candidates.iter().any(|c| c.exists()) {
                let shown = doc.strip_prefix(&root).unwrap_or(doc).display().to_string();
                missing.push(format!("{shown}: `{path}`"));
            }
        }
    }
    assert!(
        checked > 40,
        "only {checked} paths found in {} docs",
        docs.len()
    );
    assert!(
        missing.is_empty(),
        "the docs name paths that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_scanner_takes_paths_but_not_commands_or_urls() {
    let text = "see `kernel/src/lib.rs`, `x.rs`, `cargo test`, `http://a/b`, `/tmp/x`, \
                `<home>/kernel.db`, `target/debug/opkernel`, `notifications/message`";
    assert_eq!(named_paths(text), ["kernel/src/lib.rs", "x.rs"]);
}
