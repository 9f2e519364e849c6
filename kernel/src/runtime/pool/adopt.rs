//! Adoption: a new run's first op takes a free pool container, writes the
//! binding row (one transaction), then the binding file. A kernel killed
//! at any step leaves the container the run's (the row landed) or the
//! pool's stray (it did not), never both: the row decides.

use sandbox::profile::{LABEL_SCRATCH_KEY, POOL_NAME_PREFIX};
use sandbox::ContainerInfo;

use super::PoolRole;
use crate::runtime::kernel::Kernel;
use crate::store::{Binding, Bound, StoreError};

/// Why an adoption failed after its container was taken.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// The control plane did not answer the binding's write.
    #[error("the control plane did not record the binding: {0}")]
    Store(#[from] StoreError),
    /// The binding file could not be written (the row stands: the run's
    /// next op writes it again).
    #[error("the binding file could not be written: {0}")]
    File(#[from] sandbox::SandboxError),
}

impl Kernel {
    /// A new run's first op adopts a free pool container of its profile:
    /// the binding row in one transaction, then the binding file. `None`:
    /// no free container (or the run turned out bound already: the caller
    /// looks its binding up again).
    pub async fn adopt(
        &self,
        identity: &sandbox::RunIdentity,
        profile: &sandbox::Profile,
    ) -> Result<Option<ContainerInfo>, AdoptError> {
        let run_id = identity.run_id.as_str();
        let Some(c) = self.pool.take(profile) else {
            self.pool.wake.notify_one();
            return Ok(None);
        };
        self.pool.wake.notify_one();
        let key = c.labels.get(LABEL_SCRATCH_KEY).cloned().unwrap_or_default();
        let binding = Binding {
            run_id: run_id.to_owned(),
            container_id: c.id.clone(),
            scratch_key: key.clone(),
            node: self.store.node().map(str::to_owned),
        };
        self.crash_point("pool.before_bind");
        match self.store.bind_container(binding.clone()).await {
            Ok(Bound::Bound) => {}
            // the run is bound already (or the container is, which this
            // kernel's memory did not know): nothing written, the
            // container is a stray from now on, never free again
            Ok(Bound::Taken(existing)) => {
                self.pool.release_taken(&c.id, existing);
                return Ok(None);
            }
            Err(e) => match self.read_back(&binding).await {
                ReadBack::Landed => {}
                ReadBack::Elsewhere(b) => {
                    self.pool.release_taken(&c.id, Some(b));
                    return Ok(None);
                }
                ReadBack::Uncertain => {
                    self.pool.uncertain(&c.id);
                    return Err(e.into());
                }
            },
        }
        self.pool.remember(binding);
        self.crash_point("pool.after_bind");
        self.backend
            .bind_scratch(&sandbox::profile::scratch_key(run_id), &key)?;
        self.crash_point("pool.after_file");
        self.take_run_name(&c, identity);
        Ok(Some(c))
    }
}

impl Kernel {
    /// An adopted container takes its run's container name (its labels
    /// cannot change: the name is how an operator finds a run's container
    /// with Docker, SPEC §24), in the background: Docker's rename (a few
    /// ms of the engine's work) is not on the run's first command's path,
    /// nor its engine's work while that command starts.
    /// Until it is done the run finds its container by its binding, as
    /// every adopted container is found. The rename holds the run's create
    /// lock, as the adoption did: nothing that names an unfit container
    /// apart or makes the run a container of its own runs before it ends.
    /// Not renamed (a name in use, Docker away), the container keeps its
    /// pool name and serves the run all the same.
    fn take_run_name(&self, c: &ContainerInfo, identity: &sandbox::RunIdentity) {
        let Some(k) = self.arc() else { return };
        let (id, pool_name) = (c.id.clone(), c.name.clone());
        let (name, run_id) = (identity.name.clone(), identity.run_id.clone());
        // the lock's first holder (the adoption's caller) lets go when its
        // container is known; this task queues behind it
        let lock = self.registry.create_lock(&run_id);
        tokio::spawn(async move {
            // after the first command's start, as the refill is
            tokio::time::sleep(super::upkeep::SETTLE).await;
            let _guard = lock.lock().await;
            match k.backend.rename(&id, &name).await {
                Ok(()) => k.registry.rename(&id, &name),
                // removed meanwhile (a one-shot run that ended)
                Err(sandbox::SandboxError::NotFound(_)) => {}
                Err(e) => {
                    tracing::warn!(container = %pool_name, run = %run_id, %e, "warm pool: the adopted container keeps its pool name")
                }
            }
        });
    }
}

impl Kernel {
    /// At start: an adopted container still under its pool name (its
    /// kernel stopped between the adoption and the rename) takes its run's
    /// name, as the adoption would have given it.
    pub(super) async fn restore_run_names(&self, list: &[ContainerInfo]) {
        for c in list.iter().filter(|c| c.name.starts_with(POOL_NAME_PREFIX)) {
            let Some(PoolRole::Bound(run)) = self.pool.role(c) else {
                continue;
            };
            let Ok(profile) = self.run_profile(&run).await else {
                continue;
            };
            if let Ok(identity) = self.run_identity(&run, &profile) {
                self.take_run_name(c, &identity);
            }
        }
    }
}

/// The control plane's word on a bind whose answer was lost.
enum ReadBack {
    /// The binding landed.
    Landed,
    /// The run is bound to another container.
    Elsewhere(Binding),
    /// No binding is visible (a commit may still land) or the store
    /// answered with an error: the container stays taken, and the upkeep
    /// asks again later.
    Uncertain,
}

impl Kernel {
    /// Reads a lost bind back, once the control plane answers.
    async fn read_back(&self, binding: &Binding) -> ReadBack {
        loop {
            match self.store.binding_of_run(&binding.run_id).await {
                Ok(Some(b)) if b == *binding => return ReadBack::Landed,
                Ok(Some(b)) => return ReadBack::Elsewhere(b),
                Ok(None) => return ReadBack::Uncertain,
                Err(StoreError::Unavailable(_)) => {
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await
                }
                Err(e) => {
                    tracing::warn!(%e, container = %binding.container_id, "binding not read back; the pool container stays taken");
                    return ReadBack::Uncertain;
                }
            }
        }
    }
}
