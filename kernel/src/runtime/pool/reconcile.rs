//! The pool's bookkeeping, reconciled each upkeep round with what Docker
//! and the host hold: adoptions whose bind's answer was lost are asked
//! again; a binding whose container is gone goes, with the run's scratch,
//! once nothing of the run needs it (as the reaper's scratch rule has it);
//! pool dirs that no container and no binding name are removed.

use std::time::Duration;

use sandbox::profile::{is_pool_key, scratch_key, LABEL_RUN_ID, LABEL_SCRATCH_KEY};
use sandbox::ContainerInfo;

use crate::runtime::kernel::Kernel;
use crate::store::{Binding, StoreError};

/// How long an adoption's lost answer waits before it is asked again.
const UNCERTAIN_AFTER: Duration = Duration::from_secs(30);

/// One reconciliation against `list` (Docker's managed containers now).
pub(super) async fn pass(k: &Kernel, list: &[ContainerInfo]) -> Result<(), StoreError> {
    settle_uncertain(k).await?;
    forget_gone(k, list).await?;
    sweep_orphan_dirs(k, list);
    Ok(())
}

/// Whether a pool container's scratch dir still is as it was made: its
/// `.ops` holds nothing but an empty inbox and its launcher's record (no
/// op was ever handed to it or ran in it).
pub(super) fn untouched(k: &Kernel, pool_key: &str) -> bool {
    let ops = k.backend.ops_dir(pool_key);
    let Ok(entries) = std::fs::read_dir(ops.path()) else {
        return false;
    };
    let made = ["inbox", sandbox::profile::LAUNCHER_RECORD];
    let only_inbox = entries
        .filter_map(|e| e.ok())
        .all(|e| made.iter().any(|m| e.file_name() == *m));
    only_inbox && ops.inbox_entries().is_empty()
}

/// Adoptions whose bind may have landed, asked again once old enough:
/// bound, they are recorded; not, they become strays (removed after one
/// more look at the control plane).
async fn settle_uncertain(k: &Kernel) -> Result<(), StoreError> {
    let due: Vec<String> = {
        let s = k.pool.state.lock();
        s.uncertain
            .iter()
            .filter(|(_, since)| since.elapsed() > UNCERTAIN_AFTER)
            .map(|(id, _)| id.clone())
            .collect()
    };
    for id in due {
        match k.store.binding_of_container(&id).await? {
            Some(b) => k.pool.remember(b),
            None => {
                k.pool.state.lock().uncertain.remove(&id);
            }
        }
    }
    Ok(())
}

/// Bindings whose container is gone: with no container of the run left,
/// no live op and every result delivered, the run's scratch (binding file
/// and pool dir) goes and the binding with it. Decided under the run's
/// reap gate, on a fresh listing: no launch is between container and exec.
async fn forget_gone(k: &Kernel, list: &[ContainerInfo]) -> Result<(), StoreError> {
    let gone: Vec<Binding> = {
        let s = k.pool.state.lock();
        s.by_run
            .values()
            .filter(|b| !list.iter().any(|c| c.id == b.container_id))
            .cloned()
            .collect()
    };
    for b in gone {
        let _gate = k.reap_gate(&b.run_id).await;
        let Ok(now) = k.backend.list_managed().await else {
            return Ok(());
        };
        let in_use = now
            .iter()
            .any(|c| c.id == b.container_id || c.labels.get(LABEL_RUN_ID) == Some(&b.run_id));
        if in_use
            || !k.store.run_ops_live(&b.run_id).await?.is_empty()
            || !k.store.run_delivered(&b.run_id).await?
        {
            continue;
        }
        let run_key = scratch_key(&b.run_id);
        k.watcher.unwatch(k.backend.ops_dir(&run_key).path());
        match k.backend.remove_scratch(&run_key) {
            Ok(()) => k.forget_binding(&b.run_id).await,
            Err(e) => {
                tracing::warn!(run = %b.run_id, %e, "warm pool: a gone container's scratch not removed")
            }
        }
    }
    Ok(())
}

/// `pool-*` dirs that no listed container, binding or container being
/// made names: left by a kill between a dir's making and its container's,
/// or between a container's removal and its dir's.
fn sweep_orphan_dirs(k: &Kernel, list: &[ContainerInfo]) {
    let Ok(entries) = std::fs::read_dir(k.config.scratch_root()) else {
        return;
    };
    let named = {
        let s = k.pool.state.lock();
        let mut named: std::collections::HashSet<String> =
            s.by_run.values().map(|b| b.scratch_key.clone()).collect();
        named.extend(s.making.iter().cloned());
        named.extend(s.unconfirmed.keys().cloned());
        named
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let Ok(key) = entry.file_name().into_string() else {
            continue;
        };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let listed = list
            .iter()
            .any(|c| c.labels.get(LABEL_SCRATCH_KEY) == Some(&key));
        if is_dir && is_pool_key(&key) && !listed && !named.contains(&key) {
            match k.backend.remove_scratch(&key) {
                Ok(()) => tracing::info!(%key, "warm pool: an orphaned pool dir removed"),
                Err(e) => tracing::warn!(%key, %e, "warm pool: an orphaned pool dir not removed"),
            }
        }
    }
}
