//! One supervised observer per live op. Attempt 1 of a never-claimed
//! `starting` op wins the exec claim and launches the command
//! (`launch.rs`); every other path only watches (`watch.rs`): it gathers
//! evidence (the `.pid`/`.code` files, identity-checked probes, the
//! control plane's record), asks the pure decision core (`decide.rs`) what
//! to do, and does it. An attempt ends when it settled the op (or found it
//! settled), or with an error for the supervisor (`supervise.rs`) to retry.

use std::sync::Arc;

use crate::inbox::Inbox;
use crate::kernel::Kernel;
use crate::lifecycle::Outcome;
use crate::store::Op;

pub use opkernel_domain::{decide, evidence};
mod launch;
mod supervise;
mod verdict;
mod watch;

pub use supervise::{
    attempt_start_after_failure, recover, spawn, spawn_fresh, watchdog, MAX_FAILED_ATTEMPTS,
    WATCHDOG_EVERY,
};

#[derive(Debug, thiserror::Error)]
pub enum ObserverError {
    #[error("control plane: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("op {0} vanished from the control plane")]
    Vanished(String),
    #[error("fault injected by a drill")]
    Injected,
    #[error("the supervisor was told to give up by a drill")]
    Abandoned,
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
    pub fn new(kernel: Arc<Kernel>, op: Op, inbox: Arc<Inbox>, anchor: supervise::Anchor) -> Self {
        ObserverAttempt {
            kernel,
            op,
            inbox,
            launched: false,
            anchor,
        }
    }

    pub async fn run(mut self) -> Step {
        if self.op.status == crate::lifecycle::Status::Starting && self.op.exec_claimed_at.is_none()
        {
            if !self.launch().await? {
                return Ok(());
            }
            // `launch` left the row as it is now in `self.op`
            self.launched = true;
        } else {
            self.reload().await?;
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
