//! Coalesced liveness probes: one marker probe per container serves every
//! observer of that container for `max_age`, so the Docker cost grows with
//! containers, not with ops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandbox::{MarkedProcess, Sandbox, SandboxError};

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

pub type ProbeResult = Result<Arc<Vec<MarkedProcess>>, ProbeFailure>;

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
            Ok(Ok(procs)) => Ok(Arc::new(procs)),
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
