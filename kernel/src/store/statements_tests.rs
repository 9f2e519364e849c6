//! A tour of the store: every public method of [`Store`], and the branches
//! of its transaction scripts that run statements of their own (refusals,
//! cascades, finalizations, a purge). `db/pg_tests.rs` runs it on a
//! recording SQLite store and prepares every statement it saw against the
//! PostgreSQL schema, so a statement that is not portable fails a test.

use crate::lifecycle::{KillReason, Outcome};
use crate::runs::{Budget, Envelope, OnTimeout, RunAction};
use crate::store::{
    now_ms, Admission, ApprovalHold, AttemptStart, CreatedRun, ModelUsage, NewOp, NewRun,
    NewSchedule, Op, Settlement, StartRequest, Store,
};
use crate::timing::Timing;
use crate::vals;

const LIMITS: Admission = Admission {
    max_live_per_run: 1000,
    max_live: 1000,
    max_children: 1000,
    implicit_run: false,
};

fn start(run: &str, key: Option<&str>, hold: Option<OnTimeout>) -> StartRequest {
    StartRequest {
        run_id: run.into(),
        scratch_key: "k".into(),
        command: vec!["true".into()],
        background: true,
        timeout_sec: 60,
        io: sandbox::Io::Null,
        idempotency_key: key.map(str::to_owned),
        approval: hold.map(|on_timeout| ApprovalHold {
            rule: "*".into(),
            timeout_sec: Some(0),
            on_timeout,
        }),
        schedule_id: None,
        origin: crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
    }
}

async fn op(store: &Store, req: StartRequest) -> Op {
    match store.insert_op(req, LIMITS).await.unwrap() {
        NewOp::Created(op) | NewOp::Existing(op) => op,
        other => panic!("{other:?}"),
    }
}

fn done(code: i32) -> Settlement {
    Settlement {
        outcome: Outcome::Completed {
            exit_code: code,
            killed: false,
        },
        output_tail: Some("out".into()),
        log: None,
        usage: Some(sandbox::Usage {
            cpu_ms: 5,
            max_rss_kb: 10,
        }),
        leftovers: 0,
        ended_at: None,
        charge_cap_ms: None,
    }
}

async fn create_run(store: &Store, id: &str, parent: Option<&str>) {
    let envelope = Envelope {
        max_timeout_sec: None,
        memory_bytes: 1 << 30,
        cpus: 1.0,
        pids_limit: 256,
        network: "none".into(),
        max_live_ops: 100,
        max_children: 100,
        approval: Default::default(),
        images: None,
        disk_bytes: None,
        runtime: Default::default(),
    };
    let created = store
        .create_run(NewRun {
            run_id: id.into(),
            parent: parent.map(str::to_owned),
            envelope: Some(envelope),
            budget: Budget {
                op_seconds: Some(10_000),
                ..Default::default()
            },
            token_sha256: format!("sha-{id}"),
            idempotency_key: None,
            limits: LIMITS,
            image: None,
            origin: crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
        })
        .await
        .unwrap();
    assert!(matches!(created, CreatedRun::Created(_)), "{created:?}");
}

/// Runs every public method of `store` at least once.
pub(crate) async fn tour(store: &Store) {
    store.register_kernel("k1").await.unwrap();
    runs_and_ops(store).await;
    approvals(store).await;
    reports_and_usage(store).await;
    schedules(store).await;
    changes(store).await;
    snapshots(store).await;
    retention(store).await;
}

/// Snapshots (SPEC §26): recorded once, listed, counted against the
/// chain's `disk_bytes`, forgotten.
async fn snapshots(store: &Store) {
    use crate::store::SnapshotRecorded;
    let made = store.record_snapshot("root.c", "v1", 10).await.unwrap();
    assert_eq!(made, SnapshotRecorded::Made);
    let again = store.record_snapshot("root.c", "v1", 10).await.unwrap();
    assert_eq!(again, SnapshotRecorded::Exists);
    let none = store.record_snapshot("nope", "v1", 10).await.unwrap();
    assert_eq!(none, SnapshotRecorded::NoRun);
    assert_eq!(store.snapshots("root.c").await.unwrap().len(), 1);
    assert_eq!(
        store.snapshot("root.c", "v1").await.unwrap().unwrap().bytes,
        10
    );
    assert!(store.delete_snapshot("root.c", "v1").await.unwrap());
    assert!(store.snapshot("root.c", "v1").await.unwrap().is_none());
    store
        .record_run_event(
            "root",
            crate::event_kind::EventKind::RunForked(Default::default()),
        )
        .await
        .unwrap();
}

async fn runs_and_ops(store: &Store) {
    create_run(store, "root", None).await;
    create_run(store, "root.c", Some("root")).await;
    let again = store.create_run(NewRun {
        run_id: "root".into(),
        parent: None,
        envelope: None,
        budget: Budget::default(),
        token_sha256: "x".into(),
        idempotency_key: None,
        limits: LIMITS,
        image: None,
        origin: crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
    });
    assert!(matches!(again.await.unwrap(), CreatedRun::Exists(_)));
    assert!(store.rekey_run("root", "sha-root-2").await.unwrap());
    store.get_run("root").await.unwrap().unwrap();
    store.ensure_run("solo", None).await.unwrap();
    store.children("root").await.unwrap();
    store.list_runs(None, 10).await.unwrap();
    store.list_runs(Some("root".into()), 10).await.unwrap();
    store.tightest_budget("root.c").await.unwrap();
    store.run_for_token("sha-root-2").await.unwrap().unwrap();
    store.mark_run_finished("root").await.unwrap();
    store.run_finished("root").await.unwrap();
    let a = op(store, start("root.c", Some("a"), None)).await;
    op(store, start("root.c", Some("a"), None)).await;
    let mut conflict = start("root.c", Some("a"), None);
    conflict.timeout_sec = 61;
    let conflict = store.insert_op(conflict, LIMITS).await.unwrap();
    assert!(matches!(conflict, NewOp::KeyConflict(_)), "{conflict:?}");
    assert!(store
        .claim_exec(&a.id, "k1", "c1", (true, None))
        .await
        .unwrap());
    store.set_container(&a.id, "c2").await.unwrap();
    let pid = sandbox::PidRecord {
        pid: 7,
        start_ticks: 8,
        hostname: "h".into(),
    };
    store
        .mark_running_with_pid(&a.id, now_ms(), Some(pid.clone()))
        .await
        .unwrap();
    let b = op(store, start("root.c", None, None)).await;
    store.mark_running(&b.id, now_ms()).await.unwrap();
    store.reset_failed_attempts(&a.id).await.unwrap();
    store.record_exec(&a.id, "e1").await.unwrap();
    store.record_kill_intent(&a.id).await.unwrap();
    store.record_signalled(&a.id).await.unwrap();
    store.record_pid(&a.id, &pid).await.unwrap();
    for attempt in [
        AttemptStart::Clean,
        AttemptStart::AfterFailureInARow,
        AttemptStart::AfterIsolatedFailure,
    ] {
        store.begin_attempt(&a.id, "k1", attempt).await.unwrap();
    }
    store.heartbeat("k1").await.unwrap();
    store.request_kill(&a.id, KillReason::Kill).await.unwrap();
    store.observed_op_ids().await.unwrap();
    store.get_op(&a.id).await.unwrap().unwrap();
    store.live_ops().await.unwrap();
    store.observed_ops().await.unwrap();
    store.list_live_ops(None, 10).await.unwrap();
    store
        .list_live_ops(Some("root.c".into()), 10)
        .await
        .unwrap();
    store.list_ops(Some("root.c".into()), 10).await.unwrap();
    store.run_ops_live("root.c").await.unwrap();
    assert!(store.settle(&a.id, done(0)).await.unwrap());
    assert!(store.settle(&b.id, done(1)).await.unwrap());
    store.run_delivered("root.c").await.unwrap();
    store.run_last_activity("root.c").await.unwrap();
    let mut fg = start("solo", None, None);
    fg.background = false;
    let fg = op(store, fg).await;
    store.mark_running(&fg.id, now_ms()).await.unwrap();
    store.settle(&fg.id, done(0)).await.unwrap();
    store.mark_delivered_inline(&fg.id).await.unwrap();
}

async fn approvals(store: &Store) {
    let held = op(store, start("root.c", None, Some(OnTimeout::Escalate))).await;
    store.waiting_ops(None).await.unwrap();
    store.waiting_ops(Some("root".into())).await.unwrap();
    assert_eq!(store.approval_timeouts().await.unwrap().len(), 1);
    store.approve_op(&held.id).await.unwrap().unwrap().unwrap();
    let held = op(store, start("root.c", None, Some(OnTimeout::Deny))).await;
    assert_eq!(store.approval_timeouts().await.unwrap().len(), 1);
    assert!(!store.deny_op(&held.id, "no", "operator").await.unwrap());
    let held = op(store, start("root.c", None, Some(OnTimeout::Escalate))).await;
    assert!(store.deny_op(&held.id, "no", "operator").await.unwrap());
}

async fn reports_and_usage(store: &Store) {
    let usage = ModelUsage {
        model: "m".into(),
        input_tokens: 1,
        output_tokens: 2,
        cost_micros: 3,
    };
    for _ in 0..2 {
        let key = Some("u".to_owned());
        store
            .record_model_usage("root.c", usage.clone(), key)
            .await
            .unwrap();
    }
    store.usage_over_subtree("root").await.unwrap();
    let last = store.last_event_seq("root.c").await.unwrap();
    store.events_tail("root.c", 5, last).await.unwrap();
    store.events_after("root.c", 0, 5).await.unwrap();
    store.add_note("root.c", "hello").await.unwrap().unwrap();
    assert!(store.has_pending("root.c").await.unwrap());
    let report = store.drain_report("root.c").await.unwrap().unwrap();
    store.drain_report("root.c").await.unwrap().unwrap();
    store.recent_reports("root.c", 5).await.unwrap();
    let id = report.report_id.unwrap();
    assert!(store.ack_report("root.c", &id).await.unwrap());
    store.empty_report("root.c").await.unwrap();
    store.run_ops("root.c").await.unwrap();
}

/// Writes `value` into a schedule row as `sql` says (as a torn write, a
/// hand edit or the clock passing would).
async fn poke(store: &Store, sql: &'static str, id: &str, value: i64) {
    let id = id.to_owned();
    let poked = store.write(move |tx| tx.execute(sql, vals![&id, value]));
    assert_eq!(poked.await.unwrap(), 1, "{sql}");
}

/// Moves a schedule's next due time into the past.
async fn make_due(store: &Store, id: &str) -> i64 {
    let due = now_ms() - 120_000;
    poke(
        store,
        "UPDATE schedules SET next_due_at = ?2 WHERE id = ?1",
        id,
        due,
    )
    .await;
    due
}

async fn schedules(store: &Store) {
    let every = |run: &str| NewSchedule {
        run_id: run.into(),
        command: vec!["true".into()],
        timeout_sec: 60,
        timing: Timing::Every { seconds: 60 },
        catch_up: false,
        delete_after_success: true,
    };
    let s = store
        .create_schedule(every("root.c"))
        .await
        .unwrap()
        .unwrap();
    store.get_schedule(&s.id).await.unwrap().unwrap();
    store.list_schedules(None).await.unwrap();
    store.list_schedules(Some("root".into())).await.unwrap();
    store.pause_schedule(&s.id, true).await.unwrap();
    make_due(store, &s.id).await;
    store.pause_schedule(&s.id, false).await.unwrap();
    store.due_schedules(now_ms(), 10).await.unwrap();
    store.next_schedule_due().await.unwrap();
    // fired, adopted by a new kernel, finalized with its missed slots
    let due = make_due(store, &s.id).await;
    let fire = store.fire_schedule(&s.id, due, "k1", None, LIMITS);
    let crate::store::Fire::Fired(fired) = fire.await.unwrap() else {
        panic!("not fired")
    };
    // a claim torn from its live op: the due time's op is adopted
    poke(
        store,
        "UPDATE schedules SET claimed_at = NULL, next_due_at = ?2 WHERE id = ?1",
        &s.id,
        due,
    )
    .await;
    let fire = store.fire_schedule(&s.id, due, "k1", None, LIMITS);
    assert!(matches!(
        fire.await.unwrap(),
        crate::store::Fire::Adopted(_)
    ));
    store.schedules_at_start("k2").await.unwrap();
    store.settle(&fired.id, done(0)).await.unwrap();
    // a claim without an op is cleared at start; an overdue one skipped
    poke(
        store,
        "UPDATE schedules SET claimed_at = ?2 WHERE id = ?1",
        &s.id,
        1,
    )
    .await;
    store.schedules_at_start("k2").await.unwrap();
    make_due(store, &s.id).await;
    store.schedules_at_start("k2").await.unwrap();
    // refused while its run is paused
    let due = make_due(store, &s.id).await;
    let pause = store.change_run("root.c", RunAction::Pause, "operator", None);
    pause.await.unwrap();
    let fire = store.fire_schedule(&s.id, due, "k1", None, LIMITS);
    assert!(matches!(
        fire.await.unwrap(),
        crate::store::Fire::Skipped(_)
    ));
    // a one-shot refused for a passing reason waits; deleted after success
    let mut once = every("root.c");
    once.timing = Timing::At { at_ms: now_ms() };
    let once = store.create_schedule(once).await.unwrap().unwrap();
    let due = make_due(store, &once.id).await;
    let fire = store.fire_schedule(&once.id, due, "k1", None, LIMITS);
    assert!(matches!(
        fire.await.unwrap(),
        crate::store::Fire::Skipped(_)
    ));
    let resume = store.change_run("root.c", RunAction::Resume, "operator", None);
    resume.await.unwrap();
    let due = make_due(store, &once.id).await;
    let fire = store.fire_schedule(&once.id, due, "k1", None, LIMITS);
    let crate::store::Fire::Fired(fired) = fire.await.unwrap() else {
        panic!("not fired")
    };
    store.settle(&fired.id, done(0)).await.unwrap();
    assert!(store.delete_schedule(&s.id).await.unwrap());
}

async fn changes(store: &Store) {
    create_run(store, "root.d", Some("root")).await;
    let by_child = store.change_run("root.d", RunAction::Pause, "run:root.d", None);
    by_child.await.unwrap();
    let take_over = store.change_run("root.d", RunAction::Pause, "operator", None);
    take_over.await.unwrap();
    let resume = store.change_run("root.d", RunAction::Resume, "operator", None);
    resume.await.unwrap();
    let s = NewSchedule {
        run_id: "root.d".into(),
        command: vec!["true".into()],
        timeout_sec: 60,
        timing: Timing::Every { seconds: 60 },
        catch_up: false,
        delete_after_success: false,
    };
    store.create_schedule(s.clone()).await.unwrap().unwrap();
    let complete = store.change_run("root.d", RunAction::Complete, "operator", Some("ok".into()));
    complete.await.unwrap();
    // a fire for a run that is over ends its schedule
    create_run(store, "root.e", Some("root")).await;
    let e = NewSchedule {
        run_id: "root.e".into(),
        ..s
    };
    let e = store.create_schedule(e).await.unwrap().unwrap();
    let cancel = store.change_run("root.e", RunAction::Cancel, "operator", None);
    cancel.await.unwrap();
    let due = make_due(store, &e.id).await;
    poke(
        store,
        "UPDATE schedules SET enabled = ?2 WHERE id = ?1",
        &e.id,
        1,
    )
    .await;
    let fire = store.fire_schedule(&e.id, due, "k1", None, LIMITS);
    assert!(matches!(
        fire.await.unwrap(),
        crate::store::Fire::Skipped(_)
    ));
    // a cancel from the root: kills, denials and schedules of the subtree
    op(store, start("root.c", None, None)).await;
    op(store, start("root.c", None, Some(OnTimeout::Escalate))).await;
    let cancel = store.change_run("root", RunAction::Cancel, "operator", None);
    cancel.await.unwrap();
}

async fn retention(store: &Store) {
    let gone = op(store, start("solo", None, None)).await;
    store.mark_running(&gone.id, now_ms()).await.unwrap();
    store.settle(&gone.id, done(0)).await.unwrap();
    let report = store.drain_report("solo").await.unwrap().unwrap();
    let id = report.report_id.unwrap();
    store.ack_report("solo", &id).await.unwrap();
    let later = now_ms() + 3_600_000;
    for p in store.prunable_ops(later, 100).await.unwrap() {
        store.mark_files_pruned(&p.id).await.unwrap();
    }
    store.files_pruned_at(&gone.id).await.unwrap().unwrap();
    store.live_work().await.unwrap();
    let purged = store.purge_finished_trees(later, 10, "k1").await.unwrap();
    assert!(purged.iter().any(|t| t.root == "solo"), "{purged:?}");
    store.kernel_journal(0, 10).await.unwrap();
}

/// A NUL in text (a command's output, a note, a summary) is stored as
/// U+FFFD on both stores: PostgreSQL's text cannot hold it, and an op whose
/// output tail held one must still settle.
#[tokio::test]
async fn a_nul_in_text_is_stored_as_a_replacement_character() {
    let store = crate::store::test_store().await;
    let summary: String = store
        .write(|tx| {
            tx.execute(
                "INSERT INTO runs (run_id, created_at, summary) VALUES ('r', 1, ?1)",
                vals!["out\0put"],
            )?;
            tx.query_one("SELECT summary FROM runs WHERE run_id = 'r'", &[])?
                .get("summary")
        })
        .await
        .unwrap();
    assert_eq!(summary, "out\u{FFFD}put");
}
