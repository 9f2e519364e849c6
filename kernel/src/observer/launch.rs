//! Starting an op: the run container, the exec claim and the one exec, or,
//! for a claimed op still `starting`, the evidence that settles it.

use std::time::{Duration, Instant};

use sandbox::{RunIdentity, SandboxError, WrapperSpec};

use super::{ObserverAttempt, ObserverError};
use crate::lifecycle::Outcome;
use crate::store::now_ms;

impl ObserverAttempt {
    /// Ensures the run container, wins the exec claim and creates the op's one
    /// exec. Returns false when the op was settled (failed: nothing ran);
    /// true when it runs, may run, or another attempt holds the claim.
    pub(super) async fn launch(&mut self) -> Result<bool, ObserverError> {
        let k = self.kernel.clone();
        if self.cancelled_before_start().await? {
            return Ok(false);
        }
        let identity = match RunIdentity::new(&self.op.run_id, &k.config.profile) {
            Ok(identity) => identity,
            Err(e) => {
                self.settle(Outcome::Failed {
                    error: e.to_string(),
                    killed: false,
                })
                .await?;
                return Ok(false);
            }
        };
        // the reaper decides about this run's container only while no launch
        // holds the gate, and re-checks the control plane under it
        let _gate = k.launch_gate(&self.op.run_id).await;
        let Some(container) = self.run_container(&identity).await? else {
            return Ok(false);
        };
        // only the winner of the claim may create the exec; the claim also
        // records the container and the first attempt in one write, and
        // loses to a kill request recorded before it
        if !k
            .store
            .claim_exec(&self.op.id, &k.id, &container.id)
            .await?
        {
            return Ok(!self.cancelled_before_start().await?);
        }
        self.op.container_id = Some(container.id.clone());
        k.watcher
            .watch(k.sandbox.ops_dir(&identity.scratch_key).path());
        let spec = WrapperSpec {
            op_id: &self.op.id,
            run_as: k.config.profile.run_as.as_deref(),
            log_cap_bytes: k.config.log_cap_bytes,
        };
        let mut container = container;
        let mut started = now_ms();
        let mut launched = self.exec(&container.id, &spec).await?;
        if matches!(
            launched,
            Err(SandboxError::NotFound(_) | SandboxError::Conflict(_))
        ) {
            // the cached container was removed or stopped: no exec exists, so
            // nothing ran; ensure the run container afresh and launch once more
            k.forget_container(&container.id);
            k.probes.forget(&container.id);
            let Some(fresh) = self.run_container(&identity).await? else {
                return Ok(false);
            };
            container = fresh;
            k.store.set_container(&self.op.id, &container.id).await?;
            self.op.container_id = Some(container.id.clone());
            started = now_ms();
            launched = self.exec(&container.id, &spec).await?;
        }
        match launched {
            Ok(()) => {
                k.store.mark_running(&self.op.id, started).await?;
                Ok(true)
            }
            // a gateway or daemon failure: the start may still have happened
            Err(e @ SandboxError::Refused { status: 500.., .. }) => {
                tracing::warn!(op = %self.op.id, %e, "exec start outcome unknown; settling by evidence");
                Ok(true)
            }
            // the engine answered no: the exec was not created or not started
            Err(
                e @ (SandboxError::Refused { .. }
                | SandboxError::NotFound(_)
                | SandboxError::Conflict(_)
                | SandboxError::Invalid(_)
                | SandboxError::Foreign { .. }),
            ) => {
                k.forget_container(&identity.name);
                self.settle(Outcome::Failed {
                    error: format!("docker refused the command: {e}"),
                    killed: false,
                })
                .await?;
                Ok(false)
            }
            // unclear whether it started: the evidence decides
            Err(e) => {
                tracing::warn!(op = %self.op.id, %e, "exec start outcome unknown; settling by evidence");
                Ok(true)
            }
        }
    }
    /// Creates the op's exec, records it (so its record can corroborate the
    /// op's end), then starts it.
    async fn exec(
        &self,
        container_id: &str,
        spec: &WrapperSpec<'_>,
    ) -> Result<sandbox::Result<()>, ObserverError> {
        let k = &self.kernel;
        let exec_id = match k
            .sandbox
            .create_op_exec(container_id, spec, &self.op.command)
            .await
        {
            Ok(id) => id,
            Err(e) => return Ok(Err(e)),
        };
        k.store.record_exec(&self.op.id, &exec_id).await?;
        Ok(k.sandbox.start_op_exec(&exec_id).await)
    }
    /// A kill recorded before the exec claim wins: the op never runs and
    /// ends `failed` (nothing ran) with `killed`. Returns true when it settled.
    async fn cancelled_before_start(&mut self) -> Result<bool, ObserverError> {
        self.reload().await?;
        let unclaimed = self.op.status == crate::lifecycle::Status::Starting
            && self.op.exec_claimed_at.is_none();
        if !(unclaimed && self.op.kill_requested_at.is_some()) {
            return Ok(self.op.status.is_terminal());
        }
        self.settle(Outcome::Failed {
            error: "cancelled before start".into(),
            killed: true,
        })
        .await?;
        Ok(true)
    }
    /// The run container, or `None` after settling the op as failed (the
    /// container could not be had, so nothing ran).
    async fn run_container(
        &self,
        identity: &RunIdentity,
    ) -> Result<Option<sandbox::ContainerInfo>, ObserverError> {
        match self.kernel.ensure_container(identity).await {
            Ok(c) => Ok(Some(c)),
            Err(e) => {
                self.settle(Outcome::Failed {
                    error: format!("run container unavailable: {e}"),
                    killed: false,
                })
                .await?;
                Ok(None)
            }
        }
    }
    /// A claimed op still `starting` (the start request's answer was lost or
    /// timed out, or the kernel died mid-launch): the pid/code files and
    /// marker processes decide. Without any evidence by the grace window
    /// after the claim the op is `lost` with effect uncertain: Docker may
    /// still run a queued exec, so "nothing ran" (`failed`) would be a guess.
    /// Returns false when the op was settled.
    pub(super) async fn settle_start_by_evidence(&mut self) -> Result<bool, ObserverError> {
        let k = self.kernel.clone();
        let ops = k.sandbox.ops_dir(&self.op.scratch_key);
        k.watcher.watch(ops.path());
        let claimed_at = self.op.exec_claimed_at.unwrap_or(self.op.created_at);
        // measured on the monotonic clock from the claim's wall time, read once
        // the grace window runs from the claim, and from now: a start request
        // may itself have taken up to the Docker timeout to fail
        let window = k.config.grace.max(k.config.start_evidence_window);
        let give_up =
            crate::observer::mono_deadline(claimed_at, window).max(Instant::now() + window);
        let wake = self.wake.clone();
        loop {
            let notified = wake.notified();
            if ops.read_code(&self.op.id).is_ok() || ops.read_pid(&self.op.id).is_ok() {
                k.store.mark_running(&self.op.id, claimed_at).await?;
                self.reload().await?;
                return Ok(true);
            }
            if let Some(cid) = self.op.container_id.clone() {
                if let Ok(procs) = k.probes.probe(&k.sandbox, &cid, Duration::ZERO).await {
                    if procs.has_op(&self.op.id) {
                        k.store.mark_running(&self.op.id, claimed_at).await?;
                        self.reload().await?;
                        return Ok(true);
                    }
                }
            }
            if Instant::now() >= give_up {
                self.settle(Outcome::Lost {
                    reason: format!(
                        "the start of the command was not confirmed: no pid file, exit code or process \
                         of it appeared within {}s of its launch (it may still have run)",
                        window.as_secs()
                    ),
                })
                .await?;
                return Ok(false);
            }
            let _ = tokio::time::timeout(Duration::from_millis(250), notified).await;
        }
    }
}
