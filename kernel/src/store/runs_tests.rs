use crate::lifecycle::{KillReason, Outcome};
use crate::runs::{Budget, RunAction, RunState};
use crate::store::{
    test_store, Admission, CreatedRun, ModelUsage, NewOp, NewRun, Refusal, RunChange, Settlement,
    StartRequest, Store,
};

/// A background `true` for `run` (the store's tests share it).
pub(in crate::store) fn start(run: &str) -> StartRequest {
    StartRequest {
        run_id: run.into(),
        scratch_key: "k".into(),
        command: vec!["true".into()],
        background: true,
        timeout_sec: 60,
        io: sandbox::Io::Null,
        idempotency_key: None,
        approval: None,
        schedule_id: None,
        origin: crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
    }
}

async fn run(store: &Store, id: &str, parent: Option<&str>, budget: Budget) {
    let created = store
        .create_run(NewRun {
            run_id: id.into(),
            parent: parent.map(str::to_owned),
            envelope: None,
            budget,
            token_sha256: format!("sha-{id}"),
            idempotency_key: None,
            limits: Admission::UNLIMITED,
            image: None,
            origin: crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
        })
        .await
        .unwrap();
    assert!(matches!(created, CreatedRun::Created(_)), "{created:?}");
}

async fn admit(store: &Store, run: &str) -> Result<crate::store::Op, Refusal> {
    match store
        .insert_op(start(run), Admission::UNLIMITED)
        .await
        .unwrap()
    {
        NewOp::Created(op) => Ok(op),
        NewOp::Refused(r) => Err(r),
        other => panic!("{other:?}"),
    }
}

async fn tokens(store: &Store, run: &str, n: u64) {
    store
        .record_model_usage(
            run,
            ModelUsage {
                model: "m".into(),
                input_tokens: n,
                output_tokens: 0,
                cost_micros: 0,
            },
            None,
        )
        .await
        .unwrap();
}

async fn kinds(store: &Store, run: &str) -> Vec<String> {
    store
        .events_after(run, 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind.name().to_owned())
        .collect()
}

#[tokio::test]
async fn admission_stops_exactly_at_the_limit_of_the_run_or_any_ancestor() {
    let store = test_store().await;
    let limit = Budget {
        tokens: Some(100),
        ..Default::default()
    };
    run(&store, "root", None, limit).await;
    run(&store, "child", Some("root"), Budget::default()).await;
    tokens(&store, "child", 99).await;
    admit(&store, "child").await.unwrap();
    admit(&store, "root").await.unwrap();
    // the child's usage counts against its parent's budget
    tokens(&store, "child", 1).await;
    for who in ["child", "root"] {
        match admit(&store, who).await {
            Err(Refusal::Budget(e)) => {
                assert_eq!(
                    (e.limit, e.max, e.used, e.run_id.as_str()),
                    ("tokens", 100, 100.0, "root")
                );
                assert!(e.to_string().contains("tokens used 100 of 100"), "{e}");
            }
            other => panic!("{who}: {other:?}"),
        }
    }
    // a child run is refused too
    let refused = store
        .create_run(NewRun {
            run_id: "late".into(),
            parent: Some("child".into()),
            envelope: None,
            budget: Budget::default(),
            token_sha256: "sha-late".into(),
            idempotency_key: None,
            limits: Admission::UNLIMITED,
            image: None,
            origin: crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
        })
        .await
        .unwrap();
    assert!(matches!(refused, CreatedRun::Refused(Refusal::Budget(_))));
}

#[tokio::test]
async fn remaining_is_derived_from_the_ledger_never_stored() {
    let store = test_store().await;
    run(
        &store,
        "r",
        None,
        Budget {
            op_seconds: Some(10),
            cpu_seconds: Some(5),
            ..Default::default()
        },
    )
    .await;
    // no column of any table holds a budget counter
    let columns: Vec<String> = store
        .read(|tx| {
            tx.query(
                match tx.dialect() {
                    crate::store::db::Dialect::Sqlite => {
                        "SELECT m.name || '.' || p.name AS col FROM sqlite_master m, \
                         pragma_table_info(m.name) p WHERE m.type = 'table'"
                    }
                    crate::store::db::Dialect::Postgres => {
                        "SELECT CAST(table_name || '.' || column_name AS TEXT) AS col \
                         FROM information_schema.columns WHERE table_schema = 'public'"
                    }
                },
                &[],
            )?
            .iter()
            .map(|r| r.get("col"))
            .collect()
        })
        .await
        .unwrap();
    for c in &columns {
        let words: Vec<&str> = c.split(['.', '_']).collect();
        for counter in ["remaining", "used", "spent", "balance", "left"] {
            assert!(!words.contains(&counter), "a stored counter: {c}");
        }
    }
    // facts written straight into the ledger are what the totals say
    store
        .write(|tx| {
            tx.execute(
                "INSERT INTO usage (run_id, at, source, operation_id, op_ms, cpu_ms) VALUES ('r', 1, 'op', 'a', 4000, 1500)",
                &[],
            )?;
            tx.execute(
                "INSERT INTO usage (run_id, at, source, operation_id, op_ms, cpu_ms) VALUES ('r', 2, 'op', 'b', 2500, NULL)",
                &[],
            )?;
            Ok(())
        })
        .await
        .unwrap();
    let used = store.usage_over_subtree("r").await.unwrap();
    assert_eq!((used.op_ms, used.cpu_ms), (6500, 1500));
    let record = store.get_run("r").await.unwrap().unwrap();
    assert_eq!(
        used.remaining(&record.budget),
        serde_json::json!({"op_seconds": 3.5, "cpu_seconds": 3.5})
    );
    store
        .write(|tx| {
            tx.execute(
                "INSERT INTO usage (run_id, at, source, operation_id, op_ms) VALUES ('r', 3, 'op', 'c', 3500)",
                &[],
            )?;
            Ok(())
        })
        .await
        .unwrap();
    assert!(matches!(admit(&store, "r").await, Err(Refusal::Budget(e)) if e.limit == "op_seconds"));
    // the ledger is append-only
    let update = store
        .write(|tx| tx.execute("UPDATE usage SET op_ms = 0", &[]))
        .await;
    let delete = store.write(|tx| tx.execute("DELETE FROM usage", &[])).await;
    assert!(update.is_err() && delete.is_err());
}

#[tokio::test]
async fn a_settled_op_is_charged_once_with_its_event() {
    let store = test_store().await;
    let op = admit(&store, "r").await.unwrap();
    let started = crate::store::now_ms() - 1500;
    assert!(store.mark_running(&op.id, started).await.unwrap());
    let settle = |exit_code| Settlement {
        outcome: Outcome::Completed {
            exit_code,
            killed: false,
        },
        output_tail: None,
        log: None,
        usage: Some(sandbox::Usage {
            cpu_ms: 700,
            max_rss_kb: 1,
        }),
        // the code record's time, not the (later) settlement's
        leftovers: 0,
        ended_at: Some(started + 1200),
        charge_cap_ms: None,
    };
    assert!(store.settle(&op.id, settle(0)).await.unwrap());
    assert!(!store.settle(&op.id, settle(1)).await.unwrap());
    let used = store.usage_over_subtree("r").await.unwrap();
    assert_eq!(used.cpu_ms, 700);
    assert_eq!(used.op_ms, 1200);
    let events = store.events_after("r", 0, 100).await.unwrap();
    let seen: Vec<&str> = events.iter().map(|e| e.kind.name()).collect();
    assert_eq!(seen, ["tool.started", "tool.completed"]);
    let crate::event_kind::EventKind::ToolCompleted(completed) = &events[1].kind else {
        panic!("not a completion: {:?}", events[1].kind);
    };
    assert_eq!(completed.exit_code, Some(0));
    assert_eq!(completed.cpu_seconds, Some(0.7));
    // an op that never ran is not charged, and its end is a failure
    let never = admit(&store, "r").await.unwrap();
    let failed = Settlement {
        outcome: Outcome::Failed {
            error: "no".into(),
            killed: false,
        },
        output_tail: None,
        log: None,
        usage: None,
        leftovers: 0,
        ended_at: None,
        charge_cap_ms: None,
    };
    assert!(store.settle(&never.id, failed).await.unwrap());
    assert_eq!(store.usage_over_subtree("r").await.unwrap(), used);
    assert_eq!(kinds(&store, "r").await.last().unwrap(), "tool.failed");
    // an op lost without a code after a long outage is charged at most its cap
    let lost = admit(&store, "r").await.unwrap();
    let hour_ago = crate::store::now_ms() - 3_600_000;
    assert!(store.mark_running(&lost.id, hour_ago).await.unwrap());
    let gone = Settlement {
        outcome: Outcome::Lost {
            reason: "gone".into(),
        },
        output_tail: None,
        log: None,
        usage: None,
        leftovers: 0,
        ended_at: None,
        charge_cap_ms: Some(70_000),
    };
    assert!(store.settle(&lost.id, gone).await.unwrap());
    assert_eq!(
        store.usage_over_subtree("r").await.unwrap().op_ms,
        1200 + 70_000
    );
}

#[tokio::test]
async fn cancel_reaches_every_descendant_and_live_op_durably() {
    let store = test_store().await;
    run(&store, "p", None, Budget::default()).await;
    run(&store, "c", Some("p"), Budget::default()).await;
    run(&store, "g", Some("c"), Budget::default()).await;
    run(&store, "other", None, Budget::default()).await;
    let mut live = Vec::new();
    for r in ["p", "c", "g"] {
        live.push(admit(&store, r).await.unwrap().id);
    }
    let bystander = admit(&store, "other").await.unwrap();
    // an op whose kill was already asked keeps its first reason
    store
        .request_kill(&live[0], KillReason::Kill)
        .await
        .unwrap();
    let RunChange::Done {
        run,
        changed,
        kills,
        ..
    } = store
        .change_run("c", RunAction::Cancel, "run:p", None)
        .await
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(run.state, RunState::Cancelled);
    assert_eq!(changed, ["c", "g"]);
    assert_eq!(kills, live[1..]);
    for id in &live[1..] {
        let op = store.get_op(id).await.unwrap().unwrap();
        assert_eq!(op.kill_reason, Some(KillReason::Cancel));
    }
    let op = store.get_op(&live[0]).await.unwrap().unwrap();
    assert_eq!(op.kill_reason, Some(KillReason::Kill));
    let untouched = store.get_op(&bystander.id).await.unwrap().unwrap();
    assert_eq!(untouched.kill_requested_at, None);
    // nothing new below the cancelled run; its parent goes on
    for r in ["c", "g"] {
        assert!(matches!(
            admit(&store, r).await,
            Err(Refusal::State {
                state: RunState::Cancelled,
                ..
            })
        ));
    }
    admit(&store, "p").await.unwrap();
    assert_eq!(kinds(&store, "g").await, ["tool.started", "run.cancelled"]);
    // repeated: nothing changes, no second event
    let RunChange::Done { changed, .. } = store
        .change_run("c", RunAction::Cancel, "run:p", None)
        .await
        .unwrap()
    else {
        panic!()
    };
    assert!(changed.is_empty());
    assert_eq!(kinds(&store, "g").await.len(), 2);
    assert!(matches!(
        store
            .change_run("g", RunAction::Resume, "operator", None)
            .await
            .unwrap(),
        RunChange::Refused(RunState::Cancelled)
    ));
}

#[tokio::test]
async fn complete_waits_for_live_ops_and_pause_blocks_the_subtree() {
    let store = test_store().await;
    run(&store, "p", None, Budget::default()).await;
    run(&store, "c", Some("p"), Budget::default()).await;
    let op = admit(&store, "c").await.unwrap();
    assert!(matches!(
        store
            .change_run("p", RunAction::Complete, "operator", Some("done".into()))
            .await
            .unwrap(),
        RunChange::LiveOps(1)
    ));
    let RunChange::Done { changed, .. } = store
        .change_run("p", RunAction::Pause, "operator", None)
        .await
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(changed, ["p"]);
    // a paused ancestor holds back its descendants too
    match admit(&store, "c").await {
        Err(Refusal::State { run_id, state }) => {
            assert_eq!((run_id.as_str(), state), ("p", RunState::Paused))
        }
        other => panic!("{other:?}"),
    }
    store
        .settle(
            &op.id,
            Settlement {
                outcome: Outcome::Lost { reason: "x".into() },
                output_tail: None,
                log: None,
                usage: None,
                leftovers: 0,
                ended_at: None,
                charge_cap_ms: None,
            },
        )
        .await
        .unwrap();
    let RunChange::Done { run, .. } = store
        .change_run("p", RunAction::Complete, "run:p", Some("all done".into()))
        .await
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(run.state, RunState::Completed);
    assert_eq!(run.summary.as_deref(), Some("all done"));
    assert_eq!(run.decided_by.as_deref(), Some("run:p"));
    assert_eq!(
        kinds(&store, "p").await,
        ["run.child_created", "run.paused", "run.completed"]
    );
}

#[tokio::test]
async fn a_refused_or_rolled_back_change_leaves_no_event() {
    let store = test_store().await;
    run(&store, "r", None, Budget::default()).await;
    store
        .change_run("r", RunAction::Pause, "operator", None)
        .await
        .unwrap();
    assert!(admit(&store, "r").await.is_err());
    assert_eq!(kinds(&store, "r").await, ["run.paused"]);
    // a transaction that fails after appending its event takes it along
    let failed = store
        .write(|tx| {
            let started = crate::event_kind::ToolStarted::default();
            let event = crate::event_kind::EventKind::ToolStarted(started);
            crate::store::journal::append_event(tx, "r", None, event)?;
            tx.execute("INSERT INTO no_such_table VALUES (1)", &[])?;
            Ok(())
        })
        .await;
    assert!(failed.is_err());
    assert_eq!(kinds(&store, "r").await, ["run.paused"]);
}

fn envelope(max_live_ops: u64, max_children: u64) -> crate::runs::Envelope {
    crate::runs::Envelope {
        max_timeout_sec: None,
        memory_bytes: 1 << 30,
        cpus: 1.0,
        pids_limit: 256,
        network: "none".into(),
        max_live_ops,
        max_children,
        approval: Default::default(),
        images: None,
        disk_bytes: None,
        runtime: Default::default(),
    }
}

async fn create_with(
    store: &Store,
    id: &str,
    parent: Option<&str>,
    env: crate::runs::Envelope,
    limits: Admission,
) -> CreatedRun {
    store
        .create_run(NewRun {
            run_id: id.into(),
            parent: parent.map(str::to_owned),
            envelope: Some(env),
            budget: Budget::default(),
            token_sha256: format!("sha-{id}"),
            idempotency_key: None,
            limits,
            image: None,
            origin: crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn envelope_limits_bound_the_whole_subtree() {
    let store = test_store().await;
    let limits = Admission {
        max_live_per_run: 512,
        max_live: 1000,
        max_children: 3,
        implicit_run: true,
    };
    create_with(&store, "top", None, envelope(1, 3), limits).await;
    for c in ["top.a", "top.b", "top.c"] {
        let made = create_with(&store, c, Some("top"), envelope(1, 3), limits).await;
        assert!(matches!(made, CreatedRun::Created(_)), "{made:?}");
    }
    // a fourth unfinished child passes max_children
    match create_with(&store, "top.d", Some("top"), envelope(1, 3), limits).await {
        CreatedRun::Refused(Refusal::Limit(why)) => {
            assert!(
                why.contains("limit 3") && why.contains("max_children"),
                "{why}"
            )
        }
        other => panic!("{other:?}"),
    }
    // one live op in the whole tree: the children's count against the top
    let admitted = |run: &'static str| {
        let store = store.clone();
        async move { store.insert_op(start(run), limits).await.unwrap() }
    };
    assert!(matches!(admitted("top.a").await, NewOp::Created(_)));
    for run in ["top.b", "top.c", "top"] {
        match admitted(run).await {
            NewOp::Refused(Refusal::Limit(why)) => {
                assert!(
                    why.contains("run top ") && why.contains("limit 1"),
                    "{run}: {why}"
                )
            }
            other => panic!("{run}: {other:?}"),
        }
    }
    // a finished child no longer counts against max_children
    store
        .change_run("top.c", RunAction::Cancel, "operator", None)
        .await
        .unwrap();
    let made = create_with(&store, "top.d", Some("top"), envelope(1, 3), limits).await;
    assert!(matches!(made, CreatedRun::Created(_)), "{made:?}");
}

// Two kernels' worth of stores on one database (SPEC §19): each its own
// connection (SQLite) or pool (PostgreSQL), racing admissions and usage
// into one run tree. A tree's limits and budgets hold as with one store.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_admitting_into_one_tree_never_pass_its_live_limit() {
    let (a, b) = crate::store::test_store_pair().await;
    let root = create_with(&a, "root", None, envelope(3, 4), Admission::UNLIMITED).await;
    let child = create_with(
        &b,
        "child",
        Some("root"),
        envelope(3, 4),
        Admission::UNLIMITED,
    )
    .await;
    assert!(matches!(
        (root, child),
        (CreatedRun::Created(_), CreatedRun::Created(_))
    ));
    let tasks: Vec<_> = (0..24)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let run = if i % 3 == 0 { "root" } else { "child" };
            tokio::spawn(async move { admit(&store, run).await.is_ok() })
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        created += t.await.unwrap() as usize;
    }
    assert_eq!(created, 3, "the root's max_live_ops bounds its whole tree");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_racing_usage_and_starts_never_start_past_the_budget() {
    let (a, b) = crate::store::test_store_pair().await;
    let budget = Budget {
        tokens: Some(10),
        ..Budget::default()
    };
    run(&a, "r", None, budget).await;
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                if i % 4 < 2 {
                    tokens(&store, "r", 1).await;
                } else {
                    let _ = admit(&store, "r").await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // the journal in commit order: no start after the tenth token
    let (mut used, mut started) = (0, 0);
    for kind in kinds(&a, "r").await {
        match kind.as_str() {
            "usage.recorded" => used += 1,
            "tool.started" => {
                assert!(used < 10, "an op started with {used} of 10 tokens used");
                started += 1;
            }
            _ => {}
        }
    }
    assert_eq!(used, 20);
    assert!((1..20).contains(&started), "{started} started");
}
