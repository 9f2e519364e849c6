//! The kernel reads the wall clock in one place, `store::now_ms`: every
//! deadline (an op's timeout, the start-evidence window, approval and
//! schedule times) is computed from it, so the clock-step drill, which
//! steps only `now_ms`, steps every wall-clock reader the deadline code
//! uses. This lint keeps it so: any other mention of the system clock in
//! the kernel's sources or the sandbox crate it calls (Rust's `SystemTime`
//! and `UNIX_EPOCH`, chrono's or time's "now", SQL's clock functions) fails
//! unless the allow-list below names it, with its reason and exact count.
//! (The shim runs inside containers on their clock and is not read here.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What reads (or converts to) the system clock.
const RUST_CLOCK: &[&str] = &[
    "SystemTime",
    "UNIX_EPOCH",
    "Utc::now",
    "Local::now",
    "now_utc",
    "now_local",
];

/// SQL that reads the database's clock (matched case-insensitively).
const SQL_CLOCK: &[&str] = &[
    "'now'",
    "current_timestamp",
    "current_time",
    "current_date",
    "unixepoch(",
];

/// Every allowed mention: file (from the workspace root), pattern, how
/// many times, and why it is not a deadline's clock.
const ALLOWED: &[(&str, &str, usize, &str)] = &[
    (
        "kernel/src/store/lease.rs",
        "'now'",
        1,
        "the database's clock for cluster leases (SPEC §20), in SQLite's spelling: a lease is judged by the store's clock, never a node's; no op deadline",
    ),
    (
        "kernel/src/store/mod.rs",
        "SystemTime",
        1,
        "now_ms itself: the one wall-clock reading, stepped by the drills",
    ),
    (
        "kernel/src/store/mod.rs",
        "UNIX_EPOCH",
        1,
        "now_ms itself",
    ),
    (
        "kernel/src/runtime/reaper/mod.rs",
        "UNIX_EPOCH",
        1,
        "converts a scratch dir's file mtimes to unix ms (reads no clock); the reaper's idle age, not an op deadline",
    ),
    (
        "sandbox/src/docker.rs",
        "SystemTime",
        2,
        "unix_now (import and call): the creation stamp label of a new container, a record",
    ),
    (
        "sandbox/src/docker.rs",
        "UNIX_EPOCH",
        2,
        "unix_now (import and call)",
    ),
    (
        "sandbox/src/opfiles.rs",
        "UNIX_EPOCH",
        2,
        "a .code file's mtime as unix ms (the recorded end, reads no clock); a probe nonce's entropy",
    ),
    (
        "sandbox/src/opfiles.rs",
        "SystemTime",
        2,
        "the age of stale handover files against their file-system mtimes (the sweep of leftovers, \
         on the same clock that stamped them); a probe nonce's entropy",
    ),
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path
            .extension()
            .is_some_and(|ext| ext == "rs" || ext == "sql")
        {
            out.push(path);
        }
    }
}

/// The code of a line: what precedes a `//` comment (good enough here: no
/// clock pattern sits in a string with `//` before it).
fn code(line: &str) -> &str {
    let trimmed = line.trim_start();
    if trimmed.starts_with("//") || trimmed.starts_with("--") {
        return "";
    }
    line.split_once("//").map_or(line, |(code, _)| code)
}

/// Mentions per (file, pattern) in the kernel's and the sandbox's sources.
fn mentions(root: &Path) -> BTreeMap<(String, &'static str), usize> {
    let mut files = Vec::new();
    for dir in ["kernel/src", "kernel/migrations", "sandbox/src"] {
        sources(&root.join(dir), &mut files);
    }
    assert!(files.len() > 20, "found only {} source files", files.len());
    let mut found = BTreeMap::new();
    for file in files {
        let name = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .to_string_lossy()
            .into_owned();
        if name.ends_with("wall_clock_tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for line in text.lines() {
            let code = code(line);
            let lower = code.to_ascii_lowercase();
            for &pat in RUST_CLOCK {
                let n = code.matches(pat).count();
                if n > 0 {
                    *found.entry((name.clone(), pat)).or_default() += n;
                }
            }
            for &pat in SQL_CLOCK {
                let n = lower.matches(pat).count();
                if n > 0 {
                    *found.entry((name.clone(), pat)).or_default() += n;
                }
            }
        }
    }
    found
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

#[test]
fn the_wall_clock_is_read_only_through_now_ms() {
    let found = mentions(&workspace_root());
    let allowed: BTreeMap<(String, &str), usize> = ALLOWED
        .iter()
        .map(|(file, pat, n, _why)| (((*file).to_owned(), *pat), *n))
        .collect();
    let unexpected: Vec<String> = found
        .iter()
        .filter(|(key, n)| allowed.get(*key) != Some(n))
        .map(|((file, pat), n)| {
            format!(
                "{file}: {n} x {pat:?} (allowed: {})",
                allowed.get(&(file.clone(), *pat)).copied().unwrap_or(0)
            )
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "the wall clock is read outside store::now_ms (the clock-step drill would not reach it): \
         use store::now_ms for wall time and Instant for waits, or justify it in ALLOWED:\n{}",
        unexpected.join("\n")
    );
    // an allowance that no longer matches anything is stale
    let stale: Vec<&(String, &str)> = allowed.keys().filter(|k| !found.contains_key(*k)).collect();
    assert!(stale.is_empty(), "stale allowances: {stale:?}");
}

#[test]
fn the_lint_sees_a_clock_read() {
    let dir = std::env::temp_dir().join(format!("opkernel-clock-lint-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(dir.join("kernel/src/observer")).unwrap();
    for i in 0..21 {
        std::fs::write(dir.join(format!("kernel/src/f{i}.rs")), "fn f() {}\n").unwrap();
    }
    std::fs::write(
        dir.join("kernel/src/observer/watch.rs"),
        "// SystemTime in a comment is fine\nlet t = std::time::SystemTime::now(); // now\n\
         conn.execute(\"UPDATE ops SET at = unixepoch('now')\")\n",
    )
    .unwrap();
    let found = mentions(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let file = "kernel/src/observer/watch.rs".to_owned();
    assert_eq!(found.get(&(file.clone(), "SystemTime")), Some(&1));
    assert_eq!(found.get(&(file.clone(), "'now'")), Some(&1));
    assert_eq!(found.get(&(file, "unixepoch(")), Some(&1));
}
