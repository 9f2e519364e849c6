//! A run's container on the kernel's side: created once per run (the
//! registry's create lock serializes a run's first ops), and removed with
//! its scratch dir when a one-shot run ends.

use sandbox::{ContainerInfo, RunIdentity};

use super::Kernel;

impl Kernel {
    /// The run container for `identity`, created on first use. Calls for one
    /// run are serialized; a known container is reused without a round trip.
    pub async fn ensure_container(
        &self,
        identity: &RunIdentity,
        profile: &sandbox::Profile,
    ) -> sandbox::Result<ContainerInfo> {
        if let Some(info) = self.registry.running(&identity.name) {
            return Ok(info);
        }
        let lock = self.registry.create_lock(&identity.run_id);
        let _guard = lock.lock().await;
        if let Some(info) = self.registry.running(&identity.name) {
            return Ok(info);
        }
        let info = self.backend.ensure_container(identity, profile).await?;
        self.remember_container(&info);
        Ok(info)
    }

    /// Removes every container of a run and its scratch dir (one-shot runs).
    pub async fn remove_run_container(&self, run_id: &str) {
        if let Ok(list) = self.backend.list_managed().await {
            for c in list.iter().filter(|c| {
                c.labels
                    .get(sandbox::profile::LABEL_RUN_ID)
                    .map(String::as_str)
                    == Some(run_id)
            }) {
                if let Err(e) = self.backend.remove(&c.id).await {
                    tracing::warn!(container = %c.name, %e, "cannot remove one-shot container");
                }
                self.forget_container(&c.id);
                self.probes.forget(&c.id);
            }
        }
        let key = sandbox::profile::scratch_key(run_id);
        self.watcher.unwatch(self.backend.ops_dir(&key).path());
        if let Err(e) = self.backend.remove_scratch(&key) {
            tracing::warn!(%e, "cannot remove one-shot scratch dir");
        }
    }
}
