//! A run's container on the kernel's side: created once per run (the
//! registry's create lock serializes a run's first ops), or adopted from
//! the warm pool by a new run, and removed with its scratch dir when a
//! one-shot run ends.

use sandbox::profile::{pool_fingerprint, LABEL_POOL, LABEL_RUN_ID, LABEL_SCRATCH_KEY};
use sandbox::{ContainerInfo, RunIdentity, SandboxError};

use super::Kernel;
use crate::runtime::pool::AdoptError;

impl Kernel {
    /// The identity of `run_id`'s container under `profile` on this
    /// kernel (a cluster node's name is in the container's name); refuses
    /// an invalid run id.
    pub fn run_identity(
        &self,
        run_id: &str,
        profile: &sandbox::Profile,
    ) -> sandbox::Result<RunIdentity> {
        let identity = RunIdentity::new(run_id, profile)?;
        Ok(match &self.node {
            Some(node) => identity.on_node(&node.config.name),
            None => identity,
        })
    }

    /// The run container for `identity`: the one it has (its own, or the
    /// pool container it adopted), else a free pool container adopted when
    /// the run is new and its profile pooled, else a container created for
    /// it. Calls for one run are serialized; a known container is reused
    /// without a round trip.
    pub async fn ensure_container(
        &self,
        identity: &RunIdentity,
        profile: &sandbox::Profile,
    ) -> sandbox::Result<ContainerInfo> {
        // an allow-list run's container is on the egress network, the
        // proxy in its environment (SPEC §27)
        let egress;
        let on_egress = profile.network == crate::runtime::egress::PLACEHOLDER;
        let profile = if on_egress {
            egress = self.egress_profile(profile).await?;
            &egress
        } else {
            profile
        };
        if let Some(info) = self.known_container(identity, profile) {
            return Ok(info);
        }
        let lock = self.registry.create_lock(&identity.run_id);
        let _guard = lock.lock().await;
        if let Some(info) = self.known_container(identity, profile) {
            return Ok(info);
        }
        if let Some(info) = self.bound_container(identity, profile).await? {
            self.remember_container(&info);
            return Ok(info);
        }
        if self.may_adopt(identity, profile) {
            let adopted = self.adopt(identity, profile).await;
            match adopted.map_err(|e| match e {
                AdoptError::Store(e) => {
                    SandboxError::Unreachable(format!("the control plane: {e}"))
                }
                AdoptError::File(e) => e,
            })? {
                Some(info) => {
                    self.remember_container(&info);
                    return Ok(info);
                }
                // bound meanwhile (by an earlier kernel's lost answer)
                None => {
                    if let Some(info) = self.bound_container(identity, profile).await? {
                        self.remember_container(&info);
                        return Ok(info);
                    }
                }
            }
        }
        if on_egress {
            self.egress_forget_peers();
        }
        let info = self.backend.ensure_container(identity, profile).await?;
        self.remember_container(&info);
        Ok(info)
    }

    /// The run's container when this kernel knows it running: its own
    /// (by name), or the pool container it adopted, made for its profile.
    fn known_container(
        &self,
        identity: &RunIdentity,
        profile: &sandbox::Profile,
    ) -> Option<ContainerInfo> {
        self.registry.running(&identity.name).or_else(|| {
            let b = self.pool.binding(&identity.run_id)?;
            // registered only while its binding file leads there
            // (remember_container)
            let info = self.registry.running_id(&b.container_id)?;
            (info.labels.get(LABEL_POOL) == Some(&pool_fingerprint(profile))).then_some(info)
        })
    }

    /// The pool container the run adopted, when it still serves it: it
    /// runs, is this home's, was made for the run's profile, and the run's
    /// binding file leads to its scratch dir (written again when missing).
    /// `None` sends the run to a container of its own, with the same
    /// `/scratch` (the binding file leads there).
    async fn bound_container(
        &self,
        identity: &RunIdentity,
        profile: &sandbox::Profile,
    ) -> sandbox::Result<Option<ContainerInfo>> {
        let Some(b) = self.pool.binding(&identity.run_id) else {
            return Ok(None);
        };
        let info = match self.backend.inspect(&b.container_id).await {
            Ok(info) => info,
            Err(SandboxError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let fits = info.running
            && self.backend.owns(&info)
            && info.labels.get(LABEL_POOL) == Some(&pool_fingerprint(profile))
            && info.labels.get(LABEL_SCRATCH_KEY) == Some(&b.scratch_key);
        if !fits {
            self.name_apart(&info, identity).await?;
            return Ok(None);
        }
        match self
            .backend
            .bind_scratch(&identity.scratch_key, &b.scratch_key)
        {
            Ok(()) => Ok(Some(info)),
            Err(e) => {
                tracing::warn!(run = %identity.run_id, %e, "the adopted container's binding file cannot be confirmed; the run gets a container of its own");
                self.name_apart(&info, identity).await?;
                Ok(None)
            }
        }
    }

    /// An adopted container that no longer serves its run but carries the
    /// run's name gives the name up (to the run's own container, made
    /// next), named apart; the reaper judges it as before. One already
    /// gone, or not this home's, is left as it is.
    async fn name_apart(
        &self,
        info: &ContainerInfo,
        identity: &RunIdentity,
    ) -> sandbox::Result<()> {
        if info.name != identity.name || !self.backend.owns(info) {
            return Ok(());
        }
        let short = &info.id[..12.min(info.id.len())];
        let apart = format!("{}-adopted-{short}", identity.name);
        match self.backend.rename(&info.id, &apart).await {
            Ok(()) | Err(SandboxError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// A run adopts from the pool only when it is new (no scratch dir yet,
    /// so no container ever) and its profile is pooled.
    fn may_adopt(&self, identity: &RunIdentity, profile: &sandbox::Profile) -> bool {
        self.pool.pools(profile)
            && self.pool.binding(&identity.run_id).is_none()
            && !self.backend.scratch_exists(&identity.scratch_key)
    }

    /// Removes every container of a run (its own and the pool container it
    /// adopted), then, once all are gone, its scratch dir and its binding
    /// (one-shot runs).
    pub async fn remove_run_container(&self, run_id: &str) {
        let bound = self.pool.binding(run_id).map(|b| b.container_id);
        let Ok(list) = self.backend.list_managed().await else {
            // its scratch and binding stay for the reaper: a container
            // may still use them
            tracing::warn!(run = %run_id, "cannot list one-shot containers; left to the reaper");
            return;
        };
        let mut all_gone = true;
        for c in list.iter().filter(|c| {
            c.labels.get(LABEL_RUN_ID).map(String::as_str) == Some(run_id)
                || Some(&c.id) == bound.as_ref()
        }) {
            if let Err(e) = self.backend.remove(&c.id).await {
                tracing::warn!(container = %c.name, %e, "cannot remove one-shot container; left to the reaper");
                all_gone = false;
            }
            self.forget_container(&c.id);
            self.probes.forget(&c.id);
        }
        if !all_gone {
            return;
        }
        let key = sandbox::profile::scratch_key(run_id);
        self.watcher.unwatch(self.backend.ops_dir(&key).path());
        if let Err(e) = self.backend.remove_scratch(&key) {
            tracing::warn!(%e, "cannot remove one-shot scratch dir");
            return;
        }
        if bound.is_some() {
            self.forget_binding(run_id).await;
        }
    }

    /// The run a container serves: its run label, or the run that adopted
    /// it from the pool.
    pub fn run_of(&self, c: &ContainerInfo) -> Option<String> {
        c.labels
            .get(LABEL_RUN_ID)
            .cloned()
            .or_else(|| self.pool.bound_run(&c.id))
    }

    /// Forgets a run's binding once its container and scratch are gone.
    pub async fn forget_binding(&self, run_id: &str) {
        match self.store.unbind(run_id).await {
            Ok(_) => self.pool.forget_run(run_id),
            Err(e) => {
                tracing::warn!(run = %run_id, %e, "binding not forgotten; kept until a later pass")
            }
        }
    }
}
