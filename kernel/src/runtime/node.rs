//! A cluster node's loop (SPEC §20): the lease renewed every TTL/5 on the
//! database's clock (a lapsed lease or a changed epoch: no claim until the
//! node has joined again with a new epoch); the sweep of lapsed nodes
//! (theirs ops settled, their runs' waiters woken); and the hand-off: the
//! ops placed on this node by another one get an observer here within a
//! second, and a kill taken by another node wakes the observer here.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::runtime::kernel::Kernel;
use crate::store::StoreError;
use crate::sync::Stop;

/// How often the hand-off looks for this node's ops without an observer.
const HAND_OFF_EVERY: Duration = Duration::from_secs(1);
/// An op admitted this recently by this node gets its observer from the
/// admission itself.
const FRESH_MS: i64 = 300;

/// Joins the cluster at start (a new epoch), before recovery.
pub async fn join(k: &Kernel) -> Result<(), StoreError> {
    let Some(node) = &k.node else {
        return Ok(());
    };
    let c = &node.config;
    let epoch = k
        .store
        .join_node(&c.name, &c.advertise_url, c.ttl_ms())
        .await?;
    node.set_epoch(epoch);
    tracing::info!(node = %c.name, epoch, url = %c.advertise_url, "joined the cluster");
    Ok(())
}

/// The node's loop (in the housekeeping set); returns at once for a
/// single kernel.
pub async fn run(k: Arc<Kernel>, mut stop: Stop) {
    let Some(node) = &k.node else {
        return;
    };
    let every = node.config.renew_every();
    let mut renewed = Instant::now();
    let mut poked = HashSet::new();
    while stop.nap(HAND_OFF_EVERY.min(every)).await {
        if renewed.elapsed() >= every {
            renewed = Instant::now();
            if let Err(e) = lease_and_sweep(&k).await {
                tracing::warn!(%e, "cluster: lease or sweep not done this round");
            }
        }
        if let Err(e) = hand_off(&k, &mut poked).await {
            tracing::warn!(%e, "cluster: hand-off not done this round");
        }
    }
}

/// Renews the lease (rejoining with a new epoch when it lapsed), then
/// sweeps the lapsed nodes.
async fn lease_and_sweep(k: &Kernel) -> Result<(), StoreError> {
    let Some(node) = &k.node else {
        return Ok(());
    };
    let c = &node.config;
    let containers = k.registered_containers().len() as i64;
    let held = node.epoch() != 0
        && k.store
            .renew_lease(&c.name, node.epoch(), c.ttl_ms(), containers)
            .await?;
    if !held {
        // fenced: no claim matches epoch 0 until the join below lands
        node.set_epoch(0);
        tracing::warn!(node = %c.name, "cluster: this node's lease lapsed or its epoch changed; it claims nothing until it has joined again");
        join(k).await?;
    }
    for swept in k.store.sweep_nodes().await? {
        tracing::warn!(node = %swept.name, ops = swept.settled.len(), "cluster: a node's lease lapsed: declared dead, its ops settled");
        for (_, run) in &swept.settled {
            k.bump_run(run);
        }
    }
    Ok(())
}

/// Observers for this node's ops placed by other nodes, and wake-ups for
/// the kills other nodes took.
async fn hand_off(k: &Arc<Kernel>, poked: &mut HashSet<String>) -> Result<(), StoreError> {
    let fresh_after = crate::store::now_ms() - FRESH_MS;
    for (id, created_at) in k.store.observed_op_ids().await? {
        if created_at < fresh_after && !k.observes(&id) {
            crate::runtime::observer::spawn(k, id);
        }
    }
    let killing = k.store.node_kill_requests().await?;
    poked.retain(|id| killing.contains(id));
    for id in killing {
        if poked.insert(id.clone()) {
            k.poke_kill(&id);
        }
    }
    Ok(())
}
