//! The kernel's shared state: the control plane, the backend, the
//! run-container registry and the run gates, the compare-and-set settle
//! that wakes report waiters, and each live op's handle (its observer's
//! inbox). Observers themselves live in `observer/`, above this module.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::sync::Arc;

use sandbox::{ContainerInfo, OpBackend, RunIdentity};
use tokio::sync::watch;

use crate::config::Config;
use crate::inbox::{Inbox, Wake};
use crate::lifecycle::Outcome;
use crate::probes::{Monitors, ProbeCache, Ticks};
use crate::report::cut_tail;
use crate::store::{Op, Settlement, Store};
use crate::sync::Lock;
use crate::watcher::OpsWatcher;

pub use crate::home::StartError;
use crate::home::{check_run_user, kernel_identity, prepare_home};
use crate::runmeta::compile_patterns;
pub use crate::runmeta::RunMeta;

/// Per live op: its observer's inbox and a "done" signal.
pub struct OpHandle {
    pub inbox: Arc<Inbox>,
    done: watch::Sender<bool>,
}

pub struct Kernel {
    pub config: Config,
    pub store: Store,
    pub backend: Arc<dyn OpBackend>,
    /// boot id + pid + process start time of this kernel process.
    pub id: String,
    pub operator_token: String,
    pub watcher: OpsWatcher,
    pub probes: Arc<ProbeCache>,
    pub monitors: Monitors,
    pub ticks: Ticks,
    handles: Lock<HashMap<String, Arc<OpHandle>>>,
    run_events: Lock<HashMap<String, watch::Sender<u64>>>,
    containers: Lock<HashMap<String, ContainerInfo>>,
    run_locks: Lock<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per run: launches hold it shared from container to exec; the reaper
    /// holds it exclusively while it decides and removes.
    run_gates: Lock<HashMap<String, Arc<tokio::sync::RwLock<()>>>>,
    /// Runs' immutable facts, read once from the control plane.
    run_meta: Lock<HashMap<String, Arc<RunMeta>>>,
    /// `OPKERNEL_APPROVAL_MATCH`, compiled.
    approval_match: Vec<(String, regex::Regex)>,
    _lock: File,
}

impl Kernel {
    /// Takes ownership of the home, opens the control plane and connects to
    /// Docker. Serving starts after [`crate::observer::recover`].
    pub async fn open(config: Config) -> Result<Arc<Kernel>, StartError> {
        let home = prepare_home(&config)?;
        let sandbox = sandbox::Sandbox::connect_with_timeout(
            config.docker_socket.as_deref(),
            config.scratch_root(),
            config.docker_timeout_secs,
        )
        .await?;
        Kernel::assemble(config, home, Arc::new(sandbox)).await
    }

    /// [`Kernel::open`] on any backend (unit tests use a fake one).
    pub async fn open_with(
        config: Config,
        backend: Arc<dyn OpBackend>,
    ) -> Result<Arc<Kernel>, StartError> {
        let home = prepare_home(&config)?;
        Kernel::assemble(config, home, backend).await
    }

    async fn assemble(
        config: Config,
        (lock, operator_token, store): (File, String, Store),
        backend: Arc<dyn OpBackend>,
    ) -> Result<Arc<Kernel>, StartError> {
        check_run_user(backend.as_ref(), &config).await?;
        let approval_match = compile_patterns(&config.approval_match)
            .map_err(|e| StartError::Config(format!("OPKERNEL_APPROVAL_MATCH: {e}")))?;
        let id = kernel_identity();
        store.register_kernel(&id).await?;
        let probes = Arc::new(ProbeCache::default());
        let ticks = Ticks::new(config.probe_interval);
        Ok(Arc::new(Kernel {
            monitors: Monitors::new(backend.clone(), probes.clone(), ticks),
            config,
            store,
            backend,
            id,
            operator_token,
            watcher: OpsWatcher::new(),
            probes,
            ticks,
            handles: Lock::default(),
            run_events: Lock::default(),
            containers: Lock::default(),
            run_locks: Lock::default(),
            run_gates: Lock::default(),
            run_meta: Lock::default(),
            approval_match,
            _lock: lock,
        }))
    }

    /// Rebuilds the container registry from container labels (at start).
    pub async fn recover_registry(&self) {
        let list = match self.backend.list_managed().await {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(%e, "docker unreachable at start; observers will wait out the grace window");
                return;
            }
        };
        for info in list {
            let run_ok = info
                .labels
                .get(sandbox::profile::LABEL_RUN_ID)
                .is_some_and(|run| {
                    sandbox::profile::validate_run_id(run).is_ok()
                        && info.labels.get(sandbox::profile::LABEL_SCRATCH_KEY)
                            == Some(&sandbox::profile::scratch_key(run))
                });
            if run_ok && self.backend.owns(&info) {
                self.remember_container(&info);
            } else if run_ok {
                tracing::info!(container = %info.name, "managed container of another kernel home; left alone");
            } else {
                tracing::warn!(container = %info.name, "managed container with unconfirmed labels; never used");
            }
        }
    }

    /// Background duties: heartbeats of observed ops, and approval
    /// timeouts (checked each second; they are durable, so a restart only
    /// delays them).
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
        let k = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                tick.tick().await;
                match k.store.approval_timeouts().await {
                    Ok(done) => {
                        for action in done {
                            match action {
                                crate::store::TimeoutAction::Denied { op_id, run_id } => {
                                    tracing::info!(op = %op_id, "approval timed out: denied");
                                    k.bump_run(&run_id);
                                }
                                crate::store::TimeoutAction::Escalated { op_id, .. } => {
                                    tracing::warn!(op = %op_id, "approval timed out: escalated, still waiting");
                                }
                            }
                        }
                    }
                    Err(e) => tracing::warn!(%e, "approval timeouts not checked"),
                }
            }
        });
    }

    fn handle(&self, op_id: &str) -> Option<Arc<OpHandle>> {
        self.handles.lock().get(op_id).cloned()
    }

    /// A new handle for an op, or `None` when it already has an observer.
    /// File events for the op go to the handle's inbox from now on.
    pub fn claim_handle(&self, op_id: &str) -> Option<Arc<OpHandle>> {
        let handle = {
            let mut handles = self.handles.lock();
            if handles.contains_key(op_id) {
                return None;
            }
            let handle = Arc::new(OpHandle {
                inbox: Arc::new(Inbox::default()),
                done: watch::channel(false).0,
            });
            handles.insert(op_id.to_owned(), handle.clone());
            handle
        };
        self.watcher.register(op_id, handle.inbox.clone());
        Some(handle)
    }

    /// Ends an op's observation: its handle goes, waiters are told.
    pub fn release_handle(&self, op_id: &str) {
        self.watcher.unregister(op_id);
        if let Some(h) = self.handles.lock().remove(op_id) {
            let _ = h.done.send(true);
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

    /// The next safety-net tick (see [`Ticks`]).
    pub fn next_tick(&self) -> std::time::Instant {
        self.ticks.next()
    }

    /// Posts a wake to an op's observer; false when it has none here.
    pub fn post(&self, op_id: &str, wake: Wake) -> bool {
        self.handle(op_id).map(|h| h.inbox.post(wake)).is_some()
    }

    /// Wakes an op's observer to act on a recorded kill request at once.
    pub fn poke_kill(&self, op_id: &str) {
        self.post(op_id, Wake::Kill);
    }

    /// Drill fault hook: the op's observer fails its current attempt.
    /// False when drills are off or the op has no observer here.
    pub fn inject_observer_fault(&self, op_id: &str) -> bool {
        self.config.drills && self.post(op_id, Wake::Fault)
    }

    /// Drill fault hook: the op's supervisor gives up without settling it,
    /// leaving the op to the watchdog. False when drills are off or the op
    /// has no observer here.
    pub fn inject_supervisor_end(&self, op_id: &str) -> bool {
        self.config.drills && self.post(op_id, Wake::Abandon)
    }

    /// Whether this kernel observes the op now.
    pub fn observes(&self, op_id: &str) -> bool {
        self.handle(op_id).is_some()
    }

    /// Drill hook: a spurious wake-up of the op's observer (as any file
    /// event is); an observer must take it calmly.
    pub fn wake_observer(&self, op_id: &str) -> bool {
        self.config.drills && {
            self.post(op_id, Wake::File);
            true
        }
    }

    /// Subscribes to "something resolved or a note arrived" for a run.
    pub fn run_events(&self, run_id: &str) -> watch::Receiver<u64> {
        self.run_events
            .lock()
            .entry(run_id.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    pub fn bump_run(&self, run_id: &str) {
        self.run_events
            .lock()
            .entry(run_id.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .send_modify(|v| *v += 1);
    }

    /// The compare-and-set terminal write, with the final log's digest and
    /// tail. Wakes report waiters when it won.
    pub async fn settle(
        &self,
        op: &Op,
        outcome: Outcome,
    ) -> Result<bool, crate::store::StoreError> {
        let ops = self.backend.ops_dir(&op.scratch_key);
        let id = op.id.clone();
        // an op settled while its request may wait in a launcher's inbox
        // (lost by evidence, three failed attempts, a foreign container):
        // take the request back first, so nothing runs after the verdict
        if op.handed_over_at.is_some() && op.exec_id.is_none() && op.started_at.is_none() {
            if let Err(e) = ops.withdraw(&op.id) {
                tracing::warn!(op = %op.id, %e, "cannot take the request back before settling");
            }
        }
        let has_log = !matches!(outcome, Outcome::Failed { .. });
        // usage comes with a code from the code file, never without one
        let has_code = matches!(
            outcome,
            Outcome::Completed { .. }
                | Outcome::TimedOut {
                    exit_code: Some(_),
                    ..
                }
        );
        let (tail, digest, recorded) = tokio::task::spawn_blocking(move || {
            if !has_log {
                return (None, None, (None, 0, None));
            }
            let tail = ops
                .log_tail(&id, crate::report::TAIL_BYTES as u64 * 2)
                .ok()
                .map(|(bytes, _)| cut_tail(&bytes));
            let recorded = match has_code.then(|| ops.read_code_written(&id)) {
                Some(Ok((result, written))) => (result.usage(), result.leftovers(), written),
                _ => (None, 0, None),
            };
            (tail, ops.log_digest(&id).ok(), recorded)
        })
        .await
        .unwrap_or((None, None, (None, 0, None)));
        let (usage, leftovers, ended_at) = recorded;
        // an op without a recorded end ran at most until its deadline and
        // the kill sequence after it (a longer outage is not its use)
        let charge_cap_ms = (op.timeout_sec.saturating_mul(1000)
            + 2 * self.config.kill_grace.as_millis() as u64) as i64;
        let won = self
            .store
            .settle(
                &op.id,
                Settlement {
                    outcome: outcome.clone(),
                    output_tail: tail,
                    log: digest,
                    usage,
                    leftovers,
                    ended_at,
                    charge_cap_ms: Some(charge_cap_ms),
                },
            )
            .await?;
        // terminal now (by this write or an earlier one): the handover
        // files have done their job and leave the inbox (SPEC §21)
        if let Err(e) = self.backend.ops_dir(&op.scratch_key).clear_handover(&op.id) {
            tracing::warn!(op = %op.id, %e, "handover files not removed; the sweep retries");
        }
        if won {
            tracing::info!(op = %op.id, run = %op.run_id, ?outcome, "op settled");
            self.bump_run(&op.run_id);
        }
        Ok(won)
    }

    /// The run container for `identity`, created on first use. Calls for one
    /// run are serialized; a known container is reused without a round trip.
    pub async fn ensure_container(
        &self,
        identity: &RunIdentity,
        profile: &sandbox::Profile,
    ) -> sandbox::Result<ContainerInfo> {
        if let Some(info) = self.known_container(&identity.name) {
            return Ok(info);
        }
        let lock = self
            .run_locks
            .lock()
            .entry(identity.run_id.clone())
            .or_default()
            .clone();
        let _guard = lock.lock().await;
        if let Some(info) = self.known_container(&identity.name) {
            return Ok(info);
        }
        let info = self.backend.ensure_container(identity, profile).await?;
        self.remember_container(&info);
        Ok(info)
    }

    /// A run's immutable facts (cached), or `None` for an unknown run.
    pub async fn run_meta(
        &self,
        run_id: &str,
    ) -> Result<Option<Arc<RunMeta>>, crate::store::StoreError> {
        if let Some(meta) = self.run_meta.lock().get(run_id) {
            return Ok(Some(meta.clone()));
        }
        let Some(record) = self.store.get_run(run_id).await? else {
            return Ok(None);
        };
        Ok(Some(self.remember_run(&record)))
    }

    /// A run's immutable facts; a run not recorded yet (one the operator
    /// acts on before registering it) becomes a top-level run with the
    /// kernel's default envelope.
    pub async fn run_meta_or_create(
        &self,
        run_id: &str,
    ) -> Result<Arc<RunMeta>, crate::store::StoreError> {
        if let Some(meta) = self.run_meta(run_id).await? {
            return Ok(meta);
        }
        let record = self.store.ensure_run(run_id).await?;
        Ok(self.remember_run(&record))
    }

    /// Caches the immutable facts of a run record.
    pub fn remember_run(&self, record: &crate::store::RunRecord) -> Arc<RunMeta> {
        let meta = Arc::new(RunMeta::new(
            record,
            self.config.default_envelope(),
            &self.config.profile,
        ));
        self.run_meta
            .lock()
            .entry(record.run_id.clone())
            .or_insert(meta)
            .clone()
    }

    /// Whether a command of the run must wait for an operator's approval
    /// (see [`RunMeta::approval_hold`]; the kernel-wide patterns apply too).
    pub fn approval_hold(
        &self,
        meta: &RunMeta,
        command: &[String],
    ) -> Option<crate::store::ApprovalHold> {
        meta.approval_hold(&self.approval_match, command)
    }

    /// Drops a run's cached facts (a one-shot run, gone with its container).
    pub fn forget_run(&self, run_id: &str) {
        self.run_meta.lock().remove(run_id);
    }

    /// Keeps the per-run maps bounded by live work (SPEC §21): entries of
    /// runs without a live op leave once nothing holds them (a lock or gate
    /// nobody holds, a wake-up channel nobody listens to); cached facts
    /// are read again when needed. Probe state of unknown containers goes.
    /// Returns how many entries went.
    pub fn trim_idle(
        &self,
        live_runs: &HashSet<String>,
        live_containers: &HashSet<String>,
    ) -> usize {
        let idle = |run: &String| !live_runs.contains(run);
        let mut gone = 0;
        let mut count = |before: usize, after: usize| gone += before - after;
        let mut locks = self.run_locks.lock();
        let before = locks.len();
        locks.retain(|run, l| !idle(run) || Arc::strong_count(l) > 1);
        count(before, locks.len());
        drop(locks);
        let mut gates = self.run_gates.lock();
        let before = gates.len();
        gates.retain(|run, g| !idle(run) || Arc::strong_count(g) > 1);
        count(before, gates.len());
        drop(gates);
        let mut events = self.run_events.lock();
        let before = events.len();
        events.retain(|run, tx| !idle(run) || tx.receiver_count() > 0);
        count(before, events.len());
        drop(events);
        let mut meta = self.run_meta.lock();
        let before = meta.len();
        meta.retain(|run, _| !idle(run));
        count(before, meta.len());
        drop(meta);
        let mut known = self.registered_containers();
        known.extend(live_containers.iter().cloned());
        gone + self.probes.retain_containers(&known)
    }

    /// Entries of the per-run maps (locks, gates, wake-ups, cached facts).
    pub fn run_map_sizes(&self) -> [usize; 4] {
        [
            self.run_locks.lock().len(),
            self.run_gates.lock().len(),
            self.run_events.lock().len(),
            self.run_meta.lock().len(),
        ]
    }

    /// The container profile of a run: its envelope's limits over the
    /// kernel's profile (the kernel's profile for a run not recorded).
    pub async fn run_profile(
        &self,
        run_id: &str,
    ) -> Result<sandbox::Profile, crate::store::StoreError> {
        Ok(match self.run_meta(run_id).await? {
            Some(meta) => meta.profile.clone(),
            None => self.config.profile.clone(),
        })
    }

    fn run_gate(&self, run_id: &str) -> Arc<tokio::sync::RwLock<()>> {
        self.run_gates
            .lock()
            .entry(run_id.to_owned())
            .or_default()
            .clone()
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
        let map = self.containers.lock();
        map.values().find(|c| c.name == name && c.running).cloned()
    }

    /// Whether ops (and probes) of this container go through its resident
    /// launcher: it has one, the kernel uses launchers, commands do not run
    /// as root (a root command could write the inbox), and its hostname is
    /// known (requests are addressed by it).
    pub fn hands_over_to(&self, info: &ContainerInfo) -> bool {
        self.config.launcher
            && info.has_launcher
            && !self.config.profile.runs_as_root()
            && !info.hostname.is_empty()
    }

    pub fn remember_container(&self, info: &ContainerInfo) {
        // a root command could write the inbox: then probes go by exec only
        if self.hands_over_to(info) {
            if let Some(key) = info.labels.get(sandbox::profile::LABEL_SCRATCH_KEY) {
                self.probes.use_launcher(&info.id, key, &info.hostname);
            }
        }
        self.containers.lock().insert(info.id.clone(), info.clone());
    }

    pub fn forget_container(&self, name_or_id: &str) {
        self.containers
            .lock()
            .retain(|id, c| id != name_or_id && c.name != name_or_id);
    }

    /// Container ids in the in-memory registry.
    pub fn registered_containers(&self) -> HashSet<String> {
        self.containers.lock().keys().cloned().collect()
    }
}

impl Kernel {
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
