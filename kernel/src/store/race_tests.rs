//! Two kernels' worth of stores on one database (SPEC §19): each its own
//! connection (SQLite) or pool (PostgreSQL), racing admissions and usage
//! into one run tree. A tree's limits and budgets hold as with one store.

use crate::runs::{Budget, Envelope};
use crate::store::{
    test_store_pair, Admission, CreatedRun, ModelUsage, NewOp, NewRun, StartRequest, Store,
};

fn start(run: &str) -> StartRequest {
    StartRequest {
        run_id: run.into(),
        scratch_key: "k".into(),
        command: vec!["true".into()],
        background: true,
        timeout_sec: 60,
        idempotency_key: None,
        approval: None,
        schedule_id: None,
    }
}

async fn create(store: &Store, id: &str, parent: Option<&str>, max_live_ops: u64, budget: Budget) {
    let envelope = Envelope {
        max_timeout_sec: None,
        memory_bytes: 1 << 30,
        cpus: 1.0,
        pids_limit: 256,
        network: "none".into(),
        max_live_ops,
        max_children: 4,
        approval: Default::default(),
    };
    let created = store
        .create_run(NewRun {
            run_id: id.into(),
            parent: parent.map(str::to_owned),
            envelope: Some(envelope),
            budget,
            token_sha256: format!("sha-{id}"),
            idempotency_key: None,
            limits: Admission::UNLIMITED,
        })
        .await
        .unwrap();
    assert!(matches!(created, CreatedRun::Created(_)), "{created:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_admitting_into_one_tree_never_pass_its_live_limit() {
    let (a, b) = test_store_pair().await;
    create(&a, "root", None, 3, Budget::default()).await;
    create(&b, "child", Some("root"), 3, Budget::default()).await;
    let tasks: Vec<_> = (0..24)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let run = if i % 3 == 0 { "root" } else { "child" };
            tokio::spawn(async move { store.insert_op(start(run), Admission::UNLIMITED).await })
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        created += matches!(t.await.unwrap().unwrap(), NewOp::Created(_)) as usize;
    }
    assert_eq!(created, 3, "the root's max_live_ops bounds its whole tree");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_racing_usage_and_starts_never_start_past_the_budget() {
    let (a, b) = test_store_pair().await;
    let budget = Budget {
        tokens: Some(10),
        ..Budget::default()
    };
    create(&a, "r", None, 1000, budget).await;
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                if i % 4 < 2 {
                    let usage = ModelUsage {
                        model: "m".into(),
                        input_tokens: 1,
                        output_tokens: 0,
                        cost_micros: 0,
                    };
                    store.record_model_usage("r", usage, None).await.map(drop)
                } else {
                    store
                        .insert_op(start("r"), Admission::UNLIMITED)
                        .await
                        .map(drop)
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    // the journal in commit order: no start after the tenth token
    let mut used = 0;
    let mut started = 0;
    for e in a.events_after("r", 0, 1000).await.unwrap() {
        match e.kind.name() {
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
