use super::*;
use crate::lifecycle::EFFECT_UNCERTAIN;
use crate::store::test_store;

fn req(key: Option<&str>, cmd: &str) -> StartRequest {
    StartRequest {
        run_id: "r1".into(),
        scratch_key: "k".into(),
        command: vec!["sh".into(), "-c".into(), cmd.into()],
        background: true,
        timeout_sec: 60,
        io: sandbox::Io::Null,
        idempotency_key: key.map(str::to_owned),
        approval: None,
        schedule_id: None,
        origin: crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
    }
}

async fn created(store: &Store, r: StartRequest) -> Op {
    match store.insert_op(r, Admission::UNLIMITED).await.unwrap() {
        NewOp::Created(op) => op,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn idempotency_key_returns_the_same_op_or_conflicts() {
    let store = test_store().await;
    let op = created(&store, req(Some("k1"), "true")).await;
    match store
        .insert_op(req(Some("k1"), "true"), Admission::UNLIMITED)
        .await
        .unwrap()
    {
        NewOp::Existing(again) => assert_eq!(again.id, op.id),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        store
            .insert_op(req(Some("k1"), "false"), Admission::UNLIMITED)
            .await
            .unwrap(),
        NewOp::KeyConflict(_)
    ));
    let other = created(&store, req(None, "true")).await;
    assert_ne!(other.id, op.id);
}

#[tokio::test]
async fn admission_is_checked_in_the_insert_and_retries_pass_it() {
    let store = test_store().await;
    let one = Admission {
        max_live_per_run: 1,
        max_live: 10,
        max_children: 1,
        implicit_run: true,
    };
    let NewOp::Created(a) = store.insert_op(req(Some("k1"), "true"), one).await.unwrap() else {
        panic!()
    };
    // the retry of an admitted start finds its op, limit or not
    match store.insert_op(req(Some("k1"), "true"), one).await.unwrap() {
        NewOp::Existing(again) => assert_eq!(again.id, a.id),
        other => panic!("{other:?}"),
    }
    match store.insert_op(req(Some("k2"), "true"), one).await.unwrap() {
        NewOp::Refused(why) => assert!(why.to_string().contains("limit 1"), "{why}"),
        other => panic!("{other:?}"),
    }
    // concurrent starts cannot pass the limit together
    let store2 = test_store().await;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let s = store2.clone();
            tokio::spawn(async move { s.insert_op(req(None, "true"), one).await.unwrap() })
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        created += matches!(t.await.unwrap(), NewOp::Created(_)) as usize;
    }
    assert_eq!(created, 1);
}

#[tokio::test]
async fn a_kill_before_the_claim_wins() {
    let store = test_store().await;
    let op = created(&store, req(None, "true")).await;
    store.request_kill(&op.id, KillReason::Kill).await.unwrap();
    assert!(!store
        .claim_exec(&op.id, "k", "c1", (false, None))
        .await
        .unwrap());
    let row = store.get_op(&op.id).await.unwrap().unwrap();
    assert_eq!(row.exec_claimed_at, None, "nothing may be executed");
}

#[tokio::test]
async fn exec_claim_is_won_once() {
    let store = test_store().await;
    let op = created(&store, req(None, "true")).await;
    assert!(store
        .claim_exec(&op.id, "k", "c1", (false, None))
        .await
        .unwrap());
    assert!(!store
        .claim_exec(&op.id, "k", "c2", (true, None))
        .await
        .unwrap());
    let row = store.get_op(&op.id).await.unwrap().unwrap();
    assert_eq!((row.attempt, row.container_id.as_deref()), (1, Some("c1")));
    assert!(store.mark_running(&op.id, 5).await.unwrap());
    assert!(!store.mark_running(&op.id, 6).await.unwrap());
    assert_eq!(
        store.get_op(&op.id).await.unwrap().unwrap().started_at,
        Some(5)
    );
}

#[tokio::test]
async fn first_terminal_writer_wins() {
    let store = test_store().await;
    let op = created(&store, req(None, "true")).await;
    let usage = sandbox::Usage {
        cpu_ms: 1500,
        max_rss_kb: 4096,
    };
    let done = |outcome| Settlement {
        outcome,
        output_tail: None,
        log: None,
        usage: Some(usage),
        leftovers: 3,
        ended_at: None,
        charge_cap_ms: None,
    };
    assert!(store
        .settle(
            &op.id,
            done(Outcome::Completed {
                exit_code: 0,
                killed: false
            })
        )
        .await
        .unwrap());
    assert!(!store
        .settle(&op.id, done(Outcome::Lost { reason: "x".into() }))
        .await
        .unwrap());
    let row = store.get_op(&op.id).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.exit_code, row.effect, row.usage),
        (Status::Completed, Some(0), None, Some(usage))
    );
    assert_eq!(row.leftovers, 3, "the leftovers its shim stopped");
    assert!(store
        .begin_attempt(&op.id, "k", AttemptStart::Clean)
        .await
        .unwrap()
        .is_none());
    assert!(store
        .request_kill(&op.id, KillReason::Kill)
        .await
        .unwrap()
        .unwrap()
        .kill_requested_at
        .is_none());
}

#[tokio::test]
async fn lost_is_uncertain_and_has_no_exit_code() {
    let store = test_store().await;
    let op = created(&store, req(None, "true")).await;
    let s = Settlement {
        outcome: Outcome::Lost {
            reason: "gone".into(),
        },
        output_tail: None,
        log: None,
        usage: None,
        leftovers: 0,
        ended_at: None,
        charge_cap_ms: None,
    };
    assert!(store.settle(&op.id, s).await.unwrap());
    let row = store.get_op(&op.id).await.unwrap().unwrap();
    assert_eq!(row.exit_code, None);
    assert_eq!(row.effect.as_deref(), Some(EFFECT_UNCERTAIN));
}

/// A foreground op's result goes one way (SPEC §25): a yielded op is the
/// report's and never marked inline; one that settled before the yield is
/// the caller's and never reported.
#[tokio::test]
async fn a_yielded_result_is_reported_and_never_also_inline() {
    let store = test_store().await;
    let fg = || StartRequest {
        background: false,
        ..req(None, "true")
    };
    let yielded = created(&store, fg()).await;
    let flipped = store
        .yield_to_background(&yielded.id)
        .await
        .unwrap()
        .unwrap();
    assert!(flipped.background && flipped.status == Status::Starting);
    assert!(store
        .yield_to_background(&yielded.id)
        .await
        .unwrap()
        .is_none());
    crate::store::reports::tests::settle(&store, &yielded.id, 0).await;
    assert!(!store.mark_delivered_inline(&yielded.id).await.unwrap());
    let report = store.drain_report("r1").await.unwrap().unwrap();
    let ids: Vec<&str> = report
        .resolved
        .iter()
        .map(|r| r.operation_id.as_str())
        .collect();
    assert_eq!(ids, [yielded.id.as_str()]);

    let inline = created(&store, fg()).await;
    crate::store::reports::tests::settle(&store, &inline.id, 0).await;
    assert!(store
        .yield_to_background(&inline.id)
        .await
        .unwrap()
        .is_none());
    assert!(store.mark_delivered_inline(&inline.id).await.unwrap());
    let row = store.get_op(&inline.id).await.unwrap().unwrap();
    assert!(!row.background && row.delivered_inline && row.report_id.is_none());
}
