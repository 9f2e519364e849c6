//! Stopping what a settled op left running (SPEC §24): the processes of
//! an op settled `lost` while its command may still run (a node declared
//! dead that comes back, a container unreachable past the grace window
//! that comes back), stopped as a kill stops them: TERM, the kill grace,
//! then KILL to what is left, each identity-checked by the shim's
//! signaller. The op stays terminal; its real end is only evidence.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::runtime::kernel::Kernel;
use crate::store::Op;

/// How long the stop keeps trying (Docker away) before it gives up.
const STOP_PATIENCE: Duration = Duration::from_secs(300);

/// The `.pid` of each lost op, waited for (a claimed request's start) for
/// at most the start-evidence window; an op without one by then started
/// nothing (the shim writes `.pid` before the command).
async fn with_pids(
    k: &Kernel,
    lost: Vec<(Op, Option<sandbox::PidRecord>)>,
) -> Vec<(Op, sandbox::PidRecord)> {
    let until = Instant::now() + k.config.ops.start_evidence_window;
    let mut known = Vec::new();
    for (op, rec) in lost {
        let dir = k.backend.ops_dir(&op.scratch_key);
        let mut rec = rec;
        while rec.is_none() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
            rec = dir.read_pid(&op.id).ok();
        }
        if let Some(rec) = rec {
            known.push((op, rec));
        }
    }
    known
}

/// Stops the processes of `ops` (a `.pid` each, or one waited for): TERM,
/// the kill grace, then KILL until nothing is left, the container is gone
/// or stopped, or `STOP_PATIENCE` passed.
pub async fn stop_processes(k: &Kernel, ops: Vec<(Op, Option<sandbox::PidRecord>)>) {
    let ops = with_pids(k, ops).await;
    let mut left = signal_all(k, ops, sandbox::Signal::Term).await;
    if !left.is_empty() {
        tokio::time::sleep(k.config.ops.kill_grace).await;
    }
    let give_up = Instant::now() + STOP_PATIENCE;
    while !left.is_empty() && Instant::now() < give_up {
        left = signal_all(k, left, sandbox::Signal::Kill).await;
        if !left.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    for (op, _) in &left {
        tracing::error!(op = %op.id, "a settled op's processes could not be stopped");
    }
}

/// A kill asked for an op already settled `lost` whose command may still
/// run on this kernel's disk (a `.pid` and no `.code`): its processes are
/// stopped in the background. False when there is nothing here to stop.
pub fn stop_settled(k: &Arc<Kernel>, op: &Op) -> bool {
    if op.status != crate::lifecycle::Status::Lost || !k.runs_here(op.node.as_deref()) {
        return false;
    }
    // one stop per op at a time: a repeated kill joins the one under way
    if !STOPPING.lock().insert(op.id.clone()) {
        return true;
    }
    let started = start_stop(k, op);
    if !started {
        STOPPING.lock().remove(&op.id);
    }
    started
}

/// [`stop_settled`] here, or, for an op of another live node, a hint to
/// that node (which stops it there); a dead node stops its lost ops itself
/// when it comes back. False when nothing is being stopped.
pub async fn stop_settled_anywhere(k: &Arc<Kernel>, op: &Op) -> bool {
    if stop_settled(k, op) {
        return true;
    }
    let Some(node) = op.node.as_deref().filter(|n| !k.runs_here(Some(n))) else {
        return false;
    };
    let live = k
        .store
        .nodes()
        .await
        .is_ok_and(|nodes| nodes.iter().any(|n| n.name == node && n.state != "dead"));
    if !live || op.status != crate::lifecycle::Status::Lost {
        return false;
    }
    // recorded first (the node polls for it: a lost hint only delays it),
    // then hinted (the node acts at once)
    let _ = k.store.request_lost_stop(&op.id).await;
    let kind = crate::store::hints::HintKind::Kill;
    k.store.hint(node, kind, &op.id).await.is_ok()
}

/// A cancel reaches the `lost` ops of the cancelled runs too (SPEC §24):
/// what their commands may still run is stopped, as for a kill.
pub async fn stop_lost_of_runs(k: &Arc<Kernel>, runs: &[String]) {
    for run in runs {
        let Ok(ops) = k.store.list_ops(Some(run.clone()), 1000).await else {
            continue;
        };
        for op in ops
            .iter()
            .filter(|o| o.status == crate::lifecycle::Status::Lost)
        {
            stop_settled_anywhere(k, op).await;
        }
    }
}

/// The ops whose stop (by a kill) is under way in this process.
static STOPPING: std::sync::LazyLock<crate::base::sync::Lock<std::collections::HashSet<String>>> =
    std::sync::LazyLock::new(Default::default);

/// Spawns the stop of `op`'s processes when its command may still run
/// here (a `.pid`, no `.code`); false when there is nothing to stop.
fn start_stop(k: &Arc<Kernel>, op: &Op) -> bool {
    let dir = k.backend.ops_dir(&op.scratch_key);
    if dir.read_code(&op.id).is_ok() || op.container_id.is_none() {
        return false;
    }
    let Ok(rec) = dir.read_pid(&op.id) else {
        return false;
    };
    let (k, op) = (k.clone(), op.clone());
    tokio::spawn(async move {
        // the op leaves the set whatever happens to this task (a panic too)
        struct Leave(String);
        impl Drop for Leave {
            fn drop(&mut self) {
                STOPPING.lock().remove(&self.0);
            }
        }
        let _leave = Leave(op.id.clone());
        stop_processes(&k, vec![(op, Some(rec))]).await;
    });
    true
}

/// Sends `signal` to each lost op still without `.code`; the ops that may
/// still run (signalled now, or not reached) are returned.
async fn signal_all(
    k: &Kernel,
    lost: Vec<(Op, sandbox::PidRecord)>,
    signal: sandbox::Signal,
) -> Vec<(Op, sandbox::PidRecord)> {
    let mut left = Vec::new();
    for (op, rec) in lost {
        if k.backend.ops_dir(&op.scratch_key).read_code(&op.id).is_ok() {
            continue;
        }
        let container = op.container_id.as_deref().unwrap_or_default();
        match k.backend.signal_op(container, &op.id, &rec, signal).await {
            Ok(pids) if pids.is_empty() => {}
            Ok(pids) => {
                tracing::warn!(op = %op.id, signal = signal.name(), ?pids, "a settled op's processes signalled");
                left.push((op, rec));
            }
            Err(e) => {
                // a container that is gone or stopped runs nothing (a node
                // killed whole comes back with its containers stopped)
                match k.backend.inspect(container).await {
                    Ok(info) if !info.running => continue,
                    Err(sandbox::SandboxError::NotFound(_)) => continue,
                    _ => {}
                }
                tracing::warn!(op = %op.id, %e, "a settled op's processes not signalled; trying again");
                left.push((op, rec));
            }
        }
    }
    left
}
