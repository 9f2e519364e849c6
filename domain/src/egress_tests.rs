use proptest::prelude::*;

use super::*;

fn list(entries: &[&str]) -> AllowList {
    AllowList::parse(entries).unwrap()
}

#[test]
fn entries_parse_with_wildcards_and_ports_and_bad_ones_name_themselves() {
    let l = list(&[
        "PyPI.org.",
        "*.pythonhosted.org",
        "deb.debian.org:80",
        "10.1.2.3:8080",
    ]);
    assert_eq!(
        l.to_strings(),
        [
            "pypi.org",
            "*.pythonhosted.org",
            "deb.debian.org:80",
            "10.1.2.3:8080"
        ]
    );
    for bad in [
        "",
        "*",
        "*.org",
        "a*.example.org",
        "exa mple.org",
        "host:0",
        "host:99999",
        "host:x",
        "-bad.org",
        "[::1]:443",
        "*.*.org",
        "user@host",
    ] {
        let e = AllowList::parse(&[bad]).unwrap_err();
        assert_eq!(e.entry, bad, "{e}");
    }
}

#[test]
fn a_bare_name_allows_every_port_a_wildcard_only_names_under_it() {
    let l = list(&["pypi.org", "*.pythonhosted.org", "deb.debian.org:80"]);
    assert!(l.allows("pypi.org", 443) && l.allows("PYPI.ORG.", 80));
    assert!(l.allows("files.pythonhosted.org", 443));
    assert!(l.allows("a.b.pythonhosted.org", 1));
    assert!(!l.allows("pythonhosted.org", 443), "not the name itself");
    assert!(!l.allows("evilpythonhosted.org", 443));
    assert!(l.allows("deb.debian.org", 80) && !l.allows("deb.debian.org", 443));
    assert!(!l.allows("pypi.org.evil.com", 443));
    assert!(
        !list(&[]).allows("pypi.org", 443),
        "an empty list allows nothing"
    );
}

#[test]
fn a_list_narrows_another_entry_by_entry() {
    let parent = list(&["*.example.org", "pypi.org", "git.host:22"]);
    for narrower in [
        &["a.example.org"][..],
        &["*.b.example.org:443"],
        &["pypi.org:443", "git.host:22"],
        &[],
    ] {
        assert_eq!(parent.wider_entry(&list(narrower)), None, "{narrower:?}");
    }
    for (wider, entry) in [
        (&["example.org"][..], "example.org"),
        (&["git.host"], "git.host"),
        (&["other.org:80"], "other.org:80"),
    ] {
        let found = parent.wider_entry(&list(wider)).map(ToString::to_string);
        assert_eq!(found.as_deref(), Some(entry), "{wider:?}");
    }
}

#[test]
fn proxy_asks_are_read_from_the_request_line() {
    assert_eq!(
        parse_ask("CONNECT Files.PythonHosted.org:443 HTTP/1.1"),
        Ok(ProxyAsk::Connect {
            host: "files.pythonhosted.org".into(),
            port: 443
        })
    );
    assert_eq!(
        parse_ask("GET http://deb.debian.org/debian/dists?x=1 HTTP/1.1"),
        Ok(ProxyAsk::Forward {
            host: "deb.debian.org".into(),
            port: 80,
            request_line: "GET /debian/dists?x=1 HTTP/1.1".into()
        })
    );
    assert_eq!(
        parse_ask("HEAD http://h:8080?q HTTP/1.0"),
        Ok(ProxyAsk::Forward {
            host: "h".into(),
            port: 8080,
            request_line: "HEAD /?q HTTP/1.0".into()
        })
    );
    for bad in [
        "CONNECT host HTTP/1.1",
        "GET /relative HTTP/1.1",
        "GET https://h/ HTTP/1.1",
        "GET http://u:p@h/ HTTP/1.1",
        "GET http://[::1]/ HTTP/1.1",
        "GET http://h/ HTTP/2",
        "get http://h/ HTTP/1.1",
        "GET  http://h/ HTTP/1.1",
    ] {
        assert!(parse_ask(bad).is_err(), "{bad}");
    }
}

fn entry() -> impl Strategy<Value = String> {
    let name = prop::sample::select(vec!["a.org", "b.a.org", "c.b.a.org", "x.org", "a.x.org"]);
    let wild = any::<bool>();
    let port = prop::option::of(prop::sample::select(vec![22u16, 80, 443]));
    (name, wild, port).prop_map(|(n, w, p)| {
        let host = if w { format!("*.{n}") } else { n.to_owned() };
        match p {
            Some(p) => format!("{host}:{p}"),
            None => host,
        }
    })
}

proptest! {
    /// What a narrower list allows, the list it narrows allows too.
    #[test]
    fn narrowing_never_widens(
        parent in prop::collection::vec(entry(), 0..4),
        child in prop::collection::vec(entry(), 0..4),
        host in prop::sample::select(vec!["a.org", "b.a.org", "c.b.a.org", "d.c.b.a.org", "x.org", "a.x.org"]),
        port in prop::sample::select(vec![22u16, 80, 443, 8080]),
    ) {
        let (parent, child) = (list_of(&parent), list_of(&child));
        if parent.wider_entry(&child).is_none() && child.allows(host, port) {
            prop_assert!(parent.allows(host, port));
        }
    }

    /// The intersection allows exactly what both lists allow, and it
    /// narrows each of them.
    #[test]
    fn an_intersection_allows_what_both_allow(
        a in prop::collection::vec(entry(), 0..4),
        b in prop::collection::vec(entry(), 0..4),
        host in prop::sample::select(vec!["a.org", "b.a.org", "c.b.a.org", "d.c.b.a.org", "x.org", "a.x.org"]),
        port in prop::sample::select(vec![22u16, 80, 443, 8080]),
    ) {
        let (a, b) = (list_of(&a), list_of(&b));
        let both = a.intersect(&b);
        prop_assert_eq!(both.allows(host, port), a.allows(host, port) && b.allows(host, port));
        prop_assert!(a.wider_entry(&both).is_none());
        prop_assert!(b.wider_entry(&both).is_none());
    }
}

#[test]
fn numeric_names_are_addresses_or_nothing_and_no_wildcard_names_one() {
    for bad in ["127.1", "2130706433", "*.0.0.1", "*.1.2.3.4", "a.b.99"] {
        assert!(AllowEntry::parse(bad).is_err(), "{bad}");
    }
    let wild = list(&["*.org", "1.2.3.4:80"][1..]);
    assert!(wild.allows("1.2.3.4", 80));
    let under = AllowEntry::parse("*.example.org").unwrap();
    assert!(!under.allows("1.2.3.4", 80));
    assert!(parse_ask("GET http://127.1/ HTTP/1.1").is_err());
    assert!(parse_ask("GET http://h/ HTTP/1.1\nX: y").is_err());
    assert!(parse_ask("GET http://h/ HTTP/1.0").is_ok());
}

fn list_of(entries: &[String]) -> AllowList {
    AllowList::parse(entries).unwrap()
}

fn allow(entries: &[&str]) -> Network {
    Network::Allow(AllowSpec {
        allow: entries.iter().map(|e| e.to_string()).collect(),
    })
}

fn envelope(network: Network) -> crate::envelope::Envelope {
    crate::envelope::Envelope {
        max_timeout_sec: None,
        memory_bytes: 0,
        cpus: 0.0,
        pids_limit: 0,
        network,
        max_live_ops: 8,
        max_children: 8,
        approval: Default::default(),
        images: None,
        disk_bytes: None,
        runtime: Default::default(),
    }
}

fn narrow(asked: Network, parent: Network) -> Result<Network, crate::envelope::EnvelopeError> {
    let req = crate::envelope::EnvelopeRequest {
        network: Some(asked),
        ..Default::default()
    };
    req.narrow(&envelope(parent)).map(|e| e.network)
}

#[test]
fn networks_narrow_open_then_allow_lists_then_none() {
    use crate::envelope::EnvelopeError;
    let open = Network::from("bridge");
    // open covers any list; a list covers its sub-lists; none is under all
    assert_eq!(
        narrow(allow(&["PyPI.org"]), open.clone()),
        Ok(allow(&["pypi.org"]))
    );
    assert_eq!(narrow("open".into(), open.clone()), Ok(open.clone()));
    let parent = allow(&["*.example.org", "pypi.org:443"]);
    assert_eq!(
        narrow(allow(&["a.example.org:80"]), parent.clone()),
        Ok(allow(&["a.example.org:80"]))
    );
    assert_eq!(narrow(Network::none(), parent.clone()), Ok(Network::none()));
    for wider in [
        allow(&["pypi.org"]),
        allow(&["example.org"]),
        "open".into(),
        "bridge".into(),
    ] {
        let refused = narrow(wider.clone(), parent.clone());
        assert!(
            matches!(
                refused,
                Err(EnvelopeError::Wider {
                    field: "network",
                    ..
                })
            ),
            "{wider}: {refused:?}"
        );
    }
    assert!(narrow(allow(&["pypi.org"]), Network::none()).is_err());
    // a bad entry is a 400 naming it
    let bad = narrow(allow(&["ok.org", "bad host"]), open);
    assert!(
        matches!(&bad, Err(EnvelopeError::Invalid(m)) if m.contains("bad host")),
        "{bad:?}"
    );
}

#[test]
fn a_top_level_open_network_is_the_operators() {
    let req = |n: &str| crate::envelope::EnvelopeRequest {
        network: Some(n.into()),
        ..Default::default()
    };
    let closed_kernel = envelope(Network::none());
    let open = req("open").resolve_top_level(&closed_kernel).unwrap();
    assert_eq!(open.network, Network::from("bridge"));
    let own = envelope(Network::from("opk-net"));
    assert_eq!(
        req("open").resolve_top_level(&own).unwrap().network,
        Network::from("opk-net")
    );
    // stored envelopes from before allow lists read as they were
    let old: crate::envelope::Envelope = serde_json::from_value(serde_json::json!({
        "max_timeout_sec": null, "memory_bytes": 0, "cpus": 0.0, "pids_limit": 0,
        "network": "none", "max_live_ops": 1
    }))
    .unwrap();
    assert_eq!(old.network, Network::none());
    let listed = serde_json::to_value(allow(&["a.org"])).unwrap();
    assert_eq!(listed, serde_json::json!({"allow": ["a.org"]}));
}

#[test]
fn only_internet_addresses_are_public() {
    for private in [
        "127.0.0.1",
        "10.1.2.3",
        "172.17.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "255.255.255.255",
        "224.0.0.1",
        "192.0.2.1",
        "198.18.0.1",
        "240.0.0.1",
        "192.0.0.8",
    ] {
        assert!(!super::is_public(private.parse().unwrap()), "{private}");
    }
    for public in ["1.1.1.1", "151.101.0.223", "172.32.0.1", "100.128.0.1"] {
        assert!(super::is_public(public.parse().unwrap()), "{public}");
    }
    for never in ["127.0.0.1", "169.254.169.254", "0.0.0.0", "224.0.0.1"] {
        assert!(super::is_never_reached(never.parse().unwrap()), "{never}");
    }
    assert!(!super::is_never_reached("10.1.2.3".parse().unwrap()));
}
