//! The orphan reaper. A container missing from the registry is not an
//! orphan by that fact alone: age only makes it a candidate; the decision
//! comes from the control plane, the `.ops` files and the process table.
//! Anything live or undecidable keeps the container, with the reason.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::runtime::kernel::Kernel;
use crate::runtime::pool::{upkeep, PoolRole};
use crate::store::{now_ms, StoreError};

mod verdict;

use verdict::is_idle_process;
pub use verdict::{
    decide_reap, scratch_fate, verdict, KeepReason, ReapFacts, RemoveReason, ScratchFate, Verdict,
};

/// How long the reaper waits for one container's probe or process table.
const LOOK_TIMEOUT: Duration = Duration::from_secs(20);

/// What the reaper does with a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReapAction {
    /// Leave it: something is live, undecidable or too recent.
    Keep,
    /// Remove it: nothing in it is live, and its run finished or it idled
    /// past the ttl.
    Remove,
}

/// The reaper's verdict on one managed container, with its reason (shown by
/// `opkernel reap` and the panel).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ReapDecision {
    /// Docker's container id.
    pub container_id: String,
    /// The container's name.
    pub name: String,
    /// Its run label as found, valid or not (`None`: no label).
    pub run_id: Option<String>,
    /// Keep or remove.
    pub action: ReapAction,
    /// Why, in words: what keeps it, or what makes it abandoned.
    pub reason: String,
    /// True when the container was actually removed (never in a dry run).
    pub removed: bool,
    /// The cluster node whose reaper decided (absent on a single kernel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Gathers the facts about one container (control plane, `.ops` files,
/// probe and `docker top`).
async fn facts(
    k: &Kernel,
    c: &sandbox::ContainerInfo,
    live_ops: &[crate::store::Op],
) -> Result<ReapFacts, StoreError> {
    // an adopted pool container is its run's by the binding, not a label
    let bound = match k.pool.role(c) {
        Some(PoolRole::Bound(run)) => Some(run),
        _ => None,
    };
    let run_label = bound
        .clone()
        .or_else(|| c.labels.get(sandbox::profile::LABEL_RUN_ID).cloned());
    let mut f = ReapFacts {
        container_id: c.id.clone(),
        name: c.name.clone(),
        run_id: run_label
            .clone()
            .filter(|r| sandbox::profile::validate_run_id(r).is_ok()),
        run_label,
        ttl_ms: k.config.upkeep.reap_ttl.as_millis() as i64,
        ..ReapFacts::default()
    };
    let Some(run) = f.run_id.clone() else {
        return Ok(f);
    };
    let key = sandbox::profile::scratch_key(&run);
    f.scratch_key_matches =
        bound.is_some() || c.labels.get(sandbox::profile::LABEL_SCRATCH_KEY) == Some(&key);
    if !k.backend.owns(c) {
        f.owned = Err(c
            .scratch_source
            .clone()
            .unwrap_or_else(|| "no /scratch mount".into()));
    }
    if !f.scratch_key_matches || f.owned.is_err() {
        return Ok(f);
    }
    f.live_op = live_ops
        .iter()
        .find(|op| {
            op.container_id.as_deref() == Some(&c.id)
                || (op.run_id == run && op.container_id.is_none())
        })
        .map(|op| (op.id.clone(), op.status.as_str().to_owned()));
    if f.live_op.is_some() {
        return Ok(f);
    }
    let ops_dir = k.backend.ops_dir(&key);
    f.open_op_files = open_op_files(ops_dir.path());
    f.running = c.running;
    // a container made before the shim cannot be probed: its process
    // table alone (below) must show nothing but its idle processes
    if c.running && c.has_shim {
        look_inside(k, c, &mut f).await;
    }
    f.run_finished = k.store.run_finished(&run).await?.unwrap_or(false);
    let created_ms = c
        .labels
        .get(sandbox::profile::LABEL_CREATED_AT)
        .and_then(|v| v.parse::<i64>().ok())
        .map(|s| s * 1000)
        .unwrap_or(0);
    let last_activity = k
        .store
        .run_last_activity(&run)
        .await?
        .unwrap_or(0)
        .max(newest_mtime_ms(ops_dir.path()))
        .max(created_ms);
    f.idle_ms = now_ms() - last_activity;
    Ok(f)
}

/// The container's marked processes (through the shim's probe) and, when
/// there are none, its full process table: what keeps it from removal.
/// A look that does not answer in time decides nothing (the container is
/// kept), and never holds the run's gate for long.
async fn look_inside(k: &Kernel, c: &sandbox::ContainerInfo, f: &mut ReapFacts) {
    f.marked_process = match tokio::time::timeout(LOOK_TIMEOUT, k.backend.probe(&c.id)).await {
        Ok(Ok(procs)) => Ok(procs
            .first()
            .map(|p| format!("op {} still has processes (pid {})", p.op_id, p.pid))),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("probe timed out after {}s", LOOK_TIMEOUT.as_secs())),
    };
    if matches!(f.marked_process, Ok(None)) {
        f.unknown_process = match tokio::time::timeout(LOOK_TIMEOUT, k.backend.top(&c.id)).await {
            Ok(Ok(top)) => Ok(top
                .into_iter()
                .find(|p| !is_idle_process(&p.command))
                .map(|p| p.command)),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "process table timed out after {}s",
                LOOK_TIMEOUT.as_secs()
            )),
        };
    }
}

/// One pass of the reaper: facts about every managed container, the pure
/// decisions, then (unless a dry run) the removals.
pub async fn reap(k: &Kernel, dry_run: bool) -> Result<Vec<ReapDecision>, StoreError> {
    let containers = match k.backend.list_managed().await {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!(%e, "reaper: cannot list containers");
            return Ok(Vec::new());
        }
    };
    let live_ops = k.store.live_ops().await?;
    let (mut pooled, mut all, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
    for c in &containers {
        match pool_decision(k, c) {
            Some(d) => pooled.push((d, c)),
            None => {
                all.push(facts(k, c, &live_ops).await?);
                theirs.push(c);
            }
        }
    }
    let mut decisions = decide_reap(&all);
    if !dry_run {
        for ((decision, f), c) in decisions.iter_mut().zip(&all).zip(&theirs) {
            if let (true, Some(run)) = (decision.action == ReapAction::Remove, f.run_id.as_deref())
            {
                remove_under_gate(k, c, run, decision).await?;
            }
        }
    }
    for (mut d, c) in pooled {
        if !dry_run && d.action == ReapAction::Remove {
            match upkeep::remove_unbound(k, c, &d.reason).await {
                Ok(removed) => d.removed = removed,
                Err(e) => {
                    tracing::warn!(container = %c.name, %e, "reaper could not remove a pool container")
                }
            }
        }
        decisions.push(d);
    }
    Ok(decisions)
}

/// The verdict on a pool container that serves no run (a bound one is
/// judged as its run's): free ones stay up to the pool's size; strays,
/// a surplus and containers of a profile or image no longer pooled go;
/// one a binding file names without a row stays, never reused.
fn pool_decision(k: &Kernel, c: &sandbox::ContainerInfo) -> Option<ReapDecision> {
    let role = k.pool.role(c)?;
    let (action, reason) = match (&role, k.pool.must_go(k, c)) {
        (PoolRole::Bound(_), _) => return None,
        (_, Some(why)) => (ReapAction::Remove, format!("warm pool: {why}")),
        _ if !k.backend.owns(c) => (ReapAction::Keep, "a pool container of another kernel home".into()),
        (PoolRole::Free, None) => (ReapAction::Keep, "warm pool: free, for a new run".into()),
        (PoolRole::Adopting, None) => (ReapAction::Keep, "warm pool: being adopted".into()),
        (PoolRole::Making, None) => (ReapAction::Keep, "warm pool: being made".into()),
        (PoolRole::Unconfirmed(run_key), None) => (
            ReapAction::Keep,
            format!("a binding file (run key {run_key}) names it but the control plane binds it to no run: identity unconfirmed, never reused"),
        ),
        (PoolRole::Stray, None) => (ReapAction::Keep, "warm pool: not yet sorted".into()),
    };
    Some(ReapDecision {
        container_id: c.id.clone(),
        name: c.name.clone(),
        run_id: None,
        action,
        reason,
        removed: false,
        node: None,
    })
}

/// The reaper's verdict on one container now, as a dry run gives it
/// (nothing is removed).
pub async fn verdict_on(
    k: &Kernel,
    c: &sandbox::ContainerInfo,
) -> Result<ReapDecision, StoreError> {
    let live_ops = k.store.live_ops().await?;
    let f = facts(k, c, &live_ops).await?;
    decide_reap(std::slice::from_ref(&f))
        .pop()
        .ok_or_else(|| StoreError::Corrupt("the reaper decided nothing on one container".into()))
}

/// Removes a container the reaper decided on, holding the run's gate (no
/// launch of the run is between container and exec) and deciding again
/// from fresh facts under it: an op admitted since the first look (and
/// perhaps already ended, reopening a finished run) keeps the container.
async fn remove_under_gate(
    k: &Kernel,
    c: &sandbox::ContainerInfo,
    run: &str,
    decision: &mut ReapDecision,
) -> Result<(), StoreError> {
    let _gate = k.reap_gate(run).await;
    let live = k.store.run_ops_live(run).await?;
    if let Verdict::Keep(reason) = verdict(&facts(k, c, &live).await?) {
        decision.action = ReapAction::Keep;
        decision.reason = format!("kept on a second look under the run's gate: {reason}");
        return Ok(());
    }
    let removed = tokio::time::timeout(Duration::from_secs(30), k.backend.remove(&c.id)).await;
    // removed or half gone: the next launch must look it up afresh
    k.forget_container(&c.id);
    match removed {
        Ok(Ok(_)) => {
            decision.removed = true;
            k.probes.forget(&c.id);
            tracing::info!(container = %c.name, reason = %decision.reason, "reaped container");
        }
        Ok(Err(e)) => {
            tracing::warn!(container = %c.name, %e, "reaper could not remove container");
            return Ok(());
        }
        Err(_) => {
            tracing::warn!(container = %c.name, "reaper: remove timed out");
            return Ok(());
        }
    }
    let others = k.backend.list_managed().await.ok().map(|list| {
        list.iter().any(|o| {
            o.id != c.id
                && (o
                    .labels
                    .get(sandbox::profile::LABEL_RUN_ID)
                    .map(String::as_str)
                    == Some(run)
                    || k.pool.bound_run(&o.id).as_deref() == Some(run))
        })
    });
    match scratch_fate(others, k.store.run_delivered(run).await?) {
        ScratchFate::Keep(why) => decision
            .reason
            .push_str(&format!("; scratch dir kept {why}")),
        ScratchFate::Remove => {
            let key = sandbox::profile::scratch_key(run);
            k.watcher.unwatch(k.backend.ops_dir(&key).path());
            match k.backend.remove_scratch(&key) {
                Ok(()) => {
                    decision
                        .reason
                        .push_str("; scratch dir removed (every result delivered)");
                    if k.pool.binding(run).is_some() {
                        k.forget_binding(run).await;
                    }
                }
                Err(e) => tracing::warn!(%e, "reaper could not remove a scratch dir"),
            }
        }
    }
    Ok(())
}

/// Ops in a `.ops` dir with a pid file and no code file.
fn open_op_files(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".pid"))
                .map(str::to_owned)
        })
        .filter(|id| !dir.join(format!("{id}.code")).exists())
        .count()
}

fn newest_mtime_ms(dir: &std::path::Path) -> i64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok()?.metadata().ok()?.modified().ok())
        .filter_map(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
        .max()
        .unwrap_or(0)
}

/// Runs the reaper every `reap_interval` until the housekeeping stops.
pub async fn periodic(k: std::sync::Arc<Kernel>, mut stop: crate::base::sync::Stop) {
    while stop.nap(k.config.upkeep.reap_interval).await {
        if let Err(e) = reap(&k, false).await {
            tracing::warn!(%e, "periodic reap failed");
        }
    }
}
