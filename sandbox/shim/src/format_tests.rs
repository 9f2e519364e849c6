//! Tests of the shim formats: golden forms, round trips, and what the
//! strict parsers refuse.

use super::*;

const ID: &str = "0b6f1c2e-8a47-4c1e-9d3a-5f2b7c9e1a0d";

#[test]
fn op_ids_must_be_uuids() {
    assert!(validate_op_id(ID).is_ok());
    for bad in [
        "",
        "x",
        "0B6F1C2E-8A47-4C1E-9D3A-5F2B7C9E1A0D",
        "../../etc/passwd",
        &ID.replace('-', "_"),
    ] {
        assert!(validate_op_id(bad).is_err(), "{bad}");
    }
}

#[test]
fn pid_records_round_trip_and_refuse_the_rest() {
    let rec = PidRecord {
        pid: 7,
        start_ticks: 12345,
        hostname: "c0ffee".into(),
    };
    assert_eq!(PidRecord::parse(&rec.render()), Ok(rec));
    assert_eq!(PidRecord::parse(""), Err(FormatError::Empty));
    assert!(matches!(
        PidRecord::parse("7 12"),
        Err(FormatError::Partial(_))
    ));
    for bad in [
        "0 1 h\n",
        "07 1 h\n",
        "7 -1 h\n",
        "7 1 h x\n",
        "7 1 h\u{7}\n",
    ] {
        assert!(
            matches!(PidRecord::parse(bad), Err(FormatError::Garbage(_))),
            "{bad:?}"
        );
    }
    assert_eq!(PidRecord::parse("7 1\n").map(|r| r.hostname), Ok("".into()));
}

#[test]
fn results_carry_usage_read_the_old_form_and_say_not_started() {
    let exited = |code, usage| {
        OpResult::Exited(ExitRecord {
            code,
            usage,
            leftovers: 0,
        })
    };
    let rec = exited(
        143,
        Some(Usage {
            cpu_ms: 2500,
            max_rss_kb: 10240,
        }),
    );
    assert_eq!(rec.render(), "143 2500 10240\n");
    assert_eq!(OpResult::parse(&rec.render()), Ok(rec));
    assert_eq!(OpResult::parse("3\n"), Ok(exited(3, None)));
    assert!(matches!(OpResult::parse("3"), Err(FormatError::Partial(_))));
    let failed = OpResult::not_started("cannot fork: Resource temporarily unavailable\n\u{1}é");
    assert_eq!(
        failed.render(),
        "not-started cannot fork: Resource temporarily unavailable???\n"
    );
    assert_eq!(OpResult::parse(&failed.render()), Ok(failed));
    assert_eq!(
        OpResult::not_started(&"x".repeat(999)).render().len(),
        12 + MAX_REASON + 1
    );
    for bad in [
        "256\n",
        "-1\n",
        "03\n",
        "3 1\n",
        "3 1 2 0\n",
        "3 1 2 3 4\n",
        "3  1 2\n",
        "3 01 2\n",
        "3 1 2 \n",
        "3\n\n",
        " 3\n",
        "not-started \n",
        "not-started  x\n",
        "not-started x \n",
        "not-started x\ty\n",
        "not-startedx\n",
    ] {
        assert!(
            matches!(OpResult::parse(bad), Err(FormatError::Garbage(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn results_count_stopped_leftovers_and_old_records_mean_none() {
    let usage = Usage {
        cpu_ms: 2500,
        max_rss_kb: 10240,
    };
    let with = |leftovers| {
        OpResult::Exited(ExitRecord {
            code: 0,
            usage: Some(usage),
            leftovers,
        })
    };
    // golden: the count is a fourth field, written only when some were stopped
    assert_eq!(with(3).render(), "0 2500 10240 3\n");
    assert_eq!(with(1).render(), "0 2500 10240 1\n");
    assert_eq!(with(0).render(), "0 2500 10240\n");
    for n in [0, 1, 3, u32::MAX] {
        assert_eq!(OpResult::parse(&with(n).render()), Ok(with(n)));
        assert_eq!(with(n).leftovers(), n);
    }
    // records of earlier shims (no count) still parse, meaning none
    assert_eq!(OpResult::parse("0 2500 10240\n"), Ok(with(0)));
    assert_eq!(
        OpResult::parse("137 20 1024\n").map(|r| r.leftovers()),
        Ok(0)
    );
    assert_eq!(OpResult::parse("3\n").map(|r| r.leftovers()), Ok(0));
    assert_eq!(OpResult::not_started("x").leftovers(), 0);
    for bad in [
        "0 2500 10240 0\n",
        "0 2500 10240 03\n",
        "0 2500 10240 -1\n",
        "0 2500 10240 +1\n",
        "0 2500 10240 x\n",
        "0 2500 10240 3 1\n",
        "0 2500 10240  3\n",
        "0 2500 10240 3 \n",
        "0 2500 10240 4294967296\n",
        "0 3\n",
    ] {
        assert!(
            matches!(OpResult::parse(bad), Err(FormatError::Garbage(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn requests_round_trip_and_refuse_the_rest() {
    let req = Request {
        host: "c0ffee".into(),
        op_id: ID.into(),
        run_as: "1000:1000".into(),
        log_cap: 65536,
        io: crate::Io::Null,
        argv: vec![
            "sh".into(),
            "-c".into(),
            "echo 'a\nb' \"$X\"".into(),
            String::new(),
            "end".into(),
        ],
    };
    let bytes = req.render();
    assert_eq!(Request::parse(&bytes), Ok(req.clone()));
    assert!(
        Request::parse(&bytes[..bytes.len() - 1]).is_err(),
        "unterminated"
    );
    let swap = |from: &str, to: &str| {
        let text = String::from_utf8(bytes.clone())
            .unwrap()
            .replacen(from, to, 1);
        Request::parse(text.as_bytes())
    };
    assert!(swap("opkernel-request-2", "opkernel-request-1").is_err());
    assert!(swap("c0ffee", "c0 ffee").is_err());
    assert!(swap(ID, "../../x").is_err());
    assert!(swap("1000:1000", "0:0").is_err());
    assert!(swap("65536", "0").is_err());
    assert!(swap("65536", "065536").is_err());
    let empty = Request {
        argv: vec![String::new()],
        ..req.clone()
    };
    assert!(Request::parse(&empty.render()).is_err());
    let none = Request {
        argv: vec![],
        ..req
    };
    assert!(Request::parse(&none.render()).is_err());
    assert!(Request::parse(&vec![b'x'; MAX_REQUEST + 1]).is_err());
}

#[test]
fn a_request_with_stdin_names_its_mode() {
    let req = Request {
        host: "c0ffee".into(),
        op_id: ID.into(),
        run_as: "1000:1000".into(),
        log_cap: 10,
        io: crate::Io::Tty { rows: 24, cols: 80 },
        argv: vec!["bash".into(), "-i".into()],
    };
    let bytes = req.render();
    assert!(bytes.starts_with(b"opkernel-request-3\0"));
    assert_eq!(Request::parse(&bytes), Ok(req.clone()));
    let text = String::from_utf8(bytes).unwrap();
    for (from, to) in [
        ("tty:24x80", "null"),
        ("tty:24x80", "tty:0x80"),
        ("tty:24x80", "pipe"),
    ] {
        let swapped = Request::parse(text.replacen(from, to, 1).as_bytes());
        assert_eq!(swapped.is_ok(), to == "pipe", "{to}");
    }
}

#[test]
fn probe_listings_parse_only_when_complete() {
    let p = MarkedProcess {
        pid: 12,
        start_ticks: 3456,
        op_id: ID.into(),
    };
    let out = format!("{}{}end\n", p.render(), p.render());
    assert_eq!(parse_probe(&out), Ok(vec![p.clone(), p.clone()]));
    assert_eq!(parse_probe("end\n"), Ok(vec![]));
    assert!(parse_probe(&p.render()).is_err());
    assert!(parse_probe("").is_err());
    assert!(parse_probe(&format!("12 3456 {ID} x\nend\n")).is_err());
    assert!(parse_probe("12 3456 not-an-op\nend\n").is_err());
    assert!(parse_probe(&format!("0 3456 {ID}\nend\n")).is_err());
}

#[test]
fn signaller_output_needs_its_end() {
    let out = format!("{}{}end\n", render_signalled(5), render_signalled(7));
    assert_eq!(parse_signalled(&out), Some(vec![5, 7]));
    assert_eq!(parse_signalled("signalled 5\n"), None);
    assert_eq!(parse_signalled("signalled x\nend\n"), None);
    assert_eq!(parse_signalled("end\n"), Some(vec![]));
    assert_eq!(Signal::parse("TERM"), Some(Signal::Term));
    assert_eq!(Signal::parse("HUP"), Some(Signal::Hup));
    assert_eq!(Signal::parse("SIGHUP"), None);
    assert_eq!(Signal::parse("int"), None);
    for s in Signal::ALL {
        assert_eq!(Signal::parse(s.name()), Some(s));
    }
}
