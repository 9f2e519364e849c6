//! The kernel's background loops, owned by one set with one stop: the
//! heartbeat, approval timeouts, the reaper, the retention pass, the
//! observers' watchdog and the scheduler. Each loop naps through a
//! [`Stop`]; stopping the set ends every loop at its next nap, after what
//! it is doing (the scheduler's batch under way is recorded whole).
//! Dropping the set aborts the loops.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use crate::runtime::kernel::Kernel;
use crate::store::{StoreError, TimeoutAction};
pub use crate::sync::Stop;

/// How often approval deadlines are checked (they are durable, so a
/// restart only delays them).
const APPROVAL_EVERY: Duration = Duration::from_secs(1);

/// The running loops.
pub struct Housekeeping {
    stop: tokio::sync::watch::Sender<bool>,
    loops: JoinSet<()>,
}

impl Housekeeping {
    /// Settles what a dead kernel left to the scheduler (claims, overdue
    /// schedules), then starts every loop.
    pub async fn start(k: &Arc<Kernel>) -> Result<Housekeeping, StoreError> {
        crate::runtime::scheduler::at_start(k).await?;
        let (stop, stopped) = Stop::new();
        let mut loops = JoinSet::new();
        loops.spawn(heartbeat(k.clone(), stopped.clone()));
        loops.spawn(approval_timeouts(k.clone(), stopped.clone()));
        loops.spawn(crate::runtime::reaper::periodic(k.clone(), stopped.clone()));
        loops.spawn(crate::runtime::retention::periodic(
            k.clone(),
            stopped.clone(),
        ));
        loops.spawn(crate::runtime::observer::watchdog(
            k.clone(),
            stopped.clone(),
        ));
        loops.spawn(crate::runtime::scheduler::run(k.clone(), stopped));
        Ok(Housekeeping { stop, loops })
    }

    /// Stops every loop and waits until each has finished what it was doing.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        while self.loops.join_next().await.is_some() {}
    }
}

/// The kernel's heartbeat: its observed ops' liveness, one write a period.
async fn heartbeat(k: Arc<Kernel>, mut stop: Stop) {
    loop {
        if let Err(e) = k.store.heartbeat(&k.id).await {
            tracing::warn!(%e, "heartbeat failed");
        }
        if !stop.nap(k.config.heartbeat_interval).await {
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
