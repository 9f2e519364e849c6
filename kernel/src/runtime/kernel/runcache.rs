//! What the kernel keeps per run in memory: its immutable facts (read once
//! from the control plane) and its wake-up channel ("something resolved or
//! a note arrived"), which report waiters and event streams listen to.
//! Both are caches: losing them loses nothing.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::watch;

use crate::base::sync::Lock;
use crate::runtime::runmeta::RunMeta;

/// Cached run facts and per-run wake-ups.
#[derive(Default)]
pub struct RunCache {
    meta: Lock<HashMap<String, Arc<RunMeta>>>,
    events: Lock<HashMap<String, watch::Sender<u64>>>,
}

impl RunCache {
    /// A run's cached facts.
    pub fn meta(&self, run_id: &str) -> Option<Arc<RunMeta>> {
        self.meta.lock().get(run_id).cloned()
    }

    /// Caches a run's facts; the first cached wins (they never change).
    pub fn insert(&self, run_id: &str, meta: RunMeta) -> Arc<RunMeta> {
        self.meta
            .lock()
            .entry(run_id.to_owned())
            .or_insert_with(|| Arc::new(meta))
            .clone()
    }

    /// Drops a run's cached facts.
    pub fn forget(&self, run_id: &str) {
        self.meta.lock().remove(run_id);
    }

    /// Subscribes to a run's wake-ups.
    pub fn subscribe(&self, run_id: &str) -> watch::Receiver<u64> {
        self.events
            .lock()
            .entry(run_id.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// Wakes a run's listeners.
    pub fn bump(&self, run_id: &str) {
        self.events
            .lock()
            .entry(run_id.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .send_modify(|v| *v += 1);
    }

    /// Drops entries of runs not in `live`: facts always (read again when
    /// needed), channels nobody listens to; how many went.
    pub fn trim(&self, live: &HashSet<String>) -> usize {
        let mut events = self.events.lock();
        let before = events.len();
        events.retain(|run, tx| live.contains(run) || tx.receiver_count() > 0);
        let mut gone = before - events.len();
        drop(events);
        let mut meta = self.meta.lock();
        let before = meta.len();
        meta.retain(|run, _| live.contains(run));
        gone += before - meta.len();
        gone
    }

    /// Entries held: (wake-up channels, cached facts).
    pub fn sizes(&self) -> (usize, usize) {
        (self.events.lock().len(), self.meta.lock().len())
    }
}
