//! One supervised observer per live op. Attempt 1 of a never-claimed
//! `starting` op wins the exec claim and launches the command
//! (`launch.rs`); every other path only watches (`watch.rs`): it gathers
//! evidence (the `.pid`/`.code` files, identity-checked probes, the
//! control plane's record), asks the pure decision core (`decide.rs`) what
//! to do, and does it. An attempt ends when it settled the op (or found it
//! settled), or with an error for the supervisor (`supervise.rs`) to retry.

use std::sync::Arc;

use crate::lifecycle::Outcome;
use crate::runtime::inbox::Inbox;
use crate::runtime::kernel::Kernel;
use crate::store::Op;

pub use opkernel_domain::{decide, evidence};
mod launch;
mod supervise;
mod verdict;
mod watch;

pub use supervise::{
    attempt_start_after_failure, recover, spawn, spawn_fresh, take_over_unplaced, watchdog,
    MAX_FAILED_ATTEMPTS, WATCHDOG_EVERY,
};

/// Why an observer attempt ended without settling its op: the supervisor starts
/// the next attempt (or gives up).
#[derive(Debug, thiserror::Error)]
pub enum ObserverError {
    /// The control plane could not be read or written.
    #[error("control plane: {0}")]
    Store(#[from] crate::store::StoreError),
    /// The op's row is no longer in the control plane; the op's id.
    #[error("op {0} vanished from the control plane")]
    Vanished(String),
    /// A drill's fault hook failed this attempt
    /// ([`crate::runtime::inbox::Wake::Fault`]).
    #[error("fault injected by a drill")]
    Injected,
    /// A drill told the supervisor to stop ([`crate::runtime::inbox::Wake::Abandon`]):
    /// the op is left without an observer.
    #[error("the supervisor was told to give up by a drill")]
    Abandoned,
    /// This cluster node's lease is not surely held: it starts no command
    /// now. The op is left as it is (unclaimed, or claimed and not started)
    /// for this node once it holds its lease again, or for the sweep.
    #[error("this node's lease is not held: nothing is started")]
    Fenced,
}

type Step = Result<(), ObserverError>;

/// One observer attempt of one op.
pub struct ObserverAttempt {
    kernel: Arc<Kernel>,
    op: Op,
    inbox: Arc<Inbox>,
    /// This attempt launched the op, into the container it just ensured:
    /// watching needs no second look at that container.
    launched: bool,
    /// The supervision's one clock reading, carried to this attempt.
    anchor: supervise::Anchor,
}

impl ObserverAttempt {
    /// An attempt for `op` as last read, taking wakes from `inbox`; nothing
    /// runs until [`ObserverAttempt::run`].
    pub fn new(kernel: Arc<Kernel>, op: Op, inbox: Arc<Inbox>, anchor: supervise::Anchor) -> Self {
        ObserverAttempt {
            kernel,
            op,
            inbox,
            launched: false,
            anchor,
        }
    }

    /// Runs the attempt: launches the op if it was never claimed (attempt 1),
    /// else reloads it, then watches until it is settled or the attempt fails.
    pub async fn run(mut self) -> Step {
        if self.op.status == crate::lifecycle::Status::Starting && self.op.exec_claimed_at.is_none()
        {
            // boxed: the launch's state is not kept for the op's whole life
            if !Box::pin(self.launch()).await? {
                return Ok(());
            }
            // `launch` left the row as it is now in `self.op`
            self.launched = true;
        } else {
            Box::pin(self.reload()).await?;
        }
        if self.op.status.is_terminal() {
            return Ok(());
        }
        self.watch().await
    }

    async fn reload(&mut self) -> Step {
        self.op = self
            .kernel
            .store
            .get_op(&self.op.id)
            .await?
            .ok_or_else(|| ObserverError::Vanished(self.op.id.clone()))?;
        Ok(())
    }

    async fn settle(&self, outcome: Outcome) -> Step {
        self.kernel.settle(&self.op, outcome).await?;
        Ok(())
    }
}

#[cfg(test)]
mod executor_tests;
