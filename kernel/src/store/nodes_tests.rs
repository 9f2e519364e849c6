//! The cluster's membership, fencing, sweep and placement (SPEC §20), on
//! the suite's store (both dialects: `scripts/test.sh` runs these on
//! PostgreSQL too).

use crate::lifecycle::Status;
use crate::store::runs::tests::start;
use crate::store::{test_store, Admission, NewOp, Op, Store, StoreOptions};

async fn admit(store: &Store, run: &str) -> Op {
    match store
        .insert_op(start(run), Admission::UNLIMITED)
        .await
        .unwrap()
    {
        NewOp::Created(op) => op,
        other => panic!("{other:?}"),
    }
}

/// `node` at `epoch` as the sweeping judge, with no hold required.
fn judge(node: &str, epoch: i64) -> crate::store::Judge {
    crate::store::Judge {
        node: node.to_owned(),
        epoch,
        held_ms: 0,
    }
}

/// The store opened as node `me`, with `me` joined (and its epoch).
async fn node(store: &Store, me: &str, ttl_ms: i64) -> (Store, i64) {
    let store = store
        .with_options(StoreOptions {
            node: Some(me.to_owned()),
            ..StoreOptions::default()
        })
        .await;
    let epoch = store
        .join_node(me, &format!("http://{me}:7878"), ttl_ms)
        .await
        .unwrap();
    (store, epoch)
}

#[tokio::test]
async fn a_lease_fences_claims_and_a_lapsed_node_is_swept_once() {
    let store = test_store().await;
    let (store, epoch) = node(&store, "n1", 60_000).await;
    assert_eq!(epoch, 1);
    let a = admit(&store, "ra").await;
    assert_eq!(a.node.as_deref(), Some("n1"));
    let b = admit(&store, "ra").await;
    // only the node's current epoch claims, and only its own ops
    let fence = |node: &str, epoch| Some((node.to_owned(), epoch));
    assert!(!store
        .claim_exec(&a.id, "k", "c", (false, fence("n1", 0)))
        .await
        .unwrap());
    assert!(!store
        .claim_exec(&a.id, "k", "c", (false, fence("n2", 1)))
        .await
        .unwrap());
    assert!(store
        .claim_exec(&a.id, "k", "c", (false, fence("n1", epoch)))
        .await
        .unwrap());
    assert!(store
        .renew_lease("n1", epoch, 60_000, (3, 0))
        .await
        .unwrap());
    // the lease lapses: renewals fail, the sweep declares it dead once and
    // settles its ops: the claimed one lost, the unclaimed one failed
    assert!(store.renew_lease("n1", epoch, -1, (3, 0)).await.unwrap());
    assert!(!store
        .renew_lease("n1", epoch, 60_000, (3, 0))
        .await
        .unwrap());
    // the judge: a node with a live lease, joined long enough; a judge
    // whose own lease lapsed, or not held a whole TTL, sweeps nobody, and
    // no node sweeps itself
    let j = store.join_node("j", "http://j:7878", 60_000).await.unwrap();
    assert!(store
        .sweep_nodes(judge("n1", epoch))
        .await
        .unwrap()
        .is_empty());
    let unheld = crate::store::Judge {
        held_ms: 60_000,
        ..judge("j", j)
    };
    assert!(store.sweep_nodes(unheld).await.unwrap().is_empty());
    assert!(store
        .sweep_nodes(judge("j", j + 1))
        .await
        .unwrap()
        .is_empty());
    let swept = store.sweep_nodes(judge("j", j)).await.unwrap();
    assert_eq!(swept.len(), 1);
    assert_eq!(swept[0].settled.len(), 2);
    assert!(
        store.sweep_nodes(judge("j", j)).await.unwrap().is_empty(),
        "swept twice"
    );
    store.drain_node("j").await.unwrap();
    let a = store.get_op(&a.id).await.unwrap().unwrap();
    let b = store.get_op(&b.id).await.unwrap().unwrap();
    assert_eq!(
        (a.status, a.effect.as_deref()),
        (Status::Lost, Some("uncertain"))
    );
    assert_eq!(a.error.as_deref(), Some("node n1 lost"));
    assert_eq!(
        (b.status, b.error.as_deref()),
        (Status::Failed, Some("node lost before start"))
    );
    // a fenced claim after the sweep: nothing
    let c = {
        // the run is placed again: on no node (n1 is dead)
        let refused = store
            .insert_op(start("ra"), Admission::UNLIMITED)
            .await
            .unwrap();
        assert!(
            matches!(refused, NewOp::Refused(crate::store::Refusal::NoNode(_))),
            "{refused:?}"
        );
        // n1 rejoins with a new epoch, and the run lands on it again
        let again = store
            .join_node("n1", "http://n1:7878", 60_000)
            .await
            .unwrap();
        assert_eq!(again, epoch + 2, "join and death each bump the epoch");
        admit(&store, "ra").await
    };
    assert_eq!(c.node.as_deref(), Some("n1"));
    let nodes = store.nodes().await.unwrap();
    let n1 = nodes.iter().find(|n| n.name == "n1").unwrap();
    assert_eq!(
        (nodes.len(), n1.state.as_str(), n1.live_ops),
        (2, "active", 1)
    );
}

#[tokio::test]
async fn a_tree_is_placed_on_the_least_loaded_active_node_and_stays_there() {
    let store = test_store().await;
    let (store, _) = node(&store, "n1", 60_000).await;
    store
        .join_node("n2", "http://n2:7878", 60_000)
        .await
        .unwrap();
    let first = admit(&store, "r1").await;
    let second = admit(&store, "r2").await;
    assert_ne!(
        first.node, second.node,
        "the second run goes to the idle node"
    );
    // the tree stays where it was placed
    assert_eq!(admit(&store, "r1").await.node, first.node);
    // a draining node takes no new run, but keeps its own
    let drained = first.node.clone().unwrap();
    assert!(store.drain_node(&drained).await.unwrap());
    assert!(!store.drain_node(&drained).await.unwrap());
    assert_eq!(admit(&store, "r1").await.node, first.node);
    let r3 = admit(&store, "r3").await;
    assert_ne!(r3.node.as_deref(), Some(drained.as_str()));
    let rows = store.nodes().await.unwrap();
    assert_eq!(
        rows.iter().find(|n| n.name == drained).unwrap().state,
        "draining"
    );
    // drained, then active again: it takes new trees again
    assert!(store.activate_node(&drained).await.unwrap());
    assert!(!store.activate_node(&drained).await.unwrap());
    assert!(store.drain_node(&drained).await.unwrap());
    // a node with a free warm-pool container is preferred for a new tree
    let epoch = store
        .join_node("n3", "http://n3:7878", 60_000)
        .await
        .unwrap();
    assert!(store
        .renew_lease("n3", epoch, 60_000, (2, 1))
        .await
        .unwrap());
    assert_eq!(admit(&store, "r4").await.node.as_deref(), Some("n3"));
}

#[tokio::test]
async fn a_refusal_for_want_of_a_node_writes_nothing_and_leftovers_are_swept() {
    let store = test_store().await;
    // a single kernel's live op, unplaced: joining takes nothing (SPEC
    // §24); the node whose disk holds its files takes it over, once
    let legacy = admit(&store, "old").await;
    assert_eq!(legacy.node, None);
    let (store, _) = node(&store, "n1", 60_000).await;
    let unplaced = store.unplaced_ops().await.unwrap();
    assert_eq!(unplaced.len(), 1);
    assert_eq!(store.get_op(&legacy.id).await.unwrap().unwrap().node, None);
    assert!(store.take_over_op(&legacy.id, false).await.unwrap());
    assert!(!store.take_over_op(&legacy.id, false).await.unwrap());
    let legacy = store.get_op(&legacy.id).await.unwrap().unwrap();
    assert_eq!(legacy.node.as_deref(), Some("n1"));
    assert_eq!(
        store.get_run("old").await.unwrap().unwrap().node.as_deref(),
        Some("n1")
    );
    // no node can take a new tree: refused, and no run row left behind
    assert!(store.drain_node("n1").await.unwrap());
    let refused = store
        .insert_op(start("new"), Admission::UNLIMITED)
        .await
        .unwrap();
    assert!(
        matches!(refused, NewOp::Refused(crate::store::Refusal::NoNode(_))),
        "{refused:?}"
    );
    assert!(
        store.get_run("new").await.unwrap().is_none(),
        "a refused admission wrote its run"
    );
    // n2 active; n1's lease lapses and it is swept; an op that reached n1
    // in the moment of its sweep (placed, then committed after the sweep)
    // is settled by the next sweep round
    let n2 = store
        .join_node("n2", "http://n2:7878", 60_000)
        .await
        .unwrap();
    let late = admit(&store, "late").await;
    assert_eq!(late.node.as_deref(), Some("n2"));
    store.renew_lease("n1", 1, -1, (0, 0)).await.unwrap();
    assert_eq!(store.sweep_nodes(judge("n2", n2)).await.unwrap().len(), 1);
    let id = late.id.clone();
    store
        .write(move |tx| {
            tx.execute(
                "UPDATE ops SET node = 'n1' WHERE id = ?1",
                crate::vals![&id],
            )?;
            Ok(())
        })
        .await
        .unwrap();
    let swept = store.sweep_nodes(judge("n2", n2)).await.unwrap();
    assert_eq!(swept.len(), 1, "{swept:?}");
    let late = store.get_op(&late.id).await.unwrap().unwrap();
    assert_eq!(
        (late.status, late.error.as_deref()),
        (Status::Failed, Some("node lost before start"))
    );
    // a settled op's launch is never recorded (so never started)
    assert!(!store.record_exec(&late.id, "e1").await.unwrap());
}

/// SPEC §24: a lease that merely lapsed keeps the tree on its node (its
/// workspace and live ops are there); only a node declared dead loses it
/// (before, the next op after a store outage landed on whichever node
/// renewed first, with an empty workspace).
#[tokio::test]
async fn a_tree_moves_only_off_a_dead_node() {
    let store = test_store().await;
    let (store, _) = node(&store, "n1", 60_000).await;
    let first = admit(&store, "r").await;
    assert_eq!(first.node.as_deref(), Some("n1"));
    let n2 = store
        .join_node("n2", "http://n2:7878", 60_000)
        .await
        .unwrap();
    // n1 lapsed but not declared dead: the tree's next op waits for n1
    store.renew_lease("n1", 1, -1, (0, 0)).await.unwrap();
    let next = admit(&store, "r").await;
    assert_eq!(next.node.as_deref(), Some("n1"));
    // n1 declared dead: the waiting op is settled by the sweep (it never
    // ran), and the tree's next op goes to a live node
    let swept = store.sweep_nodes(judge("n2", n2)).await.unwrap();
    assert_eq!(swept.len(), 1);
    let waited = store.get_op(&next.id).await.unwrap().unwrap();
    assert_eq!(waited.status, Status::Failed);
    let moved = admit(&store, "r").await;
    assert_eq!(moved.node.as_deref(), Some("n2"));
    assert_eq!(
        store.get_run("r").await.unwrap().unwrap().node.as_deref(),
        Some("n2")
    );
}

/// SPEC §24: `OPKERNEL_MAX_OPS` bounds one node's live ops, counted for
/// the node the op is placed on (before, it counted the whole cluster's).
#[tokio::test]
async fn the_live_op_limit_is_per_node() {
    let store = test_store().await;
    let (store, _) = node(&store, "n1", 60_000).await;
    store
        .join_node("n2", "http://n2:7878", 60_000)
        .await
        .unwrap();
    let one = Admission {
        max_live: 1,
        ..Admission::UNLIMITED
    };
    let admit_with = |run: &'static str| {
        let store = store.clone();
        async move { store.insert_op(start(run), one).await.unwrap() }
    };
    let NewOp::Created(a) = admit_with("ra").await else {
        panic!("the first op")
    };
    let NewOp::Created(b) = admit_with("rb").await else {
        panic!("one live op on each node: the second node takes it")
    };
    assert_ne!(a.node, b.node);
    let refused = admit_with("ra").await;
    match refused {
        NewOp::Refused(crate::store::Refusal::Limit(why)) => {
            assert!(why.contains("per node"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    // a new tree is not placed on a full node, even one with a free pool
    // container, and a refusal writes no placement
    let epoch = store.join_node("n3", "http://n3:1", 60_000).await.unwrap();
    let full = a.node.clone().unwrap();
    store.renew_lease(&full, 1, 60_000, (1, 5)).await.unwrap();
    let NewOp::Created(c) = admit_with("rc").await else {
        panic!("the idle node takes it")
    };
    assert_eq!(c.node.as_deref(), Some("n3"));
    let _ = epoch;
    // every node full: the limit's refusal (429), not a want of nodes
    assert!(matches!(
        admit_with("rd").await,
        NewOp::Refused(crate::store::Refusal::Limit(_))
    ));
    assert!(store.get_run("rd").await.unwrap().is_none());
}

/// SPEC §24: a stop asked for a `lost` op is recorded once, and its node
/// finds it by polling (a lost hint only delays it); a live op is not
/// marked this way.
#[tokio::test]
async fn a_stop_asked_for_a_lost_op_is_recorded_for_its_node() {
    let store = test_store().await;
    let (store, epoch) = node(&store, "n1", 60_000).await;
    let op = admit(&store, "r").await;
    assert!(store
        .claim_exec(&op.id, "k", "c", (false, Some(("n1".to_owned(), epoch))))
        .await
        .unwrap());
    assert!(
        !store.request_lost_stop(&op.id).await.unwrap(),
        "not lost yet"
    );
    store.renew_lease("n1", epoch, -1, (0, 0)).await.unwrap();
    let j = store.join_node("j", "http://j:1", 60_000).await.unwrap();
    assert_eq!(store.sweep_nodes(judge("j", j)).await.unwrap().len(), 1);
    assert!(store.request_lost_stop(&op.id).await.unwrap());
    assert!(!store.request_lost_stop(&op.id).await.unwrap(), "once");
    let asked = store.lost_stops_asked(0).await.unwrap();
    assert_eq!(
        asked.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(),
        [op.id.as_str()]
    );
    assert!(store
        .lost_stops_asked(crate::store::now_ms() + 60_000)
        .await
        .unwrap()
        .is_empty());
}
