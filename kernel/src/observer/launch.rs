//! Starting an op: the run container, the exec claim and the one exec, or,
//! for a claimed op still `starting`, the evidence that settles it.

use std::time::Duration;

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
        let identity = match RunIdentity::new(&self.op.run_id, &k.config.profile) {
            Ok(identity) => identity,
            Err(e) => {
                self.settle(Outcome::Failed {
                    error: e.to_string(),
                })
                .await?;
                return Ok(false);
            }
        };
        let Some(container) = self.run_container(&identity).await? else {
            return Ok(false);
        };
        // only the winner of the claim may create the exec; the claim also
        // records the container and the first attempt in one write
        if !k
            .store
            .claim_exec(&self.op.id, &k.id, &container.id)
            .await?
        {
            return Ok(true);
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
        let mut launched = k
            .sandbox
            .launch(&container.id, &spec, &self.op.command)
            .await;
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
            launched = k
                .sandbox
                .launch(&container.id, &spec, &self.op.command)
                .await;
        }
        match launched {
            Ok(_) => {
                k.store.mark_running(&self.op.id, started).await?;
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
                })
                .await?;
                Ok(None)
            }
        }
    }
    /// A claimed op still `starting` (launch answer lost, or the kernel died
    /// mid-launch): the pid/code files and marker processes decide.
    /// Returns false when the op was settled.
    pub(super) async fn settle_start_by_evidence(&mut self) -> Result<bool, ObserverError> {
        let k = self.kernel.clone();
        let ops = k.sandbox.ops_dir(&self.op.scratch_key);
        k.watcher.watch(ops.path());
        let claimed_at = self.op.exec_claimed_at.unwrap_or(self.op.created_at);
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
            let waited = (now_ms() - claimed_at).max(0) as u64;
            if waited >= k.config.start_evidence_window.as_millis() as u64 {
                self.settle(Outcome::Failed {
                    error:
                        "the command never started: no pid file, exit code or process of it exists"
                            .into(),
                })
                .await?;
                return Ok(false);
            }
            let _ = tokio::time::timeout(Duration::from_millis(250), notified).await;
        }
    }
}
