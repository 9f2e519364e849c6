//! Starting an op: the run container, the exec claim and the one launch.
//! The decisions (cancelled before start? what did Docker's answer mean?)
//! are `decide`'s; this file carries them out.

use sandbox::{Handback, LaunchSpec, OpsDir, RunIdentity};

use super::decide::{self, LaunchVerdict};
use super::{ObserverAttempt, ObserverError};
use crate::lifecycle::Outcome;
use crate::store::{now_ms, StoreError, StoreResult};

/// Retries an idempotent store call while the store is unreachable (each
/// second): for the launch's writes between the claim and the start, where
/// giving up would strand a claim whose command never ran.
async fn until_stored<T, F, Fut>(call: F) -> StoreResult<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = StoreResult<T>>,
{
    loop {
        match call().await {
            Err(StoreError::Unavailable(_)) => {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await
            }
            answer => return answer,
        }
    }
}

impl ObserverAttempt {
    /// Ensures the run container, wins the exec claim and launches the op
    /// once. Returns false when the op was settled (failed: nothing ran, or
    /// cancelled before start); true when it runs, may run, or another
    /// attempt holds the claim.
    pub(super) async fn launch(&mut self) -> Result<bool, ObserverError> {
        let k = self.kernel.clone();
        // the row as this attempt loaded it; a kill recorded since then
        // makes the claim below fail, and that path reloads
        let claimed = self.op.exec_claimed_at.is_some();
        if let Some(outcome) =
            decide::cancelled_before_start(claimed, self.op.kill_requested_at.is_some())
        {
            Box::pin(self.settle(outcome)).await?;
            return Ok(false);
        }
        let Some((identity, profile)) = Box::pin(self.run_target()).await? else {
            return Ok(false);
        };
        // the reaper decides about this run's container only while no launch
        // holds the gate, and re-checks the control plane under it
        let _gate = k.launch_gate(&self.op.run_id).await;
        // a run's launches queue at its gate: what follows is boxed, so a
        // queued launch holds only this function's few locals
        Box::pin(self.launch_gated(&k, identity, profile)).await
    }

    /// The launch under the run's gate: the container, the claim, and the
    /// hand-over to the launcher or the exec.
    async fn launch_gated(
        &mut self,
        k: &std::sync::Arc<crate::runtime::kernel::Kernel>,
        identity: RunIdentity,
        profile: sandbox::Profile,
    ) -> Result<bool, ObserverError> {
        let Some(container) = self.run_container(&identity, &profile).await? else {
            return Ok(false);
        };
        // only the winner of the claim may launch; the claim also records
        // the container, the first attempt and the handover in one write,
        // and loses to a kill request recorded before it
        let handover = k.hands_over_to(&container);
        if !k.may_start() {
            return Err(ObserverError::Fenced);
        }
        let Some(claimed_at) = self.claim(&container.id, handover).await? else {
            if self.settled_before_start().await? {
                return Ok(false);
            }
            // on a node, a refusal of a claim nobody holds is the fence's
            if k.node.is_some() && self.op.exec_claimed_at.is_none() {
                return Err(ObserverError::Fenced);
            }
            return Ok(true);
        };
        // the row now, without reading it back
        self.op.exec_claimed_at = Some(claimed_at);
        self.op.attempt = self.op.attempt.max(1);
        self.op.kernel_id = Some(k.id.clone());
        self.op.container_id = Some(container.id.clone());
        let ops = k.backend.ops_dir(&identity.scratch_key);
        k.watcher.watch(ops.path());
        // the lease may have lapsed during the claim's round trip: no
        // command starts unless it surely holds (the claimed op, not
        // started, is lost by evidence or by the sweep, never run late)
        if !k.may_start() {
            return Err(ObserverError::Fenced);
        }
        if handover {
            self.op.handed_over_at = Some(claimed_at);
            if self.hand_over(&ops, &container.hostname).await? {
                return Ok(true);
            }
        }
        if !self
            .launch_claimed(&identity, &profile, container.id)
            .await?
        {
            return Ok(false);
        }
        self.reload().await?;
        Ok(true)
    }

    /// Files the op's request in its launcher's inbox; from then on the
    /// watch loop waits for the claim (decide's `Handover`). False when the
    /// request could not be filed and was not claimed: nothing ran, so the
    /// op goes by `docker exec`.
    async fn hand_over(&self, ops: &OpsDir, host: &str) -> Result<bool, ObserverError> {
        let k = &self.kernel;
        let spec = LaunchSpec {
            op_id: &self.op.id,
            run_as: k.config.profile.run_as.as_deref(),
            log_cap_bytes: k.config.ops.log_cap_bytes,
            io: self.op.io,
        };
        // what cannot be a request cannot be an exec either: that path
        // refuses it with the same error
        let Ok(request) = sandbox::shim::launch_request(&spec, &self.op.command, host) else {
            return Ok(false);
        };
        // a small local file written and renamed: done inline, like the
        // executor's reads of the op's files
        let filed = ops
            .submit(&request)
            .map_err(|e| e.to_string())
            .or_else(|e| match ops.withdraw(&self.op.id) {
                Ok(Handback::Claimed) => Ok(()),
                _ => Err(e),
            });
        match filed {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::warn!(op = %self.op.id, %e, "cannot file the request for the launcher; starting by docker exec");
                Ok(false)
            }
        }
    }

    /// The claimed op's launch by `docker exec`, once more on a fresh
    /// container when the cached one had vanished (then no exec existed, so
    /// nothing ran). Also the fallback of a request the launcher did not
    /// claim and the kernel took back.
    pub(super) async fn launch_claimed(
        &mut self,
        identity: &RunIdentity,
        profile: &sandbox::Profile,
        mut container_id: String,
    ) -> Result<bool, ObserverError> {
        let k = self.kernel.clone();
        let mut retried = false;
        loop {
            let started = now_ms();
            let result = self.exec(&container_id).await?;
            match super::verdict::launch_verdict(&result, retried) {
                LaunchVerdict::Started => {
                    if k.store.mark_running(&self.op.id, started).await? {
                        let waited_ms = now_ms() - self.op.requested_at_ms();
                        k.store.metrics().op_running(waited_ms);
                    }
                    return Ok(true);
                }
                LaunchVerdict::Unknown => {
                    tracing::warn!(op = %self.op.id, ?result, "launch outcome unknown; settling by evidence");
                    return Ok(true);
                }
                LaunchVerdict::Refused(error) => {
                    k.forget_container(&container_id);
                    return self.fail(error).await;
                }
                LaunchVerdict::StaleContainer => {
                    k.forget_container(&container_id);
                    k.probes.forget(&container_id);
                    let Some(fresh) = self.run_container(identity, profile).await? else {
                        return Ok(false);
                    };
                    container_id = fresh.id;
                    until_stored(|| k.store.set_container(&self.op.id, &container_id)).await?;
                    self.op.container_id = Some(container_id.clone());
                    retried = true;
                }
            }
        }
    }

    /// Creates the op's launch, records it (so its record can corroborate
    /// the op's end), then starts it.
    async fn exec(&self, container_id: &str) -> Result<sandbox::Result<()>, ObserverError> {
        let k = &self.kernel;
        let spec = LaunchSpec {
            op_id: &self.op.id,
            run_as: k.config.profile.run_as.as_deref(),
            log_cap_bytes: k.config.ops.log_cap_bytes,
            io: self.op.io,
        };
        let launch_id = match k
            .backend
            .create_launch(container_id, &spec, &self.op.command)
            .await
        {
            Ok(id) => id,
            Err(e) => return Ok(Err(e)),
        };
        // created, not started: nothing runs while the store is away, nor
        // once the op was settled meanwhile (a sweep of a lapsed node)
        if !until_stored(|| k.store.record_exec(&self.op.id, &launch_id)).await? || !k.may_start() {
            return Err(ObserverError::Fenced);
        }
        Ok(k.backend.start_launch(&launch_id).await)
    }

    /// The exec claim, with a certain answer: when won, the time it was
    /// recorded with. When the store went away mid-claim (the commit's
    /// answer lost), every later answer is read back once it answers: a
    /// claim naming this kernel and container, with no launch yet, is this
    /// attempt's (one attempt per op per kernel), and nothing has run: the
    /// launch goes on, where ending the attempt would leave a claim no one
    /// launched, and the op `lost` instead of run. (A retried claim can
    /// lose to its own first try, committed late: hence the read-back of a
    /// refusal too.)
    async fn claim(
        &self,
        container_id: &str,
        handover: bool,
    ) -> Result<Option<i64>, ObserverError> {
        let k = &self.kernel;
        let mut uncertain = false;
        loop {
            let tried_at = now_ms();
            let answer = k
                .store
                .claim_exec(&self.op.id, &k.id, container_id, (handover, k.fence()))
                .await;
            let away = matches!(answer, Err(StoreError::Unavailable(_)));
            if !uncertain && !away {
                return Ok(answer?.then_some(tried_at));
            }
            if let Err(StoreError::Unavailable(e)) = &answer {
                tracing::warn!(op = %self.op.id, error = %e, "the store went away during the exec claim; reading it back when it answers");
            }
            uncertain = true;
            let row = until_stored(|| k.store.get_op(&self.op.id)).await?;
            let Some(row) = row else { return Ok(None) };
            let Some(claimed_at) = row.exec_claimed_at else {
                if away {
                    // that try may not have landed: try again
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    continue;
                }
                // refused (a kill, a settle) or failed, and not claimed
                return Ok(answer?.then_some(tried_at));
            };
            let ours = row.kernel_id.as_deref() == Some(k.id.as_str())
                && row.container_id.as_deref() == Some(container_id)
                && !row.status.is_terminal()
                && row.exec_id.is_none()
                && row.pid.is_none();
            return Ok(ours.then_some(claimed_at));
        }
    }

    /// The op's run container identity and profile (its run's envelope
    /// over the kernel's profile), or `None` after settling the op failed
    /// (nothing ran: the run id cannot name a container).
    pub(super) async fn run_target(
        &self,
    ) -> Result<Option<(RunIdentity, sandbox::Profile)>, ObserverError> {
        let profile = self.kernel.run_profile(&self.op.run_id).await?;
        match self.kernel.run_identity(&self.op.run_id, &profile) {
            Ok(identity) => Ok(Some((identity, profile))),
            Err(e) => {
                self.fail(e.to_string()).await?;
                Ok(None)
            }
        }
    }

    /// Reloads the row: true when the op is terminal, or was just settled
    /// because a kill arrived before its exec claim.
    async fn settled_before_start(&mut self) -> Result<bool, ObserverError> {
        self.reload().await?;
        if self.op.status.is_terminal() {
            return Ok(true);
        }
        let claimed = self.op.exec_claimed_at.is_some();
        match decide::cancelled_before_start(claimed, self.op.kill_requested_at.is_some()) {
            Some(outcome) => {
                self.settle(outcome).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Settles the op `failed`: nothing ran. Returns false (settled). The
    /// settle (a compare-and-set) waits out a store outage: a next attempt
    /// would find a claimed op with no evidence, and call it `lost`.
    async fn fail(&self, error: String) -> Result<bool, ObserverError> {
        let failed = Outcome::Failed {
            error,
            killed: false,
        };
        until_stored(|| self.kernel.settle(&self.op, failed.clone())).await?;
        Ok(false)
    }

    /// The run container, or `None` after settling the op as failed (the
    /// container could not be had, so nothing ran).
    async fn run_container(
        &self,
        identity: &RunIdentity,
        profile: &sandbox::Profile,
    ) -> Result<Option<sandbox::ContainerInfo>, ObserverError> {
        match self.kernel.ensure_container(identity, profile).await {
            Ok(c) => Ok(Some(c)),
            Err(e) => {
                self.fail(format!("run container unavailable: {e}")).await?;
                Ok(None)
            }
        }
    }
}
