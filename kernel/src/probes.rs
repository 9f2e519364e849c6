//! Coalesced liveness probes: one marker probe per container serves every
//! observer of that container for `max_age`, so the Docker cost grows with
//! containers, not with ops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandbox::{PidRecord, Sandbox, SandboxError};

/// Why a probe gave no process list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeFailure {
    /// Daemon or container not answering: counts against the grace window.
    Unreachable(String),
    /// The container no longer exists.
    Gone,
    /// The container exists but is not running.
    Stopped,
    /// Anything else (refused, garbled output).
    Other(String),
}

pub use sandbox::liveness::Snapshot;

pub type ProbeResult = Result<Arc<Snapshot>, ProbeFailure>;

type Slot = Arc<tokio::sync::Mutex<Option<(Instant, ProbeResult)>>>;

#[derive(Default)]
pub struct ProbeCache {
    slots: Mutex<HashMap<String, Slot>>,
}

fn classify(err: SandboxError) -> ProbeFailure {
    match err {
        SandboxError::NotFound(_) => ProbeFailure::Gone,
        SandboxError::Conflict(msg) if msg.contains("not running") || msg.contains("paused") => {
            ProbeFailure::Stopped
        }
        SandboxError::Unreachable(msg) => ProbeFailure::Unreachable(msg),
        other => ProbeFailure::Other(other.to_string()),
    }
}

impl ProbeCache {
    /// A probe of `container_id` no older than `max_age`.
    pub async fn probe(
        &self,
        sandbox: &Sandbox,
        container_id: &str,
        max_age: Duration,
    ) -> ProbeResult {
        let slot = {
            let Ok(mut slots) = self.slots.lock() else {
                return Err(ProbeFailure::Other("probe cache poisoned".into()));
            };
            slots.entry(container_id.to_owned()).or_default().clone()
        };
        let mut guard = slot.lock().await;
        if let Some((at, result)) = guard.as_ref() {
            if at.elapsed() <= max_age {
                return result.clone();
            }
        }
        let started = Instant::now();
        let result = match tokio::time::timeout(
            Duration::from_secs(20),
            sandbox.probe(container_id),
        )
        .await
        {
            Ok(Ok(procs)) => Ok(Arc::new(Snapshot::new(procs))),
            Ok(Err(err)) => Err(classify(err)),
            Err(_) => Err(ProbeFailure::Unreachable(
                "probe timed out after 20s".into(),
            )),
        };
        *guard = Some((started, result.clone()));
        result
    }

    pub fn forget(&self, container_id: &str) {
        if let Ok(mut slots) = self.slots.lock() {
            slots.remove(container_id);
        }
    }
}

/// An op a container monitor watches: its wrapper's identity, its
/// observer's waker, and the alarm the monitor raises.
pub struct Watched {
    pub rec: PidRecord,
    pub wake: Arc<tokio::sync::Notify>,
    pub alarm: Arc<std::sync::atomic::AtomicBool>,
}

/// The ops one container monitor watches, by op id.
type WatchedOps = Arc<Mutex<HashMap<String, Watched>>>;

/// One task per container with watched ops: every interval it takes one
/// probe and wakes only the observers whose wrapper it did not find alive
/// (all of them when the probe failed). Observers of healthy ops sleep.
#[derive(Default)]
pub struct Monitors {
    containers: Mutex<HashMap<String, WatchedOps>>,
}

impl Monitors {
    /// Adds an op to its container's monitor, starting the monitor if needed.
    pub fn watch(
        &self,
        kernel: &Arc<crate::kernel::Kernel>,
        container_id: &str,
        op_id: &str,
        watched: Watched,
    ) {
        let Ok(mut containers) = self.containers.lock() else {
            return;
        };
        if let Some(ops) = containers.get(container_id) {
            if let Ok(mut ops) = ops.lock() {
                ops.insert(op_id.to_owned(), watched);
                return;
            }
        }
        let ops = Arc::new(Mutex::new(HashMap::from([(op_id.to_owned(), watched)])));
        containers.insert(container_id.to_owned(), ops.clone());
        tokio::spawn(monitor(kernel.clone(), container_id.to_owned(), ops));
    }

    pub fn unwatch(&self, container_id: &str, op_id: &str) {
        if let Ok(containers) = self.containers.lock() {
            if let Some(ops) = containers.get(container_id) {
                if let Ok(mut ops) = ops.lock() {
                    ops.remove(op_id);
                }
            }
        }
    }
}

async fn monitor(
    k: Arc<crate::kernel::Kernel>,
    container_id: String,
    ops: Arc<Mutex<HashMap<String, Watched>>>,
) {
    loop {
        tokio::time::sleep_until(k.next_tick().into()).await;
        {
            // a monitor with nothing left to watch ends (under the map lock,
            // so a concurrent watch starts a fresh monitor)
            let Ok(mut containers) = k.monitors.containers.lock() else {
                return;
            };
            if ops.lock().map_or(true, |o| o.is_empty()) {
                containers.remove(&container_id);
                return;
            }
        }
        let probe = k
            .probes
            .probe(&k.sandbox, &container_id, k.config.probe_interval)
            .await;
        let Ok(ops) = ops.lock() else { return };
        for (op_id, w) in ops.iter() {
            let healthy = matches!(&probe, Ok(snap) if snap.wrapper(op_id, &w.rec) == Some(true));
            if !healthy {
                w.alarm.store(true, std::sync::atomic::Ordering::SeqCst);
                w.wake.notify_one();
            }
        }
    }
}
