//! The settings' parsers and checks.

use super::*;
use std::time::Duration;

#[test]
fn durations_need_a_unit_and_a_sane_size() {
    for (text, secs) in [
        ("2s", 2),
        ("10m", 600),
        ("12h", 43_200),
        ("7d", 604_800),
        (" 30d ", 2_592_000),
    ] {
        assert_eq!(
            parse_duration(text),
            Ok(Duration::from_secs(secs)),
            "{text}"
        );
    }
    for bad in ["", "7", "d", "7w", "-1d", "0s", "1.5h", "99999999999d"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn sizes_take_bytes_or_one_unit() {
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
    for bad in [
        "",
        "2g",
        "-5",
        "1.5GiB",
        "GiB",
        "99999999999TiB",
        "5 parsecs",
    ] {
        assert!(parse_bytes(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_webhook_needs_an_http_url_and_a_secret() {
    let secret = "sixteen-chars-ok";
    assert!(matches!(Webhook::parse("", ""), Ok(None)));
    let hook = Webhook::parse(" http://127.0.0.1:9000/hook ", secret);
    assert_eq!(hook.unwrap().unwrap().url, "http://127.0.0.1:9000/hook");
    for (url, secret, why) in [
        ("https://hooks.example/x", secret, "https is not supported"),
        ("ftp://hooks.example/x", secret, "not an http:// URL"),
        ("not a url", secret, "not an http:// URL"),
        ("http://127.0.0.1:9000/hook", "short", "at least"),
        ("http://127.0.0.1:9000/hook", "", "at least"),
    ] {
        let e = Webhook::parse(url, secret).unwrap_err();
        assert!(e.contains(why), "{url}: {e}");
        assert!(
            !e.contains(secret) || secret.is_empty(),
            "the secret is never shown"
        );
    }
    let shown = format!(
        "{:?}",
        Webhook::parse("http://h/x", secret).unwrap().unwrap()
    );
    assert!(!shown.contains(secret), "{shown}");
}

#[test]
fn the_store_setting_is_sqlite_or_a_postgres_url_and_never_shows_a_password() {
    assert_eq!(StoreLocation::parse(""), Ok(StoreLocation::Sqlite));
    assert_eq!(StoreLocation::parse("sqlite"), Ok(StoreLocation::Sqlite));
    let pg = StoreLocation::parse("postgres://op:s3cret@db:5432/opk").unwrap();
    assert_eq!(
        pg,
        StoreLocation::Postgres("postgres://op:s3cret@db:5432/opk".into())
    );
    assert_eq!(pg.shown(), "postgres://op:…@db:5432/opk");
    assert!(!format!("{pg:?}").contains("s3cret"));
    let bad = StoreLocation::parse("mysql://u:pw@h/db").unwrap_err();
    assert!(
        bad.contains("OPKERNEL_STORE") && !bad.contains("pw"),
        "{bad}"
    );
}
