use crate::lifecycle::Outcome;
use crate::runs::{Budget, RunAction};
use crate::store::{test_store, Admission, NewOp, NewRun, Settlement, StartRequest, Store};

fn start(run: &str, background: bool) -> StartRequest {
    StartRequest {
        run_id: run.into(),
        scratch_key: format!("key-{run}"),
        command: vec!["true".into()],
        background,
        timeout_sec: 60,
        io: sandbox::Io::Null,
        idempotency_key: None,
        approval: None,
        schedule_id: None,
        origin: crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
    }
}

fn done() -> Settlement {
    Settlement {
        outcome: Outcome::Completed {
            exit_code: 0,
            killed: false,
        },
        output_tail: Some("tail".into()),
        log: None,
        usage: Some(sandbox::Usage {
            cpu_ms: 5,
            max_rss_kb: 1,
        }),
        leftovers: 0,
        ended_at: None,
        charge_cap_ms: None,
    }
}

async fn op(store: &Store, run: &str, background: bool) -> String {
    let NewOp::Created(op) = store
        .insert_op(start(run, background), Admission::UNLIMITED)
        .await
        .unwrap()
    else {
        panic!()
    };
    op.id
}

async fn child(store: &Store, id: &str, parent: &str) {
    store
        .create_run(NewRun {
            run_id: id.into(),
            parent: Some(parent.into()),
            envelope: None,
            budget: Budget::default(),
            token_sha256: format!("sha-{id}"),
            idempotency_key: None,
            limits: Admission::UNLIMITED,
            image: None,
            origin: crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
        })
        .await
        .unwrap();
}

async fn count(store: &Store, sql: &'static str) -> i64 {
    store.read(move |tx| tx.scalar(sql, &[])).await.unwrap()
}

#[tokio::test]
async fn only_delivered_ops_files_may_go() {
    let store = test_store().await;
    let fg = op(&store, "r", false).await;
    let bg = op(&store, "r", true).await;
    let live = op(&store, "r", true).await;
    for id in [&fg, &bg] {
        assert!(store.settle(id, done()).await.unwrap());
    }
    let later = crate::store::now_ms() + 1000;
    let ids =
        |list: Vec<crate::store::PrunableOp>| list.into_iter().map(|p| p.id).collect::<Vec<_>>();
    // the background result is not delivered yet; the live op never goes
    let first = ids(store.prunable_ops(later, 100).await.unwrap());
    assert_eq!(first, std::slice::from_ref(&fg));
    let report = store.drain_report("r").await.unwrap().unwrap();
    assert_eq!(report.resolved.len(), 1);
    let mut got = ids(store.prunable_ops(later, 100).await.unwrap());
    got.sort();
    let mut want = vec![fg.clone(), bg.clone()];
    want.sort();
    assert_eq!(got, want);
    // nothing is older than a cutoff in the past
    assert!(store.prunable_ops(0, 100).await.unwrap().is_empty());
    store.mark_files_pruned(&fg).await.unwrap();
    assert!(store.files_pruned_at(&fg).await.unwrap().is_some());
    assert_eq!(store.files_pruned_at(&live).await.unwrap(), None);
    assert_eq!(ids(store.prunable_ops(later, 100).await.unwrap()), [bg]);
}

#[tokio::test]
async fn a_finished_tree_is_purged_whole_and_recorded() {
    let store = test_store().await;
    store.ensure_run("keep", None).await.unwrap();
    let kept = op(&store, "keep", true).await;
    store.ensure_run("gone", None).await.unwrap();
    child(&store, "gone.c", "gone").await;
    let a = op(&store, "gone", true).await;
    let b = op(&store, "gone.c", true).await;
    for id in [&a, &b] {
        assert!(store.settle(id, done()).await.unwrap());
    }
    store.add_note("gone", "hello").await.unwrap();
    let later = crate::store::now_ms() + 1000;
    // undelivered results and an unacked report keep the tree
    assert!(store
        .purge_finished_trees(later, 10, "k")
        .await
        .unwrap()
        .is_empty());
    for run in ["gone", "gone.c"] {
        let r = store.drain_report(run).await.unwrap().unwrap();
        assert!(store
            .purge_finished_trees(later, 10, "k")
            .await
            .unwrap()
            .is_empty());
        assert!(store
            .ack_report(run, r.report_id.as_deref().unwrap())
            .await
            .unwrap());
    }
    store
        .change_run("gone", RunAction::Cancel, "operator", None)
        .await
        .unwrap();
    // recent activity keeps it too
    assert!(store
        .purge_finished_trees(0, 10, "k")
        .await
        .unwrap()
        .is_empty());
    // and files not yet pruned (they would be left without their rows)
    assert!(store
        .purge_finished_trees(later + 1000, 10, "k")
        .await
        .unwrap()
        .is_empty());
    for id in [&a, &b] {
        store.mark_files_pruned(id).await.unwrap();
    }
    let purged = store
        .purge_finished_trees(later + 1000, 10, "k")
        .await
        .unwrap();
    assert_eq!(purged.len(), 1, "{purged:?}");
    assert_eq!(purged[0].root, "gone");
    assert_eq!(purged[0].runs, ["gone", "gone.c"]);
    assert_eq!(purged[0].ops, 2);
    for sql in [
        "SELECT COUNT(*) FROM ops WHERE run_id LIKE 'gone%'",
        "SELECT COUNT(*) FROM events WHERE run_id LIKE 'gone%'",
        "SELECT COUNT(*) FROM usage WHERE run_id LIKE 'gone%'",
        "SELECT COUNT(*) FROM reports WHERE run_id LIKE 'gone%'",
        "SELECT COUNT(*) FROM notes WHERE run_id LIKE 'gone%'",
        "SELECT COUNT(*) FROM runs WHERE run_id LIKE 'gone%'",
        "SELECT COUNT(*) FROM run_ancestry WHERE run_id LIKE 'gone%'",
        "SELECT COUNT(*) FROM purging",
    ] {
        assert_eq!(count(&store, sql).await, 0, "{sql}");
    }
    // the live tree is untouched, and the purge is in the kernel journal
    assert!(store.get_op(&kept).await.unwrap().is_some());
    let journal = store.kernel_journal(0, 10).await.unwrap();
    assert_eq!(journal.len(), 1);
    assert_eq!(journal[0].2, "run_tree.purged");
    assert!(
        journal[0].3.contains("\"root\":\"gone\""),
        "{}",
        journal[0].3
    );
}

#[tokio::test]
async fn the_append_only_tables_give_up_rows_only_to_a_purge() {
    let store = test_store().await;
    store.ensure_run("r", None).await.unwrap();
    let id = op(&store, "r", true).await;
    store.settle(&id, done()).await.unwrap();
    let usage = crate::store::ModelUsage {
        model: "m".into(),
        input_tokens: 1,
        output_tokens: 1,
        cost_micros: 0,
    };
    store.record_model_usage("r", usage, None).await.unwrap();
    store
        .write(|tx| {
            tx.execute(
                "INSERT INTO kernel_journal (at, kind) VALUES (1, 'test')",
                &[],
            )
        })
        .await
        .unwrap();
    for sql in [
        "DELETE FROM events",
        "DELETE FROM usage",
        "UPDATE events SET kind = 'x'",
        "DELETE FROM kernel_journal",
    ] {
        let err = store
            .write(move |tx| tx.execute(sql, &[]))
            .await
            .expect_err(sql);
        assert!(err.to_string().contains("append-only"), "{sql}: {err}");
    }
    assert!(count(&store, "SELECT COUNT(*) FROM events").await > 0);
}

#[tokio::test]
async fn a_run_tokens_start_never_brings_a_purged_run_back() {
    let store = test_store().await;
    let token_start = Admission {
        implicit_run: false,
        ..Admission::UNLIMITED
    };
    // the run token was checked, then its (quiet, finished) tree purged:
    // the start finds no run and creates none
    match store
        .insert_op(start("gone.c", true), token_start)
        .await
        .unwrap()
    {
        NewOp::Refused(crate::store::Refusal::NoRun(run)) => assert_eq!(run, "gone.c"),
        other => panic!("{other:?}"),
    }
    assert!(store.get_run("gone.c").await.unwrap().is_none());
    // the operator's implicit run is still made
    op(&store, "fresh", true).await;
    assert!(store.get_run("fresh").await.unwrap().is_some());
}

/// SPEC §24: a tree whose ops ran on a node that is now dead is purged by
/// a live node: their files are out of its reach (marked, not removed),
/// and another live node's ops are never its business (before, only the
/// node's own ops were ever marked, so such a tree stayed for ever).
#[tokio::test]
async fn a_tree_that_ran_on_a_dead_node_is_purged_by_a_live_one() {
    let store = test_store().await;
    let store = store
        .with_options(crate::store::StoreOptions {
            node: Some("n1".into()),
            ..Default::default()
        })
        .await;
    store.join_node("n1", "http://n1:1", 60_000).await.unwrap();
    let id = op(&store, "r", false).await;
    assert!(store.settle(&id, done()).await.unwrap());
    let later = crate::store::now_ms() + 1000;
    let mine = store.prunable_ops(later, 100).await.unwrap();
    assert_eq!(mine.len(), 1);
    assert!(mine[0].local, "n1's own op: its files are on n1's disk");
    let sql = "UPDATE ops SET node = 'n9'";
    store
        .write(move |tx| tx.execute(sql, &[]).map(|_| ()))
        .await
        .unwrap();
    assert!(
        store.prunable_ops(later, 100).await.unwrap().is_empty(),
        "a live (or unknown) node's op is its own business"
    );
    let sql = "INSERT INTO nodes (name, advertise_url, epoch, lease_until, renewed_at, joined_at, state) \
               VALUES ('n9', 'http://n9:1', 2, 0, 0, 0, 'dead')";
    store
        .write(move |tx| tx.execute(sql, &[]).map(|_| ()))
        .await
        .unwrap();
    let foreign = store.prunable_ops(later, 100).await.unwrap();
    assert_eq!(foreign.len(), 1);
    assert!(!foreign[0].local, "a dead node's files are out of reach");
    store.mark_files_pruned(&id).await.unwrap();
    let purged = store
        .purge_finished_trees(later + 1, 10, "k")
        .await
        .unwrap();
    assert_eq!(purged.len(), 1, "{purged:?}");
}
