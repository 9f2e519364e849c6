//! The kernel's background loops, owned by one set with one stop: the
//! heartbeat (a cluster node's lease, sweep and hand-off instead), approval timeouts, the reaper, the retention pass, the
//! observers' watchdog, the warm pool's upkeep, the webhook deliverer and
//! the scheduler. Each loop naps through a
//! [`Stop`]. Stopping the set lets the scheduler record the batch under way
//! (each fire is one transaction; bounded by [`SCHEDULER_GRACE`]) and
//! aborts the other loops at once: a reap or retention pass is safe to
//! abandon (every removal decides again under its gate; a purge is one
//! transaction), and waiting for one that Docker slows down would keep the
//! home locked. Dropping the set aborts every loop.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

pub use crate::base::sync::Stop;
use crate::runtime::kernel::Kernel;
use crate::store::{StoreError, TimeoutAction};

/// How often approval deadlines are checked (they are durable, so a
/// restart only delays them).
const APPROVAL_EVERY: Duration = Duration::from_secs(1);

/// The longest a stop waits for the scheduler's batch under way.
pub const SCHEDULER_GRACE: Duration = Duration::from_secs(10);

/// The running loops.
pub struct Housekeeping {
    stop: tokio::sync::watch::Sender<bool>,
    /// The scheduler: a stop lets its batch under way be recorded.
    scheduler: JoinSet<()>,
    /// The others: a stop aborts them.
    loops: JoinSet<()>,
}

impl Housekeeping {
    /// Settles what a dead kernel left to the scheduler (claims, overdue
    /// schedules), then starts every loop.
    pub async fn start(k: &Arc<Kernel>) -> Result<Housekeeping, StoreError> {
        crate::runtime::scheduler::at_start(k).await?;
        let (stop, stopped) = Stop::new();
        let mut loops = JoinSet::new();
        // a cluster node's liveness is its lease (one write per TTL/5),
        // not a write per op
        match k.node {
            None => loops.spawn(heartbeat(k.clone(), stopped.clone())),
            Some(_) => loops.spawn(crate::runtime::node::run(k.clone(), stopped.clone())),
        };
        loops.spawn(approval_timeouts(k.clone(), stopped.clone()));
        loops.spawn(crate::runtime::reaper::periodic(k.clone(), stopped.clone()));
        loops.spawn(crate::runtime::retention::periodic(
            k.clone(),
            stopped.clone(),
        ));
        loops.spawn(crate::runtime::pool::upkeep::run(
            k.clone(),
            stopped.clone(),
        ));
        loops.spawn(crate::runtime::observer::watchdog(
            k.clone(),
            stopped.clone(),
        ));
        if let Some(hook) = k.config.webhook.clone() {
            let deliver = crate::runtime::webhooks::deliver(k.clone(), hook, stopped.clone());
            loops.spawn(deliver);
        }
        let mut scheduler = JoinSet::new();
        scheduler.spawn(crate::runtime::scheduler::run(k.clone(), stopped));
        Ok(Housekeeping {
            stop,
            scheduler,
            loops,
        })
    }

    /// Stops the set: the other loops at once, the scheduler after its
    /// batch under way (at most [`SCHEDULER_GRACE`]).
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        self.loops.abort_all();
        while self.loops.join_next().await.is_some() {}
        let batch = async { while self.scheduler.join_next().await.is_some() {} };
        if tokio::time::timeout(SCHEDULER_GRACE, batch).await.is_err() {
            tracing::warn!("the scheduler's batch did not finish in time; each fire is one transaction, nothing is half done");
        }
    }
}

/// The kernel's heartbeat: its observed ops' liveness, one write a period.
async fn heartbeat(k: Arc<Kernel>, mut stop: Stop) {
    loop {
        if let Err(e) = k.store.heartbeat(&k.id).await {
            tracing::warn!(%e, "heartbeat failed");
        }
        if !stop.nap(k.config.ops.heartbeat_interval).await {
            return;
        }
    }
}

/// Denies or escalates the approval waits whose deadline passed.
async fn approval_timeouts(k: Arc<Kernel>, mut stop: Stop) {
    loop {
        match k.store.approval_timeouts().await {
            Ok(done) => {
                for action in done {
                    match action {
                        TimeoutAction::Denied { op_id, run_id } => {
                            tracing::info!(op = %op_id, "approval timed out: denied");
                            k.bump_run(&run_id);
                        }
                        TimeoutAction::Escalated { op_id, .. } => {
                            tracing::warn!(op = %op_id, "approval timed out: escalated, still waiting");
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(%e, "approval timeouts not checked"),
        }
        if !stop.nap(APPROVAL_EVERY).await {
            return;
        }
    }
}
