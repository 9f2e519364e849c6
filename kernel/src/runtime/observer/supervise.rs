//! The op supervisor: one supervised observer per live op, restarted as
//! the next attempt when one fails (three failed attempts in a row make the
//! op lost), and recovery at start.

use std::sync::Arc;
use std::time::Duration;

use super::ObserverAttempt;
use crate::lifecycle::{Outcome, Status};
use crate::runtime::kernel::{Kernel, OpHandle, StartError};
use crate::store::{AttemptStart, Op};

/// Failed observer attempts in a row after which an op is lost.
pub const MAX_FAILED_ATTEMPTS: u32 = 3;

/// Starts the supervised observer of an op unless one is running.
pub fn spawn(k: &Arc<Kernel>, op_id: String) {
    spawn_supervisor(k, op_id, None);
}

/// Starts the observer of an op just inserted by this kernel: its first
/// attempt needs no separate attempt write (the exec claim records it).
pub fn spawn_fresh(k: &Arc<Kernel>, op: Op) {
    spawn_supervisor(k, op.id.clone(), Some(Box::new(op)));
}

fn spawn_supervisor(k: &Arc<Kernel>, op_id: String, fresh: Option<Box<Op>>) {
    if let Some(handle) = k.claim_handle(&op_id) {
        tokio::spawn(supervise(k.clone(), op_id, handle, fresh));
    }
}

/// Loads the pool's bindings (their files re-written), rebuilds the
/// container registry and starts an observer for every non-terminal op.
/// Returns how many were attached.
pub async fn recover(k: &Arc<Kernel>) -> Result<usize, StartError> {
    crate::runtime::pool::upkeep::recover(k).await?;
    k.recover_registry().await;
    take_over_unplaced(k).await?;
    let live = k.store.observed_ops().await?;
    for op in &live {
        spawn(k, op.id.clone());
    }
    Ok(live.len())
}

/// On a cluster node: the live ops a single kernel left unplaced are
/// taken over here when this node's disk holds their run's scratch (SPEC
/// §24), never because this node joined first; an unclaimed one of a run
/// that never ran anything (no workspace anywhere) by any node. Returns
/// the ops taken. At start, and from the node's loop.
pub async fn take_over_unplaced(k: &Kernel) -> Result<Vec<String>, crate::store::StoreError> {
    let mut taken = Vec::new();
    if k.store.node().is_none() {
        return Ok(taken);
    }
    for op in k.store.unplaced_ops().await? {
        let key = sandbox::profile::scratch_key(&op.run_id);
        let here = k.backend.scratch_exists(&key);
        // a fresh one is taken only by a node that may start it now
        if !here && (op.exec_claimed_at.is_some() || !k.may_start()) {
            continue;
        }
        if k.store.take_over_op(&op.id, !here).await? {
            tracing::info!(op = %op.id, run = %op.run_id, "a single kernel's live op taken over");
            taken.push(op.id);
        }
    }
    Ok(taken)
}

/// How the attempt after a failed one begins: a failure after a healthy
/// stretch (at least `healthy`) is not "in a row" with earlier ones.
pub fn attempt_start_after_failure(ran_for: Duration, healthy: Duration) -> AttemptStart {
    if ran_for >= healthy {
        AttemptStart::AfterIsolatedFailure
    } else {
        AttemptStart::AfterFailureInARow
    }
}

/// The op row for the next attempt, or `None` when the op is terminal.
async fn begin(
    k: &Kernel,
    op_id: &str,
    fresh: Option<Box<Op>>,
    start: AttemptStart,
) -> Result<Option<Box<Op>>, crate::store::StoreError> {
    match fresh {
        Some(op) if op.status == Status::Starting && op.exec_claimed_at.is_none() => Ok(Some(op)),
        _ => Ok(k
            .store
            .begin_attempt(op_id, &k.id, start)
            .await?
            .map(Box::new)),
    }
}

/// The supervision of one op: its task lives as long as the op, so the
/// store calls it makes now and then are boxed, off its resident state.
pub(super) async fn supervise(
    k: Arc<Kernel>,
    op_id: String,
    handle: Arc<OpHandle>,
    fresh: Option<Box<Op>>,
) {
    let mut start = AttemptStart::Clean;
    let mut last_error = String::new();
    // one wall-clock reading for every attempt of this supervision, taken
    // by the first watch (after any launch recorded its times): a later
    // attempt maps the recorded start to the same deadline
    let anchor: Anchor = Arc::default();
    // the handle goes with the supervisor, also when it panics: the
    // watchdog can then take the op over
    let _release = Release(k.clone(), op_id.clone());
    let Some(mut fresh) = Box::pin(placed_here(&k, &op_id, fresh)).await else {
        return;
    };
    loop {
        let op = match Box::pin(begin(&k, &op_id, fresh.take(), start)).await {
            Ok(Some(op)) => op,
            Ok(None) => break,
            Err(e) => {
                tracing::error!(op = %op_id, %e, "cannot begin observer attempt");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if op.failed_attempts >= MAX_FAILED_ATTEMPTS {
            let reason = format!(
                "observer failed {} attempts in a row; last error: {last_error}",
                op.failed_attempts
            );
            if let Err(e) = Box::pin(k.settle(&op, Outcome::Lost { reason })).await {
                tracing::error!(op = %op_id, %e, "cannot settle op after failed attempts");
            }
            break;
        }
        let attempt = op.attempt;
        let began = std::time::Instant::now();
        match run_attempt(&k, op, &handle, anchor.clone()).await {
            Some(AttemptEnd::Failed(error)) => last_error = error,
            Some(AttemptEnd::StoreAway(error)) => {
                // the control plane is unreachable: not the observer's
                // failure. The op's evidence stays on the scratch dir; the
                // next attempt (attach only) waits for the store and reads
                // it then, so an outage never settles an op on a guess
                tracing::warn!(op = %op_id, %error, "control plane unreachable; observing again when it answers");
                start = AttemptStart::Clean;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Some(AttemptEnd::GiveUp) => {
                tracing::warn!(op = %op_id, "supervisor gives up; the watchdog takes the op over");
                break;
            }
            Some(AttemptEnd::Fenced) => {
                tracing::info!(op = %op_id, "this node's lease is not held: the op waits");
                break;
            }
            None => break,
        }
        tracing::warn!(op = %op_id, attempt, error = %last_error, "observer attempt failed; restarting");
        start = attempt_start_after_failure(began.elapsed(), k.config.ops.attempt_healthy);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether this kernel observes the op: always for a single kernel; on a
/// cluster node, only an op placed on this node (another node's observer
/// runs it; a kill or a cancel taken here wakes it through the hand-off).
/// An op not read (the store away) is left to the next hand-off round.
/// On a node the op is read here, and that read stands for its first
/// attempt's: an unclaimed op (one another node admitted, hinted here)
/// begins as a fresh one, its exec claim recording the attempt.
async fn placed_here(k: &Kernel, op_id: &str, fresh: Option<Box<Op>>) -> Option<Option<Box<Op>>> {
    if k.node.is_none() {
        return Some(fresh);
    }
    let op = match fresh {
        Some(op) => op,
        None => match k.store.get_op(op_id).await {
            Ok(Some(op)) => Box::new(op),
            _ => return None,
        },
    };
    k.runs_here(op.node.as_deref()).then_some(Some(op))
}

/// The supervision's one clock reading, shared by its attempts.
pub type Anchor = Arc<std::sync::OnceLock<super::decide::Clock>>;

/// Releases an op's handle when its supervisor ends, however it ends.
struct Release(Arc<Kernel>, String);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.release_handle(&self.1);
    }
}

/// Why an attempt ended with the op still live.
enum AttemptEnd {
    /// Retry as the next attempt, with this error.
    Failed(String),
    /// The control plane was unreachable: retry without counting a failure.
    StoreAway(String),
    /// The supervisor gives up (a drill's fault): the watchdog takes over.
    GiveUp,
    /// The node is fenced: the supervisor ends; the node's hand-off starts
    /// another once it holds its lease again.
    Fenced,
}

/// How often the watchdog looks for observed ops without an observer.
pub const WATCHDOG_EVERY: Duration = Duration::from_secs(2);

/// The watchdog: every observed (starting or running) op this kernel does
/// not observe gets a supervisor, a few seconds at most after it lost its
/// own (a supervisor whose final write failed, a drill). An op inserted a
/// moment ago is left to the supervisor its inserter is starting.
pub async fn watchdog(k: Arc<Kernel>, mut stop: crate::base::sync::Stop) {
    while stop.nap(WATCHDOG_EVERY).await {
        let observed = match k.store.observed_op_ids().await {
            Ok(live) => live,
            Err(e) => {
                tracing::warn!(%e, "watchdog cannot list live ops");
                continue;
            }
        };
        let settled_in = crate::store::now_ms() - WATCHDOG_EVERY.as_millis() as i64;
        for (id, created_at) in observed {
            if !k.observes(&id) && created_at < settled_in {
                tracing::warn!(op = %id, "live op without an observer: the watchdog starts one");
                spawn(&k, id);
            }
        }
    }
}

/// Runs one attempt; `Some(end)` when it ended with the op still live.
async fn run_attempt(
    k: &Arc<Kernel>,
    op: Box<Op>,
    handle: &OpHandle,
    anchor: Anchor,
) -> Option<AttemptEnd> {
    let op_id = op.id.clone();
    let (run, healthy) = spawn_attempt(k, *op, handle, anchor);
    let ended = run.await;
    healthy.abort();
    let failed = |e: String| Some(AttemptEnd::Failed(e));
    match ended {
        Ok(Ok(())) => match Box::pin(k.store.get_op(&op_id)).await {
            Ok(Some(op)) if !op.status.is_terminal() => {
                failed("attempt ended without settling".into())
            }
            _ => None,
        },
        Ok(Err(super::ObserverError::Abandoned)) => Some(AttemptEnd::GiveUp),
        Ok(Err(super::ObserverError::Fenced)) => Some(AttemptEnd::Fenced),
        Ok(Err(super::ObserverError::Store(crate::store::StoreError::Unavailable(e)))) => {
            Some(AttemptEnd::StoreAway(e))
        }
        Ok(Err(e)) => failed(e.to_string()),
        Err(join) if join.is_panic() => failed("observer panicked".into()),
        Err(join) => failed(join.to_string()),
    }
}

/// Spawns an attempt and the timer that, if it stays healthy, ends any
/// run of failures (also across restarts). Not async: neither task's
/// future is held in the supervisor's own state, which lives as long as
/// the op.
fn spawn_attempt(
    k: &Arc<Kernel>,
    op: Op,
    handle: &OpHandle,
    anchor: Anchor,
) -> (
    tokio::task::JoinHandle<super::Step>,
    tokio::task::JoinHandle<()>,
) {
    let id = op.id.clone();
    let attempt = ObserverAttempt::new(k.clone(), op, handle.inbox.clone(), anchor);
    let run = tokio::spawn(attempt.run());
    let k = k.clone();
    let healthy = tokio::spawn(async move {
        tokio::time::sleep(k.config.ops.attempt_healthy).await;
        // boxed: the timer waits small
        if let Err(e) = Box::pin(k.store.reset_failed_attempts(&id)).await {
            tracing::warn!(op = %id, %e, "cannot reset the failed-attempt count");
        }
    });
    (run, healthy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_close_together_count_in_a_row() {
        let healthy = Duration::from_secs(60);
        assert_eq!(
            attempt_start_after_failure(Duration::from_millis(200), healthy),
            AttemptStart::AfterFailureInARow
        );
        assert_eq!(
            attempt_start_after_failure(Duration::from_secs(3600), healthy),
            AttemptStart::AfterIsolatedFailure
        );
    }
}
