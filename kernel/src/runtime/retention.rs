//! Bounded growth at run time (SPEC §21), one pass at least once a minute:
//! delivered ops' files older than `OPKERNEL_OP_FILES_RETENTION` leave the
//! scratch dirs (the row keeps digest, size and tail); handover files a
//! crash left behind leave the inboxes; finished run trees older than
//! `OPKERNEL_RETENTION` leave the control plane; and the per-run maps in
//! memory shrink to live work.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::runtime::kernel::Kernel;
use crate::store::{now_ms, StoreError};

/// Ops whose files one batch removes.
const BATCH: u32 = 500;
/// Batches per pass: a backlog drains over a few passes, never in one
/// long stall.
const BATCHES_PER_PASS: usize = 20;
/// A probe question or answer older than this was abandoned.
const STALE_PROBE: Duration = Duration::from_secs(60);
/// Handover files: `<op id>.<state>`.
const HANDOVER: [&str; 4] = ["req", "req.tmp", "claimed", "withdrawn"];

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    /// Ops whose `.log`, `.pid` and `.code` were removed (delivered, older than
    /// `OPKERNEL_OP_FILES_RETENTION`).
    pub files_pruned: usize,
    /// Handover and probe files removed from run inboxes (settled ops,
    /// abandoned probes).
    pub inbox_files_removed: usize,
    /// Finished run trees purged from the control plane (older than
    /// `OPKERNEL_RETENTION`).
    pub trees_purged: usize,
    /// In-memory entries (per-run maps, probe state) dropped for lack of live
    /// work.
    pub memory_entries_dropped: usize,
}

/// How often the pass runs: half the shorter retention, between 1 s and
/// a minute.
pub fn interval(k: &Kernel) -> Duration {
    (k.config
        .upkeep
        .op_files_retention
        .min(k.config.upkeep.retention)
        / 2)
    .clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// Runs the pass every [`interval`] until the housekeeping stops.
pub async fn periodic(k: Arc<Kernel>, mut stop: crate::base::sync::Stop) {
    loop {
        match run_pass(&k).await {
            Ok(pass) if pass != Pass::default() => tracing::info!(?pass, "retention pass"),
            Ok(_) => {}
            Err(e) => tracing::warn!(%e, "retention pass failed; retried next tick"),
        }
        if !stop.nap(interval(&k)).await {
            return;
        }
    }
}

/// One pass: files, inboxes, trees, memory.
pub async fn run_pass(k: &Kernel) -> Result<Pass, StoreError> {
    let mut pass = Pass {
        files_pruned: prune_files(k).await?,
        ..Pass::default()
    };
    pass.inbox_files_removed = sweep_inboxes(k).await?;
    let stale = now_ms() - crate::runtime::webhooks::MAX_AGE.as_millis() as i64;
    let dropped = k.store.drop_stale_posts(stale).await?;
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "webhook posts older than a day dropped (recorded in the kernel journal)"
        );
    }
    let cutoff = now_ms() - k.config.upkeep.retention.as_millis() as i64;
    for tree in k.store.purge_finished_trees(cutoff, 100, &k.id).await? {
        tracing::info!(root = %tree.root, runs = tree.runs.len(), ops = tree.ops, "run tree purged");
        for run in &tree.runs {
            k.forget_run(run);
            let _ = std::fs::remove_dir_all(crate::runtime::workspace::run_snapshots_dir(k, run));
        }
        pass.trees_purged += 1;
    }
    crate::runtime::workspace::retry_thaws(k).await;
    let swept = crate::runtime::workspace::sweep(k).await?;
    if swept > 0 {
        tracing::info!(
            swept,
            "snapshots of purged runs and stale fork copies removed"
        );
    }
    let (runs, containers): (HashSet<String>, HashSet<Option<String>>) =
        k.store.live_work().await?.into_iter().unzip();
    let containers: HashSet<String> = containers.into_iter().flatten().collect();
    pass.memory_entries_dropped = k.trim_idle(&runs, &containers);
    Ok(pass)
}

/// Removes the files of delivered ops older than the files' retention.
async fn prune_files(k: &Kernel) -> Result<usize, StoreError> {
    let cutoff = now_ms() - k.config.upkeep.op_files_retention.as_millis() as i64;
    let mut pruned = 0;
    for _ in 0..BATCHES_PER_PASS {
        let batch = k.store.prunable_ops(cutoff, BATCH).await?;
        if batch.is_empty() {
            break;
        }
        for op in batch {
            if !op.local {
                // ran on a dead node (or none): its files are that disk's
                // business; the record lets the tree be purged
                k.store.mark_files_pruned(&op.id).await?;
                pruned += 1;
                continue;
            }
            let dir = k.backend.ops_dir(&op.scratch_key);
            let id = op.id.clone();
            let removed = tokio::task::spawn_blocking(move || dir.remove_op_files(&id))
                .await
                .map_err(|e| StoreError::Worker(e.to_string()))?;
            match removed {
                // recorded only once the files are gone: a failure is
                // retried on the next pass
                Ok(()) => {
                    k.store.mark_files_pruned(&op.id).await?;
                    pruned += 1;
                }
                Err(e) => {
                    tracing::warn!(op = %op.id, %e, "op files not removed; retried next pass");
                    return Ok(pruned);
                }
            }
        }
    }
    Ok(pruned)
}

/// Handover files whose op is terminal (or gone) and probe questions or
/// answers nobody collected: what a crash between a settlement (or a
/// probe) and its clean-up left behind.
async fn sweep_inboxes(k: &Kernel) -> Result<usize, StoreError> {
    let root = k.config.scratch_root();
    let keys: Vec<String> = std::fs::read_dir(&root)
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut removed = 0;
    for key in keys {
        let dir = k.backend.ops_dir(&key);
        for (name, age) in dir.inbox_entries() {
            let Some((op_id, state)) = name.split_once('.') else {
                continue;
            };
            if HANDOVER.contains(&state) {
                let settled = match k.store.get_op(op_id).await? {
                    Some(op) => op.status.is_terminal(),
                    None => sandbox::shim::validate_op_id(op_id).is_ok(),
                };
                if settled {
                    removed += dir.clear_handover(op_id).unwrap_or(0);
                }
            } else if matches!(
                state,
                "probe"
                    | "listing"
                    | "probe.tmp"
                    | "listing.tmp"
                    | "stdin"
                    | "stdin.tmp"
                    | "stdin-taken"
            ) && age > STALE_PROBE
            {
                removed += dir.remove_inbox_entry(&name).is_ok() as usize;
            }
        }
    }
    Ok(removed)
}
