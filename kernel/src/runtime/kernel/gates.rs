//! Per-run gates between launches and the reaper: launches hold a run's
//! gate shared from ensuring its container until the exec exists; the
//! reaper holds it exclusively while it re-checks and removes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

use crate::base::sync::Lock;

/// The run gates, one per run that launched or was reaped lately.
#[derive(Default)]
pub struct RunGates {
    map: Lock<HashMap<String, Arc<RwLock<()>>>>,
}

impl RunGates {
    fn gate(&self, run_id: &str) -> Arc<RwLock<()>> {
        self.map
            .lock()
            .entry(run_id.to_owned())
            .or_default()
            .clone()
    }

    /// Held by a launch from ensuring the run container until its exec
    /// exists: the reaper cannot remove the container in between.
    pub async fn launch(&self, run_id: &str) -> OwnedRwLockReadGuard<()> {
        self.gate(run_id).read_owned().await
    }

    /// Held by the reaper while it re-checks a run and removes its
    /// container: no launch of the run is between container and exec.
    pub async fn reap(&self, run_id: &str) -> OwnedRwLockWriteGuard<()> {
        self.gate(run_id).write_owned().await
    }

    /// Drops the gates of runs not in `live` that nobody holds; how many went.
    pub fn trim(&self, live: &HashSet<String>) -> usize {
        let mut map = self.map.lock();
        let before = map.len();
        map.retain(|run, g| live.contains(run) || Arc::strong_count(g) > 1);
        before - map.len()
    }

    /// Gates held in the map.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Whether no gate is held in the map.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
