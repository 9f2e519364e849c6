//! One observer attempt of one op. Attempt 1 of a never-claimed `starting`
//! op wins the exec claim and launches the command; every other path only
//! attaches: through the `.pid`/`.code` files, identity-checked probes and
//! the control plane's record. The attempt ends when it settled the op (or
//! found it settled), or with an error for the supervisor to retry.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::kernel::Kernel;
use crate::lifecycle::{KillReason, Outcome, Status};
use crate::store::Op;

#[derive(Debug, thiserror::Error)]
pub enum ObserverError {
    #[error("control plane: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("op {0} vanished from the control plane")]
    Vanished(String),
    #[error("fault injected by a drill")]
    Injected,
}

type Step = Result<(), ObserverError>;

/// The instant `budget` after the wall-clock time `wall_start_ms`, on the
/// monotonic clock. The wall clock is read once per attempt, here: waits
/// measured from the result never move with a later clock step. (A start
/// time is recorded in wall time, so an attempt begun after a step reads it
/// against the stepped clock.)
pub fn mono_deadline(wall_start_ms: i64, budget: Duration) -> Instant {
    let left = wall_start_ms + budget.as_millis() as i64 - crate::store::now_ms();
    Instant::now() + Duration::from_millis(left.max(0) as u64)
}

/// Kill progress of the current attempt.
#[derive(Debug, Clone, Copy)]
struct KillProgress {
    reason: KillReason,
    term_at: Option<Instant>,
    kill_at: Option<Instant>,
    signalled: bool,
}

pub struct ObserverAttempt {
    kernel: Arc<Kernel>,
    op: Op,
    wake: Arc<tokio::sync::Notify>,
    unreachable_since: Option<Instant>,
    kill: Option<KillProgress>,
    /// A code file was ignored (its wrapper still ran): look again soon.
    code_ignored: bool,
    /// Set by a kill request for this op (the durable request is in the row).
    kill_flag: Arc<AtomicBool>,
    /// Raised by the container monitor when a probe did not find the wrapper alive.
    alarm: Arc<AtomicBool>,
    /// The op's timeout and start-evidence deadlines (monotonic), set when
    /// the attach loop begins.
    deadline: Instant,
    evidence_deadline: Instant,
}

mod attach;
mod launch;

impl ObserverAttempt {
    pub fn new(
        kernel: Arc<Kernel>,
        op: Op,
        wake: Arc<tokio::sync::Notify>,
        kill_flag: Arc<AtomicBool>,
    ) -> Self {
        ObserverAttempt {
            kernel,
            op,
            wake,
            unreachable_since: None,
            kill: None,
            code_ignored: false,
            kill_flag,
            alarm: Arc::new(AtomicBool::new(false)),
            deadline: Instant::now(),
            evidence_deadline: Instant::now(),
        }
    }
    pub async fn run(mut self) -> Step {
        if self.op.status == Status::Starting {
            if self.op.exec_claimed_at.is_none() && !self.launch().await? {
                return Ok(());
            }
            self.reload().await?;
            if self.op.status == Status::Starting && !self.settle_start_by_evidence().await? {
                return Ok(());
            }
        }
        if self.op.status.is_terminal() {
            return Ok(());
        }
        self.attach().await
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
