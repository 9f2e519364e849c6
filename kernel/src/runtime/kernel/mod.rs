//! The kernel's shared state, by job: the control plane and the backend,
//! the run-container registry with its per-run create locks
//! ([`registry`]), the run gates between launches and the reaper
//! ([`gates`]), each live op's handle ([`handles`]) and the per-run cache
//! of facts and wake-ups ([`runcache`]); the compare-and-set settle that
//! wakes report waiters (`settle`). Observers live in `observer/`, above
//! this module; the background loops in `housekeeping.rs`.

mod containers;
pub mod gates;
pub mod handles;
pub mod inputs;
pub mod node;
pub mod registry;
pub mod runcache;
mod settle;

use std::collections::HashSet;
use std::sync::Arc;

use sandbox::{ContainerInfo, OpBackend};
use tokio::sync::watch;

use crate::runtime::config::Config;
use crate::runtime::inbox::Wake;
use crate::runtime::probes::{Monitors, ProbeCache, Ticks};
use crate::runtime::watcher::OpsWatcher;
use crate::store::Store;

use crate::approval::{compile_patterns, Pattern};
pub use crate::runtime::home::StartError;
use crate::runtime::home::{
    check_images, check_run_user, check_runtimes, kernel_identity, open_store, prepare_home,
    Ownership,
};
pub use crate::runtime::runmeta::RunMeta;

pub use handles::OpHandle;

/// One kernel process: its settings, control plane, backend and state.
pub struct Kernel {
    /// The settings it was started with.
    pub config: Config,
    /// The control plane: the single authority on every op's lifecycle.
    pub store: Store,
    /// Docker, through the sandbox's backend trait (a fake in unit tests).
    pub backend: Arc<dyn OpBackend>,
    /// boot id + pid + process start time of this kernel process.
    pub id: String,
    /// The operator token, as read from (or created in)
    /// `<home>/operator.token`.
    pub operator_token: String,
    /// File events on runs' `.ops` dirs, routed to the ops' observers.
    pub watcher: OpsWatcher,
    /// Coalesced liveness probes, one per container per `max_age`.
    pub probes: Arc<ProbeCache>,
    /// One monitor task per container with watched ops, alarming observers.
    pub monitors: Monitors,
    /// The safety-net grid every observer's and monitor's tick falls on.
    pub ticks: Ticks,
    /// The live ops this kernel observes, by id.
    pub handles: handles::OpHandles,
    /// The run containers this kernel knows, and their create locks.
    pub registry: registry::ContainerRegistry,
    /// Per run: launches hold it shared from container to exec; the reaper
    /// holds it exclusively while it decides and removes.
    pub gates: gates::RunGates,
    /// Runs' immutable facts and wake-up channels.
    pub runs: runcache::RunCache,
    /// Per op: one write to its stdin at a time.
    pub inputs: inputs::OpInputs,
    /// The warm pool: free containers and every run's binding (SPEC §22).
    pub pool: crate::runtime::pool::Pool,
    /// This kernel as a cluster node (`None`: a single kernel).
    pub node: Option<node::NodeState>,
    /// The egress proxy of allow-list runs (SPEC §27).
    pub egress: crate::runtime::egress::Egress,
    /// This kernel itself, for the tasks it starts from `&self`.
    me: std::sync::Weak<Kernel>,
    /// `OPKERNEL_APPROVAL_MATCH`, compiled.
    approval_match: Vec<Pattern>,
    /// The home's lock, and the control plane's on PostgreSQL.
    ownership: Ownership,
}

impl Kernel {
    /// Takes ownership of the home, opens the control plane and connects to
    /// Docker. Serving starts after [`crate::runtime::observer::recover`].
    pub async fn open(config: Config) -> Result<Arc<Kernel>, StartError> {
        let (lock, token) = prepare_home(&config)?;
        let (ownership, store) = open_store(&config, lock).await?;
        let home = (ownership, token, store);
        let sandbox = sandbox::Sandbox::connect_with_timeout(
            config.docker.socket.as_deref(),
            config.scratch_root(),
            config.docker.timeout.as_secs(),
        )
        .await?;
        Kernel::assemble(config, home, Arc::new(sandbox)).await
    }

    /// [`Kernel::open`] on any backend (unit tests use a fake one).
    pub async fn open_with(
        config: Config,
        backend: Arc<dyn OpBackend>,
    ) -> Result<Arc<Kernel>, StartError> {
        let (lock, token) = prepare_home(&config)?;
        let (ownership, store) = open_store(&config, lock).await?;
        let home = (ownership, token, store);
        Kernel::assemble(config, home, backend).await
    }

    async fn assemble(
        config: Config,
        (ownership, operator_token, store): (Ownership, String, Store),
        backend: Arc<dyn OpBackend>,
    ) -> Result<Arc<Kernel>, StartError> {
        check_run_user(backend.as_ref(), &config).await?;
        check_images(backend.as_ref(), &config).await?;
        check_runtimes(backend.as_ref(), &config).await?;
        let approval_match = compile_patterns(&config.runs.approval_match)
            .map_err(|e| StartError::Config(format!("OPKERNEL_APPROVAL_MATCH: {e}")))?;
        let id = kernel_identity();
        store.register_kernel(&id).await?;
        let probes = Arc::new(ProbeCache::default());
        let ticks = Ticks::new(config.ops.probe_interval);
        Ok(Arc::new_cyclic(|me| Kernel {
            me: me.clone(),
            egress: Default::default(),
            monitors: Monitors::new(backend.clone(), probes.clone(), ticks),
            pool: crate::runtime::pool::Pool::new(
                config.pool.clone(),
                config.node.as_ref().map(|n| n.name.clone()),
            ),
            node: config.node.clone().map(|mut c| {
                c.store_open = store.open_bound();
                node::NodeState::new(c)
            }),
            config,
            store,
            backend,
            id,
            operator_token,
            watcher: OpsWatcher::new(),
            probes,
            ticks,
            handles: Default::default(),
            registry: Default::default(),
            gates: Default::default(),
            runs: Default::default(),
            inputs: Default::default(),
            approval_match,
            ownership,
        }))
    }

    /// This kernel as its callers share it (`None` only while it is being
    /// dropped).
    pub fn arc(&self) -> Option<Arc<Kernel>> {
        self.me.upgrade()
    }

    /// Resolves, with the reason, once another kernel took this kernel's
    /// PostgreSQL control plane (after a lost connection): serving stops.
    pub async fn store_taken(&self) -> String {
        self.ownership.lost().await
    }

    /// Rebuilds the container registry from container labels and the
    /// pool's bindings (at start, after the pool's recovery).
    pub async fn recover_registry(&self) {
        let list = match self.backend.list_managed().await {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(%e, "docker unreachable at start; observers will wait out the grace window");
                return;
            }
        };
        for info in list {
            // pool containers: the bound ones serve their runs; the
            // others are the pool upkeep's
            if let Some(role) = self.pool.role(&info) {
                if matches!(role, crate::runtime::pool::PoolRole::Bound(_))
                    && self.backend.owns(&info)
                {
                    self.remember_container(&info);
                }
                continue;
            }
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

    /// A new handle for an op, or `None` when it already has an observer.
    /// File events for the op go to the handle's inbox from now on.
    pub fn claim_handle(&self, op_id: &str) -> Option<Arc<OpHandle>> {
        let handle = self.handles.claim(op_id)?;
        self.watcher.register(op_id, handle.inbox.clone());
        Some(handle)
    }

    /// Ends an op's observation: its handle goes, waiters are told.
    pub fn release_handle(&self, op_id: &str) {
        self.watcher.unregister(op_id);
        self.handles.release(op_id);
    }

    /// Resolves once the op has no live observer (it is terminal, or this
    /// kernel does not observe it).
    pub async fn wait_observer_done(&self, op_id: &str) {
        self.handles.wait_released(op_id).await
    }

    /// The next safety-net tick (see [`Ticks`]).
    pub fn next_tick(&self) -> std::time::Instant {
        self.ticks.next()
    }

    /// Posts a wake to an op's observer; false when it has none here.
    pub fn post(&self, op_id: &str, wake: Wake) -> bool {
        self.handles.post(op_id, wake)
    }

    /// Wakes an op's observer to act on a recorded kill request at once.
    pub fn poke_kill(&self, op_id: &str) {
        self.post(op_id, Wake::Kill);
    }

    /// Drill fault hook: the op's observer fails its current attempt.
    /// False when drills are off or the op has no observer here.
    pub fn inject_observer_fault(&self, op_id: &str) -> bool {
        self.config.drills.on && self.post(op_id, Wake::Fault)
    }

    /// Drill fault hook: the op's observer attempt panics for real (its
    /// task unwinds). False when drills are off or the op has no observer
    /// here.
    pub fn inject_observer_panic(&self, op_id: &str) -> bool {
        self.config.drills.on && self.post(op_id, Wake::Panic)
    }

    /// Drill fault hook: the op's supervisor gives up without settling it,
    /// leaving the op to the watchdog. False when drills are off or the op
    /// has no observer here.
    pub fn inject_supervisor_end(&self, op_id: &str) -> bool {
        self.config.drills.on && self.post(op_id, Wake::Abandon)
    }

    /// Drill hook: with drills on and `OPKERNEL_DRILL_CRASH_AT` naming this
    /// point, the kernel SIGKILLs itself here (the `pool-adopt-crash` drill
    /// kills it at each step of an adoption).
    pub fn crash_point(&self, point: &str) {
        if self.config.drills.on && self.config.drills.crash_at.as_deref() == Some(point) {
            tracing::warn!(point, "drill: the kernel kills itself here");
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid])
                .status();
            std::process::abort();
        }
    }

    /// Whether this kernel observes the op now.
    pub fn observes(&self, op_id: &str) -> bool {
        self.handles.get(op_id).is_some()
    }

    /// Drill hook: a spurious wake-up of the op's observer (as any file
    /// event is); an observer must take it calmly.
    pub fn wake_observer(&self, op_id: &str) -> bool {
        self.config.drills.on && {
            self.post(op_id, Wake::File);
            true
        }
    }

    /// Subscribes to "something resolved or a note arrived" for a run.
    pub fn run_events(&self, run_id: &str) -> watch::Receiver<u64> {
        self.runs.subscribe(run_id)
    }

    /// Wakes the run's report waiters and event streams.
    pub fn bump_run(&self, run_id: &str) {
        self.runs.bump(run_id)
    }

    /// A run's immutable facts (cached), or `None` for an unknown run.
    pub async fn run_meta(
        &self,
        run_id: &str,
    ) -> Result<Option<Arc<RunMeta>>, crate::store::StoreError> {
        if let Some(meta) = self.runs.meta(run_id) {
            return Ok(Some(meta));
        }
        let Some(record) = self.store.get_run(run_id).await? else {
            return Ok(None);
        };
        Ok(Some(self.remember_run(&record)))
    }

    /// A run's immutable facts; a run not recorded yet (one the operator
    /// acts on before registering it) becomes a top-level run with the
    /// kernel's default envelope, made from `origin`.
    pub async fn run_meta_or_create(
        &self,
        run_id: &str,
        origin: Option<&crate::origin::Origin>,
    ) -> Result<Arc<RunMeta>, crate::store::StoreError> {
        if let Some(meta) = self.run_meta(run_id).await? {
            return Ok(meta);
        }
        let record = self.store.ensure_run(run_id, origin).await?;
        Ok(self.remember_run(&record))
    }

    /// Caches the immutable facts of a run record.
    pub fn remember_run(&self, record: &crate::store::RunRecord) -> Arc<RunMeta> {
        let meta = RunMeta::new(
            record,
            self.config.default_envelope(),
            &self.config.profile,
            &self.config.images,
        );
        self.runs.insert(&record.run_id, meta)
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
        self.runs.forget(run_id);
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
        let gone =
            self.registry.trim(live_runs) + self.gates.trim(live_runs) + self.runs.trim(live_runs);
        let mut known = self.registered_containers();
        known.extend(live_containers.iter().cloned());
        gone + self.probes.retain_containers(&known)
    }

    /// Entries of the per-run maps (locks, gates, wake-ups, cached facts).
    pub fn run_map_sizes(&self) -> [usize; 4] {
        let (events, meta) = self.runs.sizes();
        [self.registry.create_locks(), self.gates.len(), events, meta]
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

    /// Held by a launch from ensuring the run container until its exec
    /// exists: the reaper cannot remove the container in between.
    pub async fn launch_gate(&self, run_id: &str) -> tokio::sync::OwnedRwLockReadGuard<()> {
        self.gates.launch(run_id).await
    }

    /// Held by the reaper while it re-checks a run and removes its
    /// container: no launch of the run is between container and exec.
    pub async fn reap_gate(&self, run_id: &str) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        self.gates.reap(run_id).await
    }

    /// Whether ops (and probes) of this container go through its resident
    /// launcher: it has one, the kernel uses launchers, commands do not run
    /// as root (a root command could write the inbox), and its hostname is
    /// known (requests are addressed by it).
    pub fn hands_over_to(&self, info: &ContainerInfo) -> bool {
        self.config.ops.launcher
            && info.has_launcher
            && !self.config.profile.runs_as_root()
            && !info.hostname.is_empty()
    }

    /// Records a run container (its probes go by its launcher when ops do).
    ///
    /// An adopted pool container is recorded only while its run's binding
    /// file leads to it (every path to it goes through that file; a missing
    /// one is written again by the run's next op): a registered container
    /// is used without a second look.
    pub fn remember_container(&self, info: &ContainerInfo) {
        if let Some(crate::runtime::pool::PoolRole::Bound(run)) = self.pool.role(info) {
            let run_key = sandbox::profile::scratch_key(&run);
            let linked = self.backend.scratch_binding(&run_key).ok().flatten();
            if linked.as_ref() != info.labels.get(sandbox::profile::LABEL_SCRATCH_KEY) {
                return;
            }
        }
        // a root command could write the inbox: then probes go by exec only
        if self.hands_over_to(info) {
            if let Some(key) = info.labels.get(sandbox::profile::LABEL_SCRATCH_KEY) {
                self.probes.use_launcher(&info.id, key, &info.hostname);
            }
        }
        self.registry.insert(info);
    }

    /// Forgets a container of the registry, by id or name.
    pub fn forget_container(&self, name_or_id: &str) {
        self.registry.remove(name_or_id)
    }

    /// Container ids in the in-memory registry.
    pub fn registered_containers(&self) -> HashSet<String> {
        self.registry.ids()
    }
}
