use super::*;

fn parent() -> Envelope {
    Envelope {
        max_timeout_sec: Some(600),
        memory_bytes: 1 << 30,
        cpus: 1.5,
        pids_limit: 256,
        network: "bridge".into(),
        max_live_ops: 32,
        max_children: 8,
        approval: ApprovalRules {
            patterns: vec!["^rm ".into()],
            all: false,
            timeout_sec: None,
            on_timeout: None,
        },
        images: Some(vec!["base".into(), "python".into()]),
        disk_bytes: Some(1 << 30),
        runtime: Runtime::Runc,
    }
}

#[test]
fn the_transition_table() {
    use RunAction as A;
    use RunState as S;
    let change = |from, to| Transition::Change { from, to };
    let table = [
        (S::Active, A::Pause, change(S::Active, S::Paused)),
        (S::Active, A::Resume, Transition::Already),
        (S::Active, A::Complete, change(S::Active, S::Completed)),
        (S::Active, A::Cancel, change(S::Active, S::Cancelled)),
        (S::Paused, A::Pause, Transition::Already),
        (S::Paused, A::Resume, change(S::Paused, S::Active)),
        (S::Paused, A::Complete, change(S::Paused, S::Completed)),
        (S::Paused, A::Cancel, change(S::Paused, S::Cancelled)),
        (S::Completed, A::Pause, Transition::Refused(S::Completed)),
        (S::Completed, A::Resume, Transition::Refused(S::Completed)),
        (S::Completed, A::Complete, Transition::Already),
        (S::Completed, A::Cancel, Transition::Refused(S::Completed)),
        (S::Cancelled, A::Pause, Transition::Refused(S::Cancelled)),
        (S::Cancelled, A::Resume, Transition::Refused(S::Cancelled)),
        (S::Cancelled, A::Complete, Transition::Refused(S::Cancelled)),
        (S::Cancelled, A::Cancel, Transition::Already),
    ];
    for (state, action, want) in table {
        assert_eq!(transition(state, action), want, "{state:?} {action:?}");
    }
    // final states are absorbing: nothing leads out of them
    for s in RunState::ALL.into_iter().filter(|s| s.is_final()) {
        for a in [A::Pause, A::Resume, A::Complete, A::Cancel] {
            assert!(!matches!(transition(s, a), Transition::Change { .. }));
        }
    }
    for s in RunState::ALL {
        assert_eq!(RunState::parse(s.as_str()), Some(s));
    }
}

#[test]
fn the_pause_of_record_is_the_highest_pausers() {
    use RunAction as A;
    use RunState as S;
    let chain = vec!["root".to_owned(), "mid".to_owned()];
    let rank = |who: &str| pause_rank(who, &chain, "leaf");
    assert_eq!(
        [
            "operator",
            "run:root",
            "run:mid",
            "run:leaf",
            "run:other",
            "x"
        ]
        .map(rank),
        [0, 1, 2, 3, usize::MAX, usize::MAX]
    );
    // the reproduced hole: the child pauses itself, the operator pauses
    // it too, the child's resume is refused
    let table = [
        (S::Paused, A::Pause, 0, Some(3), Transition::TakeOver),
        (S::Paused, A::Pause, 3, Some(0), Transition::Already),
        (S::Paused, A::Pause, 2, Some(2), Transition::Already),
        (S::Paused, A::Resume, 3, Some(0), Transition::PausedAbove),
        (S::Paused, A::Resume, 2, Some(1), Transition::PausedAbove),
        (
            S::Paused,
            A::Resume,
            1,
            Some(1),
            change(S::Paused, S::Active),
        ),
        (
            S::Paused,
            A::Resume,
            0,
            Some(3),
            change(S::Paused, S::Active),
        ),
        // a pause recorded before pausers were (nobody named): as before
        (S::Paused, A::Resume, 3, None, change(S::Paused, S::Active)),
        (S::Paused, A::Pause, 0, None, Transition::Already),
        (S::Active, A::Pause, 3, None, change(S::Active, S::Paused)),
        (S::Active, A::Resume, 3, None, Transition::Already),
        (
            S::Paused,
            A::Cancel,
            3,
            Some(0),
            change(S::Paused, S::Cancelled),
        ),
        (
            S::Completed,
            A::Pause,
            0,
            None,
            Transition::Refused(S::Completed),
        ),
    ];
    for (state, action, by, pauser, want) in table {
        assert_eq!(
            transition_by(state, action, by, pauser),
            want,
            "{state:?} {action:?} by {by} over {pauser:?}"
        );
    }
    // every order of up to five pauses and resumes by the four levels:
    // once paused by level r, only a level at or above r makes it active
    let moves: Vec<(A, usize)> = [A::Pause, A::Resume]
        .into_iter()
        .flat_map(|a| (0..4).map(move |r| (a, r)))
        .collect();
    let mut orders: Vec<Vec<(A, usize)>> = vec![vec![]];
    for _ in 0..5 {
        orders = orders
            .iter()
            .flat_map(|o| {
                moves.iter().map(move |m| {
                    let mut o = o.clone();
                    o.push(*m);
                    o
                })
            })
            .collect();
    }
    for order in &orders {
        let (mut state, mut pauser, mut highest) = (S::Active, None::<usize>, None::<usize>);
        for &(action, by) in order {
            match transition_by(state, action, by, pauser) {
                Transition::Change { to, .. } => {
                    state = to;
                    pauser = (to == S::Paused).then_some(by);
                    if to == S::Active {
                        let h = highest.expect("resumed without a pause");
                        assert!(by <= h, "{order:?}: level {by} undid a pause by {h}");
                    }
                    highest = pauser;
                }
                Transition::TakeOver => {
                    pauser = Some(by);
                    highest = highest.map(|h| h.min(by));
                }
                Transition::Already | Transition::PausedAbove => {}
                Transition::Refused(_) => unreachable!("{order:?}"),
            }
            assert_eq!(
                pauser, highest,
                "{order:?}: the record is the highest pauser"
            );
        }
    }
}

fn change(from: RunState, to: RunState) -> Transition {
    Transition::Change { from, to }
}

#[test]
fn a_child_may_narrow_every_field() {
    let req = EnvelopeRequest {
        max_timeout_sec: Some(60),
        memory_bytes: Some(256 << 20),
        cpus: Some(0.5),
        pids_limit: Some(64),
        network: Some("none".into()),
        max_live_ops: Some(4),
        max_children: Some(2),
        approval: Some(ApprovalRules {
            patterns: vec!["^git push".into()],
            all: false,
            timeout_sec: Some(30),
            on_timeout: Some(OnTimeout::Deny),
        }),
        images: Some(vec!["python".into()]),
        disk_bytes: Some(1 << 20),
        runtime: Some(Runtime::Runsc),
    };
    let env = req.narrow(&parent()).unwrap();
    assert_eq!(env.runtime, Runtime::Runsc);
    assert_eq!(env.images, Some(vec!["python".to_owned()]));
    assert!(env.allows_image("python") && !env.allows_image("base"));
    assert_eq!(env.disk_bytes, Some(1 << 20));
    assert_eq!(env.max_timeout_sec, Some(60));
    assert_eq!(env.memory_bytes, 256 << 20);
    assert_eq!(env.cpus, 0.5);
    assert_eq!(env.pids_limit, 64);
    assert_eq!(env.network, crate::egress::Network::none());
    assert_eq!(env.max_live_ops, 4);
    assert_eq!(env.max_children, 2);
    // rules are added to the parent's, never replace them
    assert_eq!(env.approval.patterns, vec!["^rm ", "^git push"]);
    assert_eq!(env.approval.on_timeout, Some(OnTimeout::Deny));
    // nothing asked: the parent's envelope as is
    assert_eq!(
        EnvelopeRequest::default().narrow(&parent()).unwrap(),
        parent()
    );
}

#[test]
fn every_widening_is_refused_naming_its_field() {
    let cases: Vec<(&str, EnvelopeRequest)> = vec![
        (
            "max_timeout_sec",
            EnvelopeRequest {
                max_timeout_sec: Some(601),
                ..Default::default()
            },
        ),
        (
            "memory_bytes",
            EnvelopeRequest {
                memory_bytes: Some((1 << 30) + 1),
                ..Default::default()
            },
        ),
        (
            "cpus",
            EnvelopeRequest {
                cpus: Some(1.6),
                ..Default::default()
            },
        ),
        (
            "pids_limit",
            EnvelopeRequest {
                pids_limit: Some(257),
                ..Default::default()
            },
        ),
        (
            "network",
            EnvelopeRequest {
                network: Some("host".into()),
                ..Default::default()
            },
        ),
        (
            "max_live_ops",
            EnvelopeRequest {
                max_live_ops: Some(33),
                ..Default::default()
            },
        ),
        (
            "max_children",
            EnvelopeRequest {
                max_children: Some(9),
                ..Default::default()
            },
        ),
        (
            "images",
            EnvelopeRequest {
                images: Some(vec!["python".into(), "node".into()]),
                ..Default::default()
            },
        ),
        (
            "disk_bytes",
            EnvelopeRequest {
                disk_bytes: Some((1 << 30) + 1),
                ..Default::default()
            },
        ),
    ];
    for (field, req) in cases {
        match req.narrow(&parent()) {
            Err(EnvelopeError::Wider { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    // a parent without a timeout ceiling leaves any timeout narrower
    let open = Envelope {
        max_timeout_sec: None,
        ..parent()
    };
    assert!(EnvelopeRequest {
        max_timeout_sec: Some(10_000),
        ..Default::default()
    }
    .narrow(&open)
    .is_ok());
    // a parent without a memory, cpu or pids limit (Docker's 0): any value narrows it
    let unlimited = Envelope {
        memory_bytes: 0,
        cpus: 0.0,
        pids_limit: 0,
        ..parent()
    };
    let env = EnvelopeRequest {
        memory_bytes: Some(1 << 40),
        cpus: Some(512.0),
        pids_limit: Some(100_000),
        ..Default::default()
    }
    .narrow(&unlimited)
    .unwrap();
    assert_eq!(env.memory_bytes, 1 << 40);
    // a parent without a network: the child cannot get one
    let closed = Envelope {
        network: "none".into(),
        ..parent()
    };
    assert!(matches!(
        EnvelopeRequest {
            network: Some("bridge".into()),
            ..Default::default()
        }
        .narrow(&closed),
        Err(EnvelopeError::Wider {
            field: "network",
            ..
        })
    ));
}

#[test]
fn budgets_only_narrow_against_the_tightest_on_the_chain() {
    let parent = Budget {
        tokens: Some(1000),
        ..Default::default()
    };
    let grandparent = Budget {
        op_seconds: Some(60),
        tokens: Some(5000),
        ..Default::default()
    };
    let tightest = parent.tightest(&grandparent);
    assert_eq!(tightest.tokens, Some(1000));
    assert_eq!(tightest.op_seconds, Some(60));
    let ok = Budget {
        tokens: Some(1000),
        op_seconds: Some(30),
        cost_micros: Some(1),
        ..Default::default()
    };
    assert!(ok.narrow(&tightest).is_ok());
    for (field, b) in [
        (
            "tokens",
            Budget {
                tokens: Some(1001),
                ..Default::default()
            },
        ),
        (
            "op_seconds",
            Budget {
                op_seconds: Some(61),
                ..Default::default()
            },
        ),
    ] {
        match b.narrow(&tightest) {
            Err(EnvelopeError::Wider { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn bad_envelopes_are_invalid_not_wider() {
    for req in [
        EnvelopeRequest {
            memory_bytes: Some(1),
            ..Default::default()
        },
        EnvelopeRequest {
            cpus: Some(f64::NAN),
            ..Default::default()
        },
        EnvelopeRequest {
            network: Some("a b".into()),
            ..Default::default()
        },
        EnvelopeRequest {
            max_live_ops: Some(0),
            ..Default::default()
        },
        EnvelopeRequest {
            approval: Some(ApprovalRules {
                patterns: vec!["(".into()],
                ..Default::default()
            }),
            ..Default::default()
        },
    ] {
        assert!(
            matches!(req.narrow(&parent()), Err(EnvelopeError::Invalid(_))),
            "{req:?}"
        );
    }
    let json = r#"{"memory_bytes": 1, "bogus": 2}"#;
    assert!(serde_json::from_str::<EnvelopeRequest>(json).is_err());
}

#[test]
fn limits_are_reached_exactly() {
    let budget = Budget {
        tokens: Some(100),
        op_seconds: Some(2),
        ..Default::default()
    };
    let mut used = Used {
        tokens: 99,
        op_ms: 1999,
        ..Default::default()
    };
    assert_eq!(used.exhausted(&budget), None);
    used.tokens = 100;
    let e = used.exhausted(&budget).unwrap();
    assert_eq!((e.limit, e.max), ("tokens", 100));
    used.tokens = 0;
    used.op_ms = 2000;
    assert_eq!(used.exhausted(&budget).unwrap().limit, "op_seconds");
    assert_eq!(
        used.remaining(&budget),
        serde_json::json!({"op_seconds": 0.0, "tokens": 100})
    );
    assert_eq!(used.summary(&budget), "op_seconds 2/2, tokens 0/100");
}

#[test]
fn a_child_lives_in_its_parents_namespace() {
    let table = [
        ("p", "nightly", "p.nightly"),
        ("p", "p.nightly", "p.nightly"),
        ("p", "p.", "p.p."),
        ("p", "pp.x", "p.pp.x"),
        ("a.b", "c", "a.b.c"),
        ("a.b", "a.b.c", "a.b.c"),
        ("a", "a", "a.a"),
    ];
    for (parent, name, want) in table {
        assert_eq!(child_run_id(parent, name), want, "{parent} {name}");
    }
}

#[test]
fn runsc_may_be_asked_for_never_given_up_and_runs_without_a_network() {
    let runsc = EnvelopeRequest {
        runtime: Some(Runtime::Runsc),
        network: Some("none".into()),
        ..Default::default()
    };
    let strict = runsc.narrow(&parent()).unwrap();
    assert_eq!(strict.runtime, Runtime::Runsc);
    // a grandchild inherits it, restates it, but cannot go back to runc
    assert_eq!(
        EnvelopeRequest::default().narrow(&strict).unwrap().runtime,
        Runtime::Runsc
    );
    assert_eq!(runsc.narrow(&strict).unwrap().runtime, Runtime::Runsc);
    let runc = EnvelopeRequest {
        runtime: Some(Runtime::Runc),
        ..Default::default()
    };
    match runc.narrow(&strict) {
        Err(EnvelopeError::Wider { field, .. }) => assert_eq!(field, "runtime"),
        other => panic!("runc under runsc: {other:?}"),
    }
    // nor at the top, under a kernel whose default is runsc
    assert!(matches!(
        runc.resolve_top_level(&strict),
        Err(EnvelopeError::Wider {
            field: "runtime",
            ..
        })
    ));
    // the parent's bridge network is not silently dropped
    let on_bridge = EnvelopeRequest {
        runtime: Some(Runtime::Runsc),
        ..Default::default()
    };
    match on_bridge.narrow(&parent()) {
        Err(EnvelopeError::Invalid(why)) => assert!(why.contains("network \"none\""), "{why}"),
        other => panic!("runsc on a bridge: {other:?}"),
    }
    // the stored form of a runc envelope has no runtime field
    let stored = serde_json::to_value(parent()).unwrap();
    assert!(stored.get("runtime").is_none());
    let stored = serde_json::to_value(&strict).unwrap();
    assert_eq!(stored["runtime"], "runsc");
}
