//! The kernel's settings as its layers take them: one options struct per
//! concern, filled once at start by `app::settings::load` from the one
//! settings table and fixed for the process's life.

mod images;
mod node;
mod pool;
mod webhook;

pub use images::{check_name as check_image_name, Images, NamedImage};
pub use node::NodeConfig;
pub use pool::PoolConfig;
pub use webhook::Webhook;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sandbox::Profile;

use crate::store::StoreLocation;

/// Everything a kernel runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// The kernel's home: `kernel.db`, the operator token, `scratch/`.
    pub home: PathBuf,
    /// Where the HTTP API listens.
    pub listen: SocketAddr,
    /// Where the control plane lives (SPEC §19).
    pub store: StoreLocation,
    /// How the Docker engine is reached.
    pub docker: DockerOptions,
    /// Container settings of every run without an envelope of its own.
    pub profile: Profile,
    /// The images runs may be created with (SPEC §26).
    pub images: Images,
    /// The largest file or archive the files API takes (SPEC §26).
    pub file_max_bytes: u64,
    /// The egress proxy's settings (SPEC §27).
    pub egress: EgressConfig,
    /// The declared schedules file, read and checked (SPEC §28).
    pub declared: Option<crate::store::DeclaredFile>,
    /// How ops are started, watched, killed and bounded.
    pub ops: OpOptions,
    /// The control plane's limits on runs.
    pub runs: RunOptions,
    /// The reaper's and retention's clocks.
    pub upkeep: UpkeepOptions,
    /// The warm pool (SPEC §22).
    pub pool: PoolConfig,
    /// This kernel as a cluster node (SPEC §20); `None`: a single kernel.
    pub node: Option<NodeConfig>,
    /// Where an unauthenticated `/metrics` listener binds; none unless set.
    pub metrics_listen: Option<SocketAddr>,
    /// Where notified events are posted, signed; none unless set.
    pub webhook: Option<Webhook>,
    /// The API's certificate and the CA trusted for peers (SPEC §29).
    pub tls: TlsOptions,
    /// The recovery drills' fault hooks.
    pub drills: DrillOptions,
    /// Settings that could not be read, each with its reason: the kernel
    /// refuses to start with any (a typo never silently means a default).
    pub invalid: Vec<String>,
}

/// TLS of the API and of the kernel's calls to its peers (SPEC §29).
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// The API's certificate chain and key: `https://` when set.
    pub server: Option<(PathBuf, PathBuf)>,
    /// A CA trusted beside the system's roots for calls to other nodes.
    pub ca: Option<PathBuf>,
}

/// How the Docker engine is reached.
#[derive(Debug, Clone, Default)]
pub struct DockerOptions {
    /// Its Unix socket (none: `DOCKER_HOST` or /var/run/docker.sock).
    pub socket: Option<String>,
    /// Bound of one request: a start that runs past it has an unknown
    /// outcome, settled by evidence.
    pub timeout: Duration,
}

/// How ops are started, watched, killed and bounded.
#[derive(Debug, Clone)]
pub struct OpOptions {
    /// Foreground timeout when a start gives none, seconds.
    pub fg_default_sec: u64,
    /// Foreground timeout ceiling, seconds.
    pub fg_max_sec: u64,
    /// Background timeout when a start gives none, seconds.
    pub bg_default_sec: u64,
    /// Background timeout ceiling, seconds.
    pub bg_max_sec: u64,
    /// How long a container or the engine may stay unreachable before its
    /// ops are lost.
    pub grace: Duration,
    /// Pause between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// How long after its exec claim an op without any trace is settled
    /// as failed.
    pub start_evidence_window: Duration,
    /// Hand ops to run containers' resident launchers (and ask them for
    /// probes); off: every op and probe goes by `docker exec`.
    pub launcher: bool,
    /// How long the launcher has to claim a request before the kernel
    /// takes it back and starts the op by `docker exec`.
    pub launcher_claim: Duration,
    /// Bytes of output kept in an op's `.log`; the shim drops the rest.
    pub log_cap_bytes: u64,
    /// Safety-net cadence of liveness probes and exit-code checks.
    pub probe_interval: Duration,
    /// How often observed ops' `heartbeat_at` is refreshed.
    pub heartbeat_interval: Duration,
    /// An observer attempt that ran this long before failing was healthy:
    /// its failure starts the "failed attempts in a row" count again.
    pub attempt_healthy: Duration,
}

/// The control plane's limits on runs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Live ops of one run (and its descendants) when its envelope sets
    /// none.
    pub max_live_ops_per_run: u64,
    /// Live ops across the kernel (per node in a cluster).
    pub max_live_ops: u64,
    /// Default `max_children` of a top-level run's envelope.
    pub max_children: u64,
    /// Deepest delegation: a run's chain holds at most this many ancestors.
    pub max_depth: usize,
    /// Kernel-wide approval rules, one regex each, matched against every
    /// command joined by spaces.
    pub approval_match: Vec<String>,
}

/// The reaper's and retention's clocks.
#[derive(Debug, Clone)]
pub struct UpkeepOptions {
    /// Idle time after which a container without live ops may be reaped.
    pub reap_ttl: Duration,
    /// How often the reaper looks for abandoned containers.
    pub reap_interval: Duration,
    /// How long a delivered op's files (`.log`, `.pid`, `.code`) are kept.
    pub op_files_retention: Duration,
    /// How long a finished top-level run tree stays after it went quiet.
    pub retention: Duration,
}

/// The recovery drills' fault hooks.
#[derive(Debug, Clone, Default)]
pub struct DrillOptions {
    /// Whether the hooks are on.
    pub on: bool,
    /// The point the kernel exits at, when the hooks are on.
    pub crash_at: Option<String>,
}

impl Config {
    /// What the control plane is opened for: the webhook outbox when a
    /// webhook URL is set, the node's placement when it runs as one.
    pub fn store_options(&self) -> crate::store::StoreOptions {
        crate::store::StoreOptions {
            outbox: self.webhook.is_some(),
            node: self.node.as_ref().map(|n| n.name.clone()),
        }
    }

    /// The envelope of a top-level run the operator gave none: the
    /// kernel's profile limits, no timeout ceiling beyond the kernel's own,
    /// the per-run live-op limit and no approval rules of its own.
    pub fn default_envelope(&self) -> crate::runs::Envelope {
        crate::runs::Envelope {
            max_timeout_sec: None,
            memory_bytes: self.profile.memory_bytes,
            cpus: self.profile.nano_cpus as f64 / 1e9,
            pids_limit: self.profile.pids_limit,
            network: crate::egress::Network::Named(self.profile.network.clone()),
            max_live_ops: self.runs.max_live_ops_per_run,
            max_children: self.runs.max_children,
            approval: crate::runs::ApprovalRules::default(),
            images: None,
            disk_bytes: None,
            runtime: self.profile.runtime,
        }
    }

    /// The admission limits: the kernel-wide one and the defaults for
    /// runs without an envelope of their own.
    pub fn admission(&self) -> crate::store::Admission {
        crate::store::Admission {
            max_live_per_run: self.runs.max_live_ops_per_run,
            max_live: self.runs.max_live_ops,
            max_children: self.runs.max_children,
            implicit_run: true,
        }
    }

    /// `<home>/scratch`: where every run's scratch dir lives.
    pub fn scratch_root(&self) -> PathBuf {
        self.home.join("scratch")
    }
}

/// The egress proxy's settings (SPEC §27).
#[derive(Debug, Clone, Default)]
pub struct EgressConfig {
    /// Serve allow-list runs (`OPKERNEL_EGRESS`).
    pub on: bool,
    /// Connect to names resolving to non-public addresses
    /// (`OPKERNEL_EGRESS_PRIVATE`).
    pub private: bool,
    /// The proxy's port (`OPKERNEL_EGRESS_PORT`).
    pub port: u16,
    /// Names resolved without DNS (`OPKERNEL_EGRESS_HOSTS`, for tests).
    pub hosts: std::collections::HashMap<String, std::net::Ipv4Addr>,
}

impl EgressConfig {
    /// Parses `name=IPv4;…` (names normalized as allow entries are).
    pub fn parse_hosts(
        text: &str,
    ) -> Result<std::collections::HashMap<String, std::net::Ipv4Addr>, String> {
        let mut hosts = std::collections::HashMap::new();
        for pair in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, addr) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not name=IPv4"))?;
            let name = crate::egress::normalize_host(name.trim())
                .ok_or_else(|| format!("{name:?} is not a host name"))?;
            let addr = addr
                .trim()
                .parse()
                .map_err(|_| format!("{addr:?} is not an IPv4 address"))?;
            hosts.insert(name, addr);
        }
        Ok(hosts)
    }
}
