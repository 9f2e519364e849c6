//! The table, its reader and its rendered reference.

use std::collections::BTreeMap;
use std::time::Duration;

use super::table::{self as t, ALL};
use super::*;

fn reader_of<'a>(env: &'a dyn Fn(&str) -> Option<String>) -> Reader<'a> {
    Reader::new(env, BTreeMap::new())
}

#[test]
fn each_setting_is_declared_once_and_its_default_reads_as_its_kind() {
    let mut names: Vec<&str> = ALL.iter().map(|s| s.env).collect();
    names.extend(ALL.iter().filter_map(|s| s.alias.map(|a| a.env)));
    let count = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), count, "a name is declared twice");
    let flags: Vec<&str> = ALL.iter().filter_map(|s| s.flag).collect();
    assert!(flags.len() >= 6, "{flags:?}");
    for s in ALL {
        assert!(s.env.starts_with("OPKERNEL_"), "{}", s.env);
        assert!(!s.doc_line().is_empty(), "{} has no doc", s.env);
        let ok = match s.kind {
            Kind::Duration => parse_duration(s.default).is_ok(),
            Kind::Bytes => parse_bytes(s.default).is_ok(),
            Kind::Count => parse_count(s.default).is_ok(),
            Kind::Switch => parse_switch(s.default).is_ok(),
            Kind::Address => s.default.is_empty() || parse_address(s.default).is_ok(),
            _ => true,
        };
        assert!(ok, "the default of {} is not a {}", s.env, s.kind.name());
    }
}

#[test]
fn durations_take_one_syntax_with_a_unit() {
    for (text, d) in [
        ("500ms", Duration::from_millis(500)),
        ("10s", Duration::from_secs(10)),
        ("5m", Duration::from_secs(300)),
        ("12h", Duration::from_secs(43_200)),
        (" 7d ", Duration::from_secs(604_800)),
        ("1h 30m", Duration::from_secs(5_400)),
    ] {
        assert_eq!(parse_duration(text), Ok(d), "{text}");
    }
    for bad in ["", "7", "d", "7w x", "-1d", "99999999999d"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn sizes_take_bytes_or_a_unit() {
    for (text, bytes) in [
        ("0", 0),
        ("1048576", 1 << 20),
        ("512MiB", 512 << 20),
        (" 2GiB ", 2 << 30),
        ("64KiB", 64 << 10),
        ("1GB", 1_000_000_000),
        ("10B", 10),
    ] {
        assert_eq!(parse_bytes(text), Ok(bytes), "{text}");
    }
    for bad in ["", "-5", "GiB", "5 parsecs"] {
        assert!(parse_bytes(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_value_that_does_not_parse_refuses_the_start_naming_the_setting() {
    let env = |name: &str| match name {
        "OPKERNEL_MAX_OPS" => Some("lots".to_owned()),
        "OPKERNEL_GRACE" => Some("60".to_owned()),
        "OPKERNEL_LAUNCHER" => Some("maybe".to_owned()),
        "OPKERNEL_LOG_CAP" => Some("5 parsecs".to_owned()),
        _ => None,
    };
    let mut r = reader_of(&env);
    let config = load::config(&mut r);
    assert_eq!(config.runs.max_live_ops, 16_384, "the default stands in");
    for name in [
        "OPKERNEL_MAX_OPS",
        "OPKERNEL_GRACE",
        "OPKERNEL_LAUNCHER",
        "OPKERNEL_LOG_CAP",
    ] {
        assert!(
            r.invalid.iter().any(|e| e.starts_with(name)),
            "{name}: {:?}",
            r.invalid
        );
    }
    assert_eq!(r.invalid.len(), 4, "{:?}", r.invalid);
}

#[test]
fn an_old_name_is_read_in_its_old_unit_with_a_warning() {
    let env = |name: &str| match name {
        "OPKERNEL_GRACE_MS" => Some("3000".to_owned()),
        "OPKERNEL_REAP_TTL_SECONDS" => Some("60".to_owned()),
        "OPKERNEL_MEMORY_BYTES" => Some("1GiB".to_owned()),
        "OPKERNEL_KILL_GRACE_MS" => Some("2s".to_owned()),
        _ => None,
    };
    let mut r = reader_of(&env);
    let config = load::config(&mut r);
    assert_eq!(config.ops.grace, Duration::from_secs(3));
    assert_eq!(config.upkeep.reap_ttl, Duration::from_secs(60));
    assert_eq!(config.profile.memory_bytes, 1 << 30);
    assert_eq!(r.warnings.len(), 4, "{:?}", r.warnings);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.starts_with("OPKERNEL_GRACE_MS is the old name of OPKERNEL_GRACE ")),
        "{:?}",
        r.warnings
    );
    assert_eq!(r.invalid.len(), 1, "{:?}", r.invalid);
    assert!(r.invalid[0].contains("whole number of milliseconds"));
}

#[test]
fn a_setting_under_both_names_is_refused_and_a_flag_wins_over_the_variable() {
    let env = |name: &str| match name {
        "OPKERNEL_GRACE" | "OPKERNEL_GRACE_MS" => Some("5s".to_owned()),
        "OPKERNEL_STORE" => Some("mysql://x".to_owned()),
        _ => None,
    };
    let flags = BTreeMap::from([(t::STORE.env, "sqlite".to_owned())]);
    let mut r = Reader::new(&env, flags);
    let _ = load::config(&mut r);
    assert_eq!(r.invalid.len(), 1, "{:?}", r.invalid);
    assert!(r.invalid[0].contains("old name OPKERNEL_GRACE_MS"));
}

#[test]
fn the_defaults_make_the_kernel_of_before() {
    let env = |_: &str| None;
    let mut r = reader_of(&env);
    let c = load::config(&mut r);
    assert!(r.invalid.is_empty() && r.warnings.is_empty());
    assert_eq!(c.profile, sandbox::Profile::default());
    assert_eq!(c.ops.grace, Duration::from_secs(60));
    assert_eq!(c.ops.log_cap_bytes, 64 << 20);
    assert_eq!(c.ops.fg_max_sec, 900);
    assert_eq!(c.ops.bg_max_sec, 3600);
    assert_eq!(c.runs.max_children, crate::runs::DEFAULT_MAX_CHILDREN);
    assert_eq!(
        c.docker.timeout.as_secs(),
        sandbox::docker::REQUEST_TIMEOUT_SECS
    );
    assert_eq!(c.upkeep.retention, Duration::from_secs(30 * 86_400));
    assert_eq!(c.pool.size, 2);
    assert!(c.node.is_none() && c.webhook.is_none() && !c.drills.on);
    assert_eq!(c.listen.to_string(), "127.0.0.1:7878");
}

/// `docs/settings.md` carries the table rendered from the code; run with
/// `OPKERNEL_BLESS=1` to rewrite it after changing the table.
#[test]
fn the_docs_settings_table_is_the_one_rendered_from_the_code() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/settings.md");
    let docs = std::fs::read_to_string(&path).unwrap_or_default();
    let fresh = docs::refreshed(&docs).expect("docs/settings.md lacks the table's markers");
    if std::env::var_os("OPKERNEL_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    assert!(
        docs == fresh,
        "docs/settings.md differs from the table in kernel/src/app/settings/table.rs; \
         run `OPKERNEL_BLESS=1 cargo test -p opkernel --lib settings` to refresh it"
    );
}

/// Every `OPKERNEL_*` name the production code spells is a setting of the
/// table (or an old name of one), or one of the test harness's own.
#[test]
fn every_variable_the_code_reads_is_in_the_table() {
    let harness = [
        "OPKERNEL_TEST_STORE",
        "OPKERNEL_TEST_PG",
        "OPKERNEL_TEST_LISTEN",
        "OPKERNEL_BIN",
        "OPKERNEL_KEEP_HOMES",
        "OPKERNEL_BLESS",
    ];
    let known = |name: &str| {
        harness.contains(&name)
            || ALL
                .iter()
                .any(|s| s.env == name || s.alias.is_some_and(|a| a.env == name))
    };
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    crate::limits_tests::production_files(&src, &mut files);
    let mut unknown = Vec::new();
    for file in &files {
        let whole = std::fs::read_to_string(file).unwrap_or_default();
        let text = crate::limits_tests::production_lines(&whole).join("\n");
        for (at, _) in text.match_indices("OPKERNEL_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            // `__OPKERNEL_OP` is the op id the shim gives a command
            if name.ends_with('_') || known(&name) || text[..at].ends_with("__") {
                continue;
            }
            unknown.push(format!("{}: {name}", file.display()));
        }
    }
    assert!(
        unknown.is_empty(),
        "not in the table:\n{}",
        unknown.join("\n")
    );
}
