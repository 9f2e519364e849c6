//! The kernel's shared state and the op supervisor: one supervised observer
//! per live op, restarted as the next attempt when it fails (three failed
//! attempts in a row make the op lost), the compare-and-set settle that
//! wakes report waiters, the run-container registry, and recovery at start.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox::{ContainerInfo, RunIdentity, Sandbox};
use tokio::sync::{watch, Notify};

use crate::config::Config;
use crate::lifecycle::Outcome;
use crate::observer::ObserverAttempt;
use crate::probes::ProbeCache;
use crate::report::cut_tail;
use crate::store::{AttemptStart, Op, Settlement, Store};
use crate::watcher::OpsWatcher;

/// Failed observer attempts in a row after which an op is lost.
pub const MAX_FAILED_ATTEMPTS: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("another opkernel serve owns {0} (its lock is held); stop it first")]
    HomeLocked(String),
    #[error("cannot prepare home {path}: {source}")]
    Home {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Sandbox(#[from] sandbox::SandboxError),
}

/// Per live op: its observer's waker, a kill flag and a "done" signal.
struct OpHandle {
    wake: Arc<Notify>,
    kill: Arc<AtomicBool>,
    done: watch::Sender<bool>,
}

pub struct Kernel {
    pub config: Config,
    pub store: Store,
    pub sandbox: Sandbox,
    /// boot id + pid + process start time of this kernel process.
    pub id: String,
    pub operator_token: String,
    pub watcher: OpsWatcher,
    pub probes: ProbeCache,
    pub monitors: crate::probes::Monitors,
    handles: Mutex<HashMap<String, Arc<OpHandle>>>,
    run_events: Mutex<HashMap<String, watch::Sender<u64>>>,
    containers: Mutex<HashMap<String, ContainerInfo>>,
    run_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per run: launches hold it shared from container to exec; the reaper
    /// holds it exclusively while it decides and removes.
    run_gates: Mutex<HashMap<String, Arc<tokio::sync::RwLock<()>>>>,
    faults: Mutex<HashSet<String>>,
    started: std::time::Instant,
    _lock: File,
}

fn kernel_identity() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let start = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.split(' ').nth(19))
        .unwrap_or("0")
        .to_owned();
    format!("{}:{}:{}", boot.trim(), std::process::id(), start)
}

/// Creates `path` as an empty 0600 file unless it exists, and makes it 0600.
fn private_file(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    match File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        }
        Err(e) => Err(e),
    }
}

/// Refuses to start when the run image lacks the user commands are dropped
/// to (the drop is never turned off silently). An engine that cannot answer
/// now defers the check to the first container, which makes it again.
async fn check_run_user(sandbox: &Sandbox, config: &Config) -> Result<(), StartError> {
    match sandbox.check_run_user(&config.profile).await {
        Ok(user) => {
            tracing::info!(image = %config.profile.image, uid = user.uid, gid = user.gid, "run user checked");
            Ok(())
        }
        Err(e @ sandbox::SandboxError::Invalid(_)) => Err(StartError::Sandbox(e)),
        Err(e) => {
            tracing::warn!(%e, image = %config.profile.image, "cannot check the run user now; each run container checks it");
            Ok(())
        }
    }
}

fn home_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> StartError + '_ {
    move |source| StartError::Home {
        path: path.display().to_string(),
        source,
    }
}

impl Kernel {
    /// Takes ownership of the home, opens the control plane and connects to
    /// Docker. Serving starts after [`Kernel::recover`].
    pub async fn open(config: Config) -> Result<Arc<Kernel>, StartError> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let home = config.home.clone();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&home)
            .map_err(home_error(&home))?;
        // the home holds the control plane, tokens and every run's files
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700))
            .map_err(home_error(&home))?;
        let lock_path = home.join("kernel.lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(home_error(&lock_path))?;
        if lock.try_lock().is_err() {
            return Err(StartError::HomeLocked(home.display().to_string()));
        }
        let operator_token =
            crate::auth::load_or_create_operator_token(&home).map_err(home_error(&home))?;
        let db = home.join("kernel.db");
        // SQLite gives its -wal and -shm files the database file's mode
        private_file(&db).map_err(home_error(&db))?;
        for file in [home.join("kernel.db-wal"), home.join("kernel.db-shm")] {
            if file.exists() {
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                    .map_err(home_error(&file))?;
            }
        }
        let store = Store::open(&db)?;
        let scratch = config.scratch_root();
        std::fs::create_dir_all(&scratch).map_err(home_error(&scratch))?;
        std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o711))
            .map_err(home_error(&scratch))?;
        let sandbox = Sandbox::connect_with_timeout(
            config.docker_socket.as_deref(),
            scratch,
            config.docker_timeout_secs,
        )
        .await?;
        check_run_user(&sandbox, &config).await?;
        let id = kernel_identity();
        store.register_kernel(&id).await?;
        Ok(Arc::new(Kernel {
            config,
            store,
            sandbox,
            id,
            operator_token,
            watcher: OpsWatcher::new(),
            probes: ProbeCache::default(),
            monitors: crate::probes::Monitors::default(),
            handles: Mutex::default(),
            run_events: Mutex::default(),
            containers: Mutex::default(),
            run_locks: Mutex::default(),
            run_gates: Mutex::default(),
            faults: Mutex::default(),
            started: std::time::Instant::now(),
            _lock: lock,
        }))
    }

    /// Rebuilds the registry from container labels and starts an attach
    /// attempt for every non-terminal op. Returns how many were attached.
    pub async fn recover(self: &Arc<Self>) -> Result<usize, StartError> {
        match self.sandbox.list_managed().await {
            Ok(list) => {
                for info in list {
                    let run_ok =
                        info.labels
                            .get(sandbox::profile::LABEL_RUN_ID)
                            .is_some_and(|run| {
                                sandbox::profile::validate_run_id(run).is_ok()
                                    && info.labels.get(sandbox::profile::LABEL_SCRATCH_KEY)
                                        == Some(&sandbox::profile::scratch_key(run))
                            });
                    if run_ok && self.sandbox.owns(&info) {
                        self.remember_container(&info);
                    } else if run_ok {
                        tracing::info!(container = %info.name, "managed container of another kernel home; left alone");
                    } else {
                        tracing::warn!(container = %info.name, "managed container with unconfirmed labels; never used");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(%e, "docker unreachable at start; observers will wait out the grace window")
            }
        }
        let live = self.store.live_ops().await?;
        for op in &live {
            self.spawn_observer(op.id.clone());
        }
        Ok(live.len())
    }

    /// Background duties: heartbeats of observed ops.
    pub fn spawn_housekeeping(self: &Arc<Self>) {
        let k = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(k.config.heartbeat_interval);
            loop {
                tick.tick().await;
                if let Err(e) = k.store.heartbeat(&k.id).await {
                    tracing::warn!(%e, "heartbeat failed");
                }
            }
        });
    }

    fn handle(&self, op_id: &str) -> Option<Arc<OpHandle>> {
        self.handles.lock().ok()?.get(op_id).cloned()
    }

    /// Starts the supervised observer of an op unless one is running.
    pub fn spawn_observer(self: &Arc<Self>, op_id: String) {
        self.spawn_supervisor(op_id, None);
    }

    /// Starts the observer of an op just inserted by this kernel: its first
    /// attempt needs no separate attempt write (the exec claim records it).
    pub fn spawn_fresh_observer(self: &Arc<Self>, op: Op) {
        self.spawn_supervisor(op.id.clone(), Some(op));
    }

    fn spawn_supervisor(self: &Arc<Self>, op_id: String, fresh: Option<Op>) {
        let handle = {
            let Ok(mut handles) = self.handles.lock() else {
                return;
            };
            if handles.contains_key(&op_id) {
                return;
            }
            let (done, _) = watch::channel(false);
            let handle = Arc::new(OpHandle {
                wake: Arc::new(Notify::new()),
                kill: Arc::new(AtomicBool::new(false)),
                done,
            });
            handles.insert(op_id.clone(), handle.clone());
            handle
        };
        self.watcher.register(&op_id, handle.wake.clone());
        tokio::spawn(supervise(self.clone(), op_id, handle, fresh));
    }

    fn release(&self, op_id: &str) {
        self.watcher.unregister(op_id);
        if let Ok(mut handles) = self.handles.lock() {
            if let Some(h) = handles.remove(op_id) {
                let _ = h.done.send(true);
            }
        }
    }

    /// Resolves once the op has no live observer (it is terminal, or this
    /// kernel does not observe it).
    pub async fn wait_observer_done(&self, op_id: &str) {
        let Some(handle) = self.handle(op_id) else {
            return;
        };
        let mut rx = handle.done.subscribe();
        let _ = rx.wait_for(|done| *done).await;
    }

    /// The next safety-net tick. Ticks of all observers fall on one grid of
    /// `probe_interval`, so they wake in one burst (and share one probe per
    /// container) instead of spreading wake-ups over the interval.
    pub fn next_tick(&self) -> std::time::Instant {
        let every = self.config.probe_interval.as_nanos().max(1);
        let since = self.started.elapsed().as_nanos();
        let next = (since / every + 1) * every;
        self.started + Duration::from_nanos(next as u64)
    }

    /// Wakes an op's observer to act on a kill request at once.
    pub fn poke_kill(&self, op_id: &str) {
        if let Some(h) = self.handle(op_id) {
            h.kill.store(true, Ordering::SeqCst);
            h.wake.notify_one();
        }
    }

    /// Drill fault hook: the op's observer fails its current attempt.
    pub fn inject_observer_fault(&self, op_id: &str) -> bool {
        if !self.config.drills {
            return false;
        }
        if let Ok(mut f) = self.faults.lock() {
            f.insert(op_id.to_owned());
        }
        if let Some(h) = self.handle(op_id) {
            h.wake.notify_one();
        }
        true
    }

    /// Drill hook: a spurious wake-up of the op's observer (as any file
    /// event is); an observer must take it calmly.
    pub fn wake_observer(&self, op_id: &str) -> bool {
        if !self.config.drills {
            return false;
        }
        if let Some(h) = self.handle(op_id) {
            h.wake.notify_one();
        }
        true
    }

    pub fn take_fault(&self, op_id: &str) -> bool {
        self.config.drills && self.faults.lock().is_ok_and(|mut f| f.remove(op_id))
    }

    /// Subscribes to "something resolved or a note arrived" for a run.
    pub fn run_events(&self, run_id: &str) -> watch::Receiver<u64> {
        let Ok(mut map) = self.run_events.lock() else {
            return watch::channel(0).1;
        };
        map.entry(run_id.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    pub fn bump_run(&self, run_id: &str) {
        if let Ok(mut map) = self.run_events.lock() {
            map.entry(run_id.to_owned())
                .or_insert_with(|| watch::channel(0).0)
                .send_modify(|v| *v += 1);
        }
    }

    /// The compare-and-set terminal write, with the final log's digest and
    /// tail. Wakes report waiters when it won.
    pub async fn settle(
        &self,
        op: &Op,
        outcome: Outcome,
    ) -> Result<bool, crate::store::StoreError> {
        let ops = self.sandbox.ops_dir(&op.scratch_key);
        let id = op.id.clone();
        let has_log = !matches!(outcome, Outcome::Failed { .. });
        let (tail, digest) = tokio::task::spawn_blocking(move || {
            if !has_log {
                return (None, None);
            }
            let tail = ops
                .log_tail(&id, crate::report::TAIL_BYTES as u64 * 2)
                .ok()
                .map(|(bytes, _)| cut_tail(&bytes));
            (tail, ops.log_digest(&id).ok())
        })
        .await
        .unwrap_or((None, None));
        let won = self
            .store
            .settle(
                &op.id,
                Settlement {
                    outcome: outcome.clone(),
                    output_tail: tail,
                    log: digest,
                },
            )
            .await?;
        if won {
            tracing::info!(op = %op.id, run = %op.run_id, ?outcome, "op settled");
            self.bump_run(&op.run_id);
        }
        Ok(won)
    }

    /// The run container for `identity`, created on first use. Calls for one
    /// run are serialized; a known container is reused without a round trip.
    pub async fn ensure_container(&self, identity: &RunIdentity) -> sandbox::Result<ContainerInfo> {
        if let Some(info) = self.known_container(&identity.name) {
            return Ok(info);
        }
        let lock = {
            let mut locks = self
                .run_locks
                .lock()
                .map_err(|_| sandbox::SandboxError::Invalid("run lock poisoned".into()))?;
            locks.entry(identity.run_id.clone()).or_default().clone()
        };
        let _guard = lock.lock().await;
        if let Some(info) = self.known_container(&identity.name) {
            return Ok(info);
        }
        let info = self
            .sandbox
            .ensure_container(identity, &self.config.profile)
            .await?;
        self.remember_container(&info);
        Ok(info)
    }

    fn run_gate(&self, run_id: &str) -> Arc<tokio::sync::RwLock<()>> {
        let mut gates = self.run_gates.lock().unwrap_or_else(|e| e.into_inner());
        gates.entry(run_id.to_owned()).or_default().clone()
    }

    /// Held by a launch from ensuring the run container until its exec
    /// exists: the reaper cannot remove the container in between.
    pub async fn launch_gate(&self, run_id: &str) -> tokio::sync::OwnedRwLockReadGuard<()> {
        self.run_gate(run_id).read_owned().await
    }

    /// Held by the reaper while it re-checks a run and removes its
    /// container: no launch of the run is between container and exec.
    pub async fn reap_gate(&self, run_id: &str) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        self.run_gate(run_id).write_owned().await
    }

    fn known_container(&self, name: &str) -> Option<ContainerInfo> {
        let map = self.containers.lock().ok()?;
        map.values().find(|c| c.name == name && c.running).cloned()
    }

    pub fn remember_container(&self, info: &ContainerInfo) {
        if let Ok(mut map) = self.containers.lock() {
            map.insert(info.id.clone(), info.clone());
        }
    }

    pub fn forget_container(&self, name_or_id: &str) {
        if let Ok(mut map) = self.containers.lock() {
            map.retain(|id, c| id != name_or_id && c.name != name_or_id);
        }
    }

    /// Container ids in the in-memory registry.
    pub fn registered_containers(&self) -> HashSet<String> {
        self.containers
            .lock()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// How the attempt after a failed one begins: a failure after a healthy
/// stretch (at least `healthy`) is not "in a row" with earlier ones.
pub fn attempt_start_after_failure(ran_for: Duration, healthy: Duration) -> AttemptStart {
    if ran_for >= healthy {
        AttemptStart::AfterIsolatedFailure
    } else {
        AttemptStart::AfterFailureInARow
    }
}

async fn supervise(k: Arc<Kernel>, op_id: String, handle: Arc<OpHandle>, mut fresh: Option<Op>) {
    let mut start = AttemptStart::Clean;
    let mut last_error = String::new();
    loop {
        let begun = match fresh.take() {
            Some(op)
                if op.status == crate::lifecycle::Status::Starting
                    && op.exec_claimed_at.is_none() =>
            {
                Ok(Some(op))
            }
            _ => k.store.begin_attempt(&op_id, &k.id, start).await,
        };
        let op = match begun {
            Ok(Some(op)) => op,
            Ok(None) => break,
            Err(e) => {
                tracing::error!(op = %op_id, %e, "cannot begin observer attempt");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if op.failed_attempts >= MAX_FAILED_ATTEMPTS {
            let reason = format!(
                "observer failed {} attempts in a row; last error: {last_error}",
                op.failed_attempts
            );
            if let Err(e) = k.settle(&op, Outcome::Lost { reason }).await {
                tracing::error!(op = %op_id, %e, "cannot settle op after failed attempts");
            }
            break;
        }
        let attempt = op.attempt;
        let began = std::time::Instant::now();
        let run = tokio::spawn(
            ObserverAttempt::new(k.clone(), op, handle.wake.clone(), handle.kill.clone()).run(),
        );
        // an attempt that stays healthy ends any run of failures, also across restarts
        let healthy = {
            let (k, id) = (k.clone(), op_id.clone());
            tokio::spawn(async move {
                tokio::time::sleep(k.config.attempt_healthy).await;
                if let Err(e) = k.store.reset_failed_attempts(&id).await {
                    tracing::warn!(op = %id, %e, "cannot reset the failed-attempt count");
                }
            })
        };
        let ended = run.await;
        healthy.abort();
        last_error = match ended {
            Ok(Ok(())) => match k.store.get_op(&op_id).await {
                Ok(Some(op)) if !op.status.is_terminal() => "attempt ended without settling".into(),
                _ => break,
            },
            Ok(Err(e)) => e.to_string(),
            Err(join) if join.is_panic() => "observer panicked".into(),
            Err(join) => join.to_string(),
        };
        tracing::warn!(op = %op_id, attempt, error = %last_error, "observer attempt failed; restarting");
        start = attempt_start_after_failure(began.elapsed(), k.config.attempt_healthy);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    k.release(&op_id);
}

impl Kernel {
    /// Removes every container of a run and its scratch dir (one-shot runs).
    pub async fn remove_run_container(&self, run_id: &str) {
        if let Ok(list) = self.sandbox.list_managed().await {
            for c in list.iter().filter(|c| {
                c.labels
                    .get(sandbox::profile::LABEL_RUN_ID)
                    .map(String::as_str)
                    == Some(run_id)
            }) {
                if let Err(e) = self.sandbox.remove(&c.id).await {
                    tracing::warn!(container = %c.name, %e, "cannot remove one-shot container");
                }
                self.forget_container(&c.id);
                self.probes.forget(&c.id);
            }
        }
        let key = sandbox::profile::scratch_key(run_id);
        self.watcher.unwatch(self.sandbox.ops_dir(&key).path());
        if let Err(e) = self.sandbox.remove_scratch(&key) {
            tracing::warn!(%e, "cannot remove one-shot scratch dir");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_close_together_count_in_a_row() {
        let healthy = Duration::from_secs(60);
        assert_eq!(
            attempt_start_after_failure(Duration::from_millis(200), healthy),
            AttemptStart::AfterFailureInARow
        );
        assert_eq!(
            attempt_start_after_failure(Duration::from_secs(3600), healthy),
            AttemptStart::AfterIsolatedFailure
        );
    }
}
