//! Coalesced liveness probes: one marker probe per container serves every
//! observer of that container for `max_age`, so the Docker cost grows with
//! containers, not with ops.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox::{OpBackend, PidRecord, SandboxError};

use crate::base::sync::Lock;
use crate::runtime::inbox::{Inbox, Wake};

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

/// One probe's answer, shared by every observer of the container that asked
/// within `max_age`.
pub type ProbeResult = Result<Arc<Snapshot>, ProbeFailure>;

type Slot = Arc<tokio::sync::Mutex<Option<(Instant, ProbeResult)>>>;

/// The latest probe of each container, shared by its observers, and the
/// resident launchers probes may be asked of.
#[derive(Default)]
pub struct ProbeCache {
    slots: Lock<HashMap<String, Slot>>,
    /// Containers with a resident launcher, by id: their scratch key and hostname.
    launchers: Lock<HashMap<String, (String, String)>>,
    /// Probes answered by a launcher; asked of a launcher that stayed
    /// silent (then sent by `docker exec`); sent by `docker exec` alone.
    by_launcher: AtomicU64,
    launcher_silent: AtomicU64,
    by_exec: AtomicU64,
}

/// How many probes went each way since the kernel started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProbeCounts {
    /// Answered by a container's resident launcher (no Docker call).
    pub by_launcher: u64,
    /// Asked of the launcher, which did not answer in time: then sent by
    /// `docker exec` (a busy machine, or a launcher gone).
    pub launcher_silent: u64,
    /// Sent by `docker exec` only: no launcher known for the container.
    pub by_exec: u64,
}

/// How long a launcher has to answer a probe before the probe goes by
/// `docker exec` instead.
const LAUNCHER_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

fn classify(err: SandboxError) -> ProbeFailure {
    match err {
        SandboxError::NotFound(_) => ProbeFailure::Gone,
        // a paused container is frozen, not stopped: it cannot answer now,
        // and what runs in it goes on once unpaused (the grace applies)
        SandboxError::Conflict(msg) if msg.contains("paused") => {
            ProbeFailure::Unreachable(format!("the container is paused: {msg}"))
        }
        SandboxError::Conflict(msg) if msg.contains("not running") => ProbeFailure::Stopped,
        SandboxError::Unreachable(msg) => ProbeFailure::Unreachable(msg),
        other => ProbeFailure::Other(other.to_string()),
    }
}

impl ProbeCache {
    /// A probe of `container_id` no older than `max_age`.
    pub async fn probe(
        &self,
        backend: &dyn OpBackend,
        container_id: &str,
        max_age: Duration,
    ) -> ProbeResult {
        let slot = {
            let mut slots = self.slots.lock();
            slots.entry(container_id.to_owned()).or_default().clone()
        };
        let mut guard = slot.lock().await;
        if let Some((at, result)) = guard.as_ref() {
            if at.elapsed() <= max_age {
                return result.clone();
            }
        }
        let started = Instant::now();
        let launcher = self.launchers.lock().get(container_id).cloned();
        if let Some((key, host)) = launcher {
            // the launcher answers in about a millisecond; silence sends the
            // probe the slow way, which also tells a stopped container apart
            if let Ok(Some(procs)) = backend
                .probe_by_launcher(&key, &host, LAUNCHER_PROBE_TIMEOUT)
                .await
            {
                self.by_launcher.fetch_add(1, Ordering::Relaxed);
                let result: ProbeResult = Ok(Arc::new(Snapshot::new(procs)));
                *guard = Some((started, result.clone()));
                return result;
            }
            self.launcher_silent.fetch_add(1, Ordering::Relaxed);
        } else {
            self.by_exec.fetch_add(1, Ordering::Relaxed);
        }
        let result = match tokio::time::timeout(
            Duration::from_secs(20),
            backend.probe(container_id),
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

    /// How many probes went each way so far.
    pub fn counts(&self) -> ProbeCounts {
        ProbeCounts {
            by_launcher: self.by_launcher.load(Ordering::Relaxed),
            launcher_silent: self.launcher_silent.load(Ordering::Relaxed),
            by_exec: self.by_exec.load(Ordering::Relaxed),
        }
    }

    /// Drops the container's cached probe (the container went away): the
    /// next probe asks afresh.
    pub fn forget(&self, container_id: &str) {
        self.slots.lock().remove(container_id);
    }

    /// Drops the cached probes and launcher addresses of every container
    /// not in `known`; returns how many entries went.
    pub fn retain_containers(&self, known: &std::collections::HashSet<String>) -> usize {
        let mut slots = self.slots.lock();
        let before = slots.len();
        slots.retain(|id, _| known.contains(id));
        let mut gone = before - slots.len();
        drop(slots);
        let mut launchers = self.launchers.lock();
        let before = launchers.len();
        launchers.retain(|id, _| known.contains(id));
        gone += before - launchers.len();
        gone
    }

    /// Probes of this container may be asked of its resident launcher.
    pub fn use_launcher(&self, container_id: &str, scratch_key: &str, hostname: &str) {
        self.launchers.lock().insert(
            container_id.to_owned(),
            (scratch_key.to_owned(), hostname.to_owned()),
        );
    }
}

/// The grid every safety-net tick falls on: ticks of all observers and
/// monitors land in one burst per `every` (and share one probe per
/// container) instead of spreading wake-ups over the interval.
#[derive(Debug, Clone, Copy)]
pub struct Ticks {
    origin: Instant,
    every: Duration,
}

impl Ticks {
    /// A grid of period `every` starting now.
    pub fn new(every: Duration) -> Ticks {
        Ticks {
            origin: Instant::now(),
            every,
        }
    }

    /// The grid's period: the safety-net interval.
    pub fn every(&self) -> Duration {
        self.every
    }

    /// The next point on the grid after now.
    pub fn next(&self) -> Instant {
        let every = self.every.as_nanos().max(1);
        let since = self.origin.elapsed().as_nanos();
        let next = (since / every + 1) * every;
        self.origin + Duration::from_nanos(next as u64)
    }
}

/// An op a container monitor watches: its wrapper's identity and its
/// observer's inbox, where the monitor posts [`Wake::Alarm`].
pub struct Watched {
    /// The wrapper's identity as recorded in the op's row.
    pub rec: PidRecord,
    /// The op's observer inbox, where an alarm is posted.
    pub inbox: Arc<Inbox>,
}

/// The ops one container monitor watches, by op id.
type WatchedOps = Arc<Lock<HashMap<String, Watched>>>;

/// One task per container with watched ops: every tick it takes one probe
/// and alarms only the observers whose wrapper it did not find alive (all
/// of them when the probe failed). Observers of healthy ops sleep.
#[derive(Clone)]
pub struct Monitors {
    shared: Arc<MonitorsShared>,
}

struct MonitorsShared {
    containers: Lock<HashMap<String, WatchedOps>>,
    backend: Arc<dyn OpBackend>,
    probes: Arc<ProbeCache>,
    ticks: Ticks,
}

impl Monitors {
    /// No monitor runs until the first [`Monitors::watch`]; each then probes on
    /// the `ticks` grid.
    pub fn new(backend: Arc<dyn OpBackend>, probes: Arc<ProbeCache>, ticks: Ticks) -> Monitors {
        Monitors {
            shared: Arc::new(MonitorsShared {
                containers: Lock::default(),
                backend,
                probes,
                ticks,
            }),
        }
    }

    /// Adds an op to its container's monitor, starting the monitor if needed.
    pub fn watch(&self, container_id: &str, op_id: &str, watched: Watched) {
        let mut containers = self.shared.containers.lock();
        if let Some(ops) = containers.get(container_id) {
            ops.lock().insert(op_id.to_owned(), watched);
            return;
        }
        let ops = Arc::new(Lock::new(HashMap::from([(op_id.to_owned(), watched)])));
        containers.insert(container_id.to_owned(), ops.clone());
        tokio::spawn(monitor(self.shared.clone(), container_id.to_owned(), ops));
    }

    /// Removes an op from its container's monitor; a monitor left with no op
    /// ends at its next tick.
    pub fn unwatch(&self, container_id: &str, op_id: &str) {
        if let Some(ops) = self.shared.containers.lock().get(container_id) {
            ops.lock().remove(op_id);
        }
    }
}

async fn monitor(m: Arc<MonitorsShared>, container_id: String, ops: WatchedOps) {
    loop {
        tokio::time::sleep_until(m.ticks.next().into()).await;
        {
            // a monitor with nothing left to watch ends (under the map lock,
            // so a concurrent watch starts a fresh monitor)
            let mut containers = m.containers.lock();
            if ops.lock().is_empty() {
                containers.remove(&container_id);
                return;
            }
        }
        let probe = m
            .probes
            .probe(m.backend.as_ref(), &container_id, m.ticks.every())
            .await;
        for (op_id, w) in ops.lock().iter() {
            let healthy = matches!(&probe, Ok(snap) if snap.shim(op_id, &w.rec) == Some(true));
            if !healthy {
                w.inbox.post(Wake::Alarm);
            }
        }
    }
}
