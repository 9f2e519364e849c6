//! Every setting of the kernel, its CLI and its drills, declared once:
//! the variable, the `serve` flag where it has one, the kind, the default
//! and the doc line. `docs/settings.md` is rendered from this table (a
//! test fails when they differ), the loader reads nothing else, and
//! `opkernel settings` prints it.

use super::{Alias, Kind, OldUnit, Scope, Setting};

/// Declares each setting as a constant and lists them all in [`ALL`].
macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])+
        $id:ident = $env:literal, $kind:ident, $scope:ident, default $default:literal
        $(, flag $flag:literal)? $(, alias $alias:literal in $unit:ident)?;
    )+) => {
        $(
            $(#[doc = $doc])+
            pub const $id: Setting = Setting {
                env: $env,
                kind: Kind::$kind,
                scope: Scope::$scope,
                default: $default,
                doc: concat!($($doc),+),
                flag: settings!(@flag $($flag)?),
                alias: settings!(@alias $($alias $unit)?),
            };
        )+
        /// Every setting, in the order of the docs' table.
        pub const ALL: &[&Setting] = &[$(&$id),+];
    };
    (@flag) => { None };
    (@flag $flag:literal) => { Some($flag) };
    (@alias) => { None };
    (@alias $alias:literal $unit:ident) => { Some(Alias { env: $alias, unit: OldUnit::$unit }) };
}

settings! {
    /// The kernel's home: its control plane file, operator token and
    /// every run's scratch dir (`~` is `$HOME`).
    HOME = "OPKERNEL_HOME", Path, Both, default "~/.opkernel", flag "home";
    /// Where the HTTP API listens: an address, or a port on loopback.
    LISTEN = "OPKERNEL_LISTEN", Address, Serve, default "127.0.0.1:7878", flag "listen";
    /// Allow listening on a non-loopback address.
    ALLOW_REMOTE = "OPKERNEL_ALLOW_REMOTE", Switch, Serve, default "off", flag "allow-remote";
    /// The API's TLS certificate chain (PEM): set with the key, the API
    /// is served over `https://` only; both re-read on SIGHUP.
    TLS_CERT = "OPKERNEL_TLS_CERT", Path, Serve, default "";
    /// The private key (PEM) of `OPKERNEL_TLS_CERT`.
    TLS_KEY = "OPKERNEL_TLS_KEY", Path, Serve, default "";
    /// A CA (PEM) trusted beside the system's roots when the kernel, its
    /// CLI or `opkernel mcp` call an `https://` kernel (nodes, clients).
    CA = "OPKERNEL_CA", Path, Both, default "";
    /// The control plane: `sqlite` (the home's `kernel.db`) or a
    /// `postgres://` URL.
    STORE = "OPKERNEL_STORE", Text, Serve, default "sqlite", flag "store";
    /// This kernel's name as a cluster node (needs a PostgreSQL store and
    /// an advertised URL); none: a single kernel.
    NODE = "OPKERNEL_NODE", Text, Serve, default "", flag "node";
    /// The `http://` URL the other nodes reach this node's API at.
    ADVERTISE = "OPKERNEL_ADVERTISE", Url, Serve, default "", flag "advertise";
    /// A node's lease time to live (2s to 10m), renewed every fifth of it.
    NODE_TTL = "OPKERNEL_NODE_TTL", Duration, Serve, default "10s",
        alias "OPKERNEL_NODE_TTL_SEC" in Seconds;
    /// The Docker engine's Unix socket (none: `DOCKER_HOST`, else
    /// `/var/run/docker.sock`).
    DOCKER_SOCKET = "OPKERNEL_DOCKER_SOCKET", Path, Serve, default "";
    /// Bound of one Docker request; a start that runs past it is settled
    /// by evidence.
    DOCKER_TIMEOUT = "OPKERNEL_DOCKER_TIMEOUT", Duration, Serve, default "60s",
        alias "OPKERNEL_DOCKER_TIMEOUT_SECONDS" in Seconds;
    /// The image of runs without one of their own.
    IMAGE = "OPKERNEL_IMAGE", Text, Serve, default "opkernel-sandbox:latest";
    /// More images runs may name at creation, `;`-separated
    /// `NAME=REFERENCE` pairs (`OPKERNEL_IMAGE` is listed too, as
    /// `default` unless named here).
    IMAGES = "OPKERNEL_IMAGES", Text, Serve, default "";
    /// The largest file or archive the files API takes in one request.
    FILE_MAX_BYTES = "OPKERNEL_FILE_MAX_BYTES", Bytes, Serve, default "1GiB";
    /// The `uid:gid` or user commands run as; `root` only when spelled out.
    RUN_AS = "OPKERNEL_RUN_AS", Text, Serve, default "1000:1000";
    /// The Docker network of runs without an envelope of their own.
    NETWORK = "OPKERNEL_NETWORK", Text, Serve, default "none";
    /// The OCI runtime of runs without an envelope of their own: `runc`,
    /// or `runsc` (gVisor, registered with Docker; network `none` only).
    RUNTIME = "OPKERNEL_RUNTIME", Text, Serve, default "runc";
    /// Serve runs whose envelope has a network allow list through the
    /// kernel's egress proxy (off: such runs are refused).
    EGRESS = "OPKERNEL_EGRESS", Switch, Serve, default "on";
    /// The egress proxy's port, on the host's address on the kernel's
    /// internal egress network.
    EGRESS_PORT = "OPKERNEL_EGRESS_PORT", Count, Serve, default "3128";
    /// Let the egress proxy connect to names that resolve to loopback,
    /// private, link-local or other non-public addresses (off: refused,
    /// unless the allow list names the address itself).
    EGRESS_PRIVATE = "OPKERNEL_EGRESS_PRIVATE", Switch, Serve, default "off";
    /// A TOML file of declared schedules, reconciled at start (SPEC §28).
    SCHEDULES = "OPKERNEL_SCHEDULES", Text, Serve, default "";
    /// For tests only: `name=IPv4;…`, addresses the egress proxy uses for
    /// these names instead of DNS (the kernel warns when it is set).
    EGRESS_HOSTS = "OPKERNEL_EGRESS_HOSTS", Text, Serve, default "";
    /// A run container's memory limit.
    MEMORY = "OPKERNEL_MEMORY", Bytes, Serve, default "2GiB",
        alias "OPKERNEL_MEMORY_BYTES" in Bytes;
    /// A run container's process limit.
    PIDS_LIMIT = "OPKERNEL_PIDS_LIMIT", Count, Serve, default "1024";
    /// Ceiling of a foreground command's timeout.
    FG_MAX_TIMEOUT = "OPKERNEL_FG_MAX_TIMEOUT", Duration, Serve, default "15m",
        alias "OPKERNEL_FG_MAX_SECONDS" in Seconds;
    /// Ceiling of a background command's timeout.
    BG_MAX_TIMEOUT = "OPKERNEL_BG_MAX_TIMEOUT", Duration, Serve, default "1h",
        alias "OPKERNEL_BG_MAX_SECONDS" in Seconds;
    /// How long a container or the engine may stay unreachable before its
    /// ops are settled `lost`.
    GRACE = "OPKERNEL_GRACE", Duration, Serve, default "60s",
        alias "OPKERNEL_GRACE_MS" in Millis;
    /// Pause between a kill's SIGTERM and its SIGKILL.
    KILL_GRACE = "OPKERNEL_KILL_GRACE", Duration, Serve, default "5s",
        alias "OPKERNEL_KILL_GRACE_MS" in Millis;
    /// How long after its start claim an op without any trace is settled
    /// as failed.
    START_EVIDENCE = "OPKERNEL_START_EVIDENCE", Duration, Serve, default "10s",
        alias "OPKERNEL_START_EVIDENCE_MS" in Millis;
    /// Hand ops to each run container's resident launcher (off: every op
    /// and probe goes by `docker exec`).
    LAUNCHER = "OPKERNEL_LAUNCHER", Switch, Serve, default "on";
    /// How long the launcher has to claim a request before the kernel
    /// takes it back and starts the op by `docker exec`.
    LAUNCHER_CLAIM = "OPKERNEL_LAUNCHER_CLAIM", Duration, Serve, default "10s",
        alias "OPKERNEL_LAUNCHER_CLAIM_MS" in Millis;
    /// Output kept in an op's `.log`; the shim drops the rest.
    LOG_CAP = "OPKERNEL_LOG_CAP", Bytes, Serve, default "64MiB",
        alias "OPKERNEL_LOG_CAP_BYTES" in Bytes;
    /// Safety-net cadence of liveness probes and exit-code checks (at
    /// least 100ms).
    PROBE_INTERVAL = "OPKERNEL_PROBE_INTERVAL", Duration, Serve, default "5s",
        alias "OPKERNEL_PROBE_INTERVAL_MS" in Millis;
    /// How often observed ops' `heartbeat_at` is refreshed (at least 100ms).
    HEARTBEAT = "OPKERNEL_HEARTBEAT", Duration, Serve, default "10s",
        alias "OPKERNEL_HEARTBEAT_MS" in Millis;
    /// An observer attempt that ran this long before failing was healthy:
    /// its failure starts the count of failures in a row again.
    ATTEMPT_HEALTHY = "OPKERNEL_ATTEMPT_HEALTHY", Duration, Serve, default "60s",
        alias "OPKERNEL_ATTEMPT_HEALTHY_MS" in Millis;
    /// Live ops of one run and its descendants when its envelope sets none.
    MAX_OPS_PER_RUN = "OPKERNEL_MAX_OPS_PER_RUN", Count, Serve, default "512";
    /// Live ops across the kernel (per node in a cluster).
    MAX_OPS = "OPKERNEL_MAX_OPS", Count, Serve, default "16384";
    /// Default `max_children` of a top-level run's envelope.
    MAX_CHILDREN = "OPKERNEL_MAX_CHILDREN", Count, Serve, default "32";
    /// Deepest delegation: ancestors a run's chain may hold.
    MAX_DEPTH = "OPKERNEL_MAX_DEPTH", Count, Serve, default "4";
    /// Kernel-wide approval rules: one regex per line, matched against
    /// every command joined by spaces.
    APPROVAL_MATCH = "OPKERNEL_APPROVAL_MATCH", List, Serve, default "";
    /// Idle time after which a container without live ops may be reaped.
    REAP_TTL = "OPKERNEL_REAP_TTL", Duration, Serve, default "1h",
        alias "OPKERNEL_REAP_TTL_SECONDS" in Seconds;
    /// How often the reaper looks for abandoned containers (at least 1s).
    REAP_INTERVAL = "OPKERNEL_REAP_INTERVAL", Duration, Serve, default "5m",
        alias "OPKERNEL_REAP_INTERVAL_SECONDS" in Seconds;
    /// How long a delivered op's files (`.log`, `.pid`, `.code`) are kept.
    OP_FILES_RETENTION = "OPKERNEL_OP_FILES_RETENTION", Duration, Serve, default "7d";
    /// How long a finished top-level run tree stays in the control plane
    /// after it went quiet (at least the files' retention).
    RETENTION = "OPKERNEL_RETENTION", Duration, Serve, default "30d";
    /// Unbound warm containers kept per pooled profile (0: no pool).
    POOL = "OPKERNEL_POOL", Count, Serve, default "2";
    /// More pooled profiles, `;`-separated, each a `,`-separated list of
    /// `memory_bytes=N`, `cpus=F`, `pids_limit=N`, `network=NAME`,
    /// `image=NAME`, `runtime=runc|runsc`.
    POOL_PROFILES = "OPKERNEL_POOL_PROFILES", Text, Serve, default "";
    /// Where an unauthenticated `/metrics` listener binds: a port on
    /// loopback, or an address; none unless set.
    METRICS_LISTEN = "OPKERNEL_METRICS_LISTEN", Address, Serve, default "";
    /// Where notified events are posted, signed (`http://` or `https://`).
    WEBHOOK_URL = "OPKERNEL_WEBHOOK_URL", Url, Serve, default "";
    /// The webhook's signing secret (at least 16 characters; never shown).
    WEBHOOK_SECRET = "OPKERNEL_WEBHOOK_SECRET", Secret, Serve, default "";
    /// A CA (PEM) trusted beside the system's roots for the webhook's
    /// `https://` receiver.
    WEBHOOK_CA = "OPKERNEL_WEBHOOK_CA", Path, Serve, default "";
    /// glibc's malloc arenas of the process, set before any thread
    /// starts (over glibc's own `MALLOC_ARENA_MAX`); 0: one per core, two
    /// at least. glibc's default is eight per core, and memory freed into
    /// one arena is not reused by another.
    MALLOC_ARENAS = "OPKERNEL_MALLOC_ARENAS", Count, Both, default "0";
    /// Log filter, in `tracing`'s `EnvFilter` syntax.
    LOG = "OPKERNEL_LOG", Text, Both, default "opkernel=info,warn";
    /// The daemon a client verb or `opkernel mcp` talks to.
    URL = "OPKERNEL_URL", Url, Client, default "http://127.0.0.1:7878";
    /// A client's bearer token (none: the home's operator token).
    TOKEN = "OPKERNEL_TOKEN", Secret, Client, default "";
    /// Enable the fault hooks the recovery drills use.
    DRILLS = "OPKERNEL_DRILLS", Switch, Drills, default "off", flag "drills";
    /// A drill's crash point: the kernel exits there (with the hooks on).
    DRILL_CRASH_AT = "OPKERNEL_DRILL_CRASH_AT", Text, Drills, default "";
}
