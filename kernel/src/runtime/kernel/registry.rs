//! The run-container registry of this kernel: containers it knows to be
//! its own (rebuilt from labels at start), and per-run create locks so a
//! run's container is created once however many ops start at once.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sandbox::ContainerInfo;
use tokio::sync::Mutex;

use crate::base::sync::Lock;

/// Known run containers by id, and the per-run create locks.
#[derive(Default)]
pub struct ContainerRegistry {
    containers: Lock<HashMap<String, ContainerInfo>>,
    create_locks: Lock<HashMap<String, Arc<Mutex<()>>>>,
}

impl ContainerRegistry {
    /// A running container of that name, when known.
    pub fn running(&self, name: &str) -> Option<ContainerInfo> {
        let map = self.containers.lock();
        map.values().find(|c| c.name == name && c.running).cloned()
    }

    /// The container of that id, when known running.
    pub fn running_id(&self, id: &str) -> Option<ContainerInfo> {
        let map = self.containers.lock();
        map.get(id).filter(|c| c.running).cloned()
    }

    /// The lock serializing container creation for one run.
    pub fn create_lock(&self, run_id: &str) -> Arc<Mutex<()>> {
        self.create_locks
            .lock()
            .entry(run_id.to_owned())
            .or_default()
            .clone()
    }

    /// Records (or refreshes) a container.
    pub fn insert(&self, info: &ContainerInfo) {
        self.containers.lock().insert(info.id.clone(), info.clone());
    }

    /// A known container's new name (Docker renamed it); one forgotten
    /// meanwhile stays forgotten.
    pub fn rename(&self, id: &str, name: &str) {
        if let Some(c) = self.containers.lock().get_mut(id) {
            c.name = name.to_owned();
        }
    }

    /// Forgets a container, by id or name.
    pub fn remove(&self, name_or_id: &str) {
        self.containers
            .lock()
            .retain(|id, c| id != name_or_id && c.name != name_or_id);
    }

    /// Ids of the known containers.
    pub fn ids(&self) -> HashSet<String> {
        self.containers.lock().keys().cloned().collect()
    }

    /// Drops the create locks of runs not in `live` that nobody holds;
    /// how many went.
    pub fn trim(&self, live: &HashSet<String>) -> usize {
        let mut locks = self.create_locks.lock();
        let before = locks.len();
        locks.retain(|run, l| live.contains(run) || Arc::strong_count(l) > 1);
        before - locks.len()
    }

    /// Create locks held in the map.
    pub fn create_locks(&self) -> usize {
        self.create_locks.lock().len()
    }
}
