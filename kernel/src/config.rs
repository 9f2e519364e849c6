//! Kernel settings: defaults, environment overrides and limits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sandbox::Profile;

#[path = "config_node.rs"]
mod node;
#[path = "config_pool.rs"]
mod pool;
pub use node::NodeConfig;
pub use pool::PoolConfig;

/// The kernel's settings, read once at start ([`Config::from_env`]) and fixed
/// for the process's life.
#[derive(Debug, Clone)]
pub struct Config {
    /// The kernel's home: `kernel.db`, the operator token, `scratch/` and
    /// `bin/`.
    pub home: PathBuf,
    /// Address the HTTP API listens on (default `127.0.0.1:7878`).
    pub listen: SocketAddr,
    /// Where the control plane lives (`OPKERNEL_STORE`, `serve --store`):
    /// the home's SQLite file, or a PostgreSQL server (SPEC §19).
    pub store: StoreLocation,
    /// Unix socket of the Docker engine (default: `DOCKER_HOST` or /var/run/docker.sock).
    pub docker_socket: Option<String>,
    /// Container settings of every run without an envelope of its own
    /// (`OPKERNEL_IMAGE`, `OPKERNEL_RUN_AS`, …).
    pub profile: Profile,
    /// Foreground timeout when a start gives none, seconds (300).
    pub fg_default_sec: u64,
    /// Foreground timeout ceiling, seconds (`OPKERNEL_FG_MAX_SECONDS`, 900).
    pub fg_max_sec: u64,
    /// Background timeout when a start gives none, seconds (900).
    pub bg_default_sec: u64,
    /// Background timeout ceiling, seconds (`OPKERNEL_BG_MAX_SECONDS`, 3600).
    pub bg_max_sec: u64,
    /// How long a container or the daemon may stay unreachable before its ops are lost.
    pub grace: Duration,
    /// Pause between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// How long after its exec claim an op without any trace is settled as failed.
    pub start_evidence_window: Duration,
    /// Hand ops to run containers' resident launchers (and ask them for
    /// probes); off: every op and probe goes by `docker exec`.
    pub launcher: bool,
    /// How long the resident launcher has to claim a request before the
    /// kernel takes it back and starts the op by `docker exec`.
    pub launcher_claim: Duration,
    /// Bytes of output kept in an op's `.log` (`OPKERNEL_LOG_CAP_BYTES`, 64
    /// MiB); the shim drops the rest.
    pub log_cap_bytes: u64,
    /// Safety-net cadence of liveness probes and exit-code checks.
    pub probe_interval: Duration,
    /// How often the kernel refreshes its observed ops' `heartbeat_at`
    /// (`OPKERNEL_HEARTBEAT_MS`).
    pub heartbeat_interval: Duration,
    /// Live ops of one run (and its descendants) when its envelope sets none
    /// (`OPKERNEL_MAX_OPS_PER_RUN`).
    pub max_live_ops_per_run: u64,
    /// Live ops across the whole kernel (`OPKERNEL_MAX_OPS`).
    pub max_live_ops: u64,
    /// Default `max_children` of a top-level run's envelope.
    pub max_children: u64,
    /// Deepest delegation: a run's chain holds at most this many ancestors.
    pub max_depth: usize,
    /// Kernel-wide approval rules (`OPKERNEL_APPROVAL_MATCH`, one regex per
    /// line), matched against every command joined by spaces.
    pub approval_match: Vec<String>,
    /// Idle time after which a container without live ops may be reaped.
    pub reap_ttl: Duration,
    /// How often the reaper looks for abandoned containers
    /// (`OPKERNEL_REAP_INTERVAL_SECONDS`).
    pub reap_interval: Duration,
    /// The warm pool: its size and pooled profiles (SPEC §22).
    pub pool: PoolConfig,
    /// This kernel as a cluster node (`serve --node`, SPEC §20); `None`:
    /// a single kernel.
    pub node: Option<NodeConfig>,
    /// Enables the fault hooks used by recovery drills.
    pub drills: bool,
    /// Bound of one Docker request, seconds. A start request that runs past
    /// it has an unknown outcome: the op is settled by evidence.
    pub docker_timeout_secs: u64,
    /// An observer attempt that ran this long before failing was healthy:
    /// its failure starts the "failed attempts in a row" count again.
    pub attempt_healthy: Duration,
    /// Where an unauthenticated `/metrics` listener binds
    /// (`OPKERNEL_METRICS_LISTEN`: a port, on loopback, or an address);
    /// none unless set.
    pub metrics_listen: Option<SocketAddr>,
    /// Where notified events are posted, signed (`OPKERNEL_WEBHOOK_URL`
    /// and `OPKERNEL_WEBHOOK_SECRET`); none unless set.
    pub webhook: Option<Webhook>,
    /// How long a delivered op's files (`.log`, `.pid`, `.code`) are kept
    /// (`OPKERNEL_OP_FILES_RETENTION`, default 7 days).
    pub op_files_retention: Duration,
    /// How long a finished top-level run tree stays in the control plane
    /// after it went quiet (`OPKERNEL_RETENTION`, default 30 days).
    pub retention: Duration,
    /// Settings that could not be read, each with its reason: the kernel
    /// refuses to start with any (a typo never silently means a default).
    pub invalid: Vec<String>,
}

/// Reads a duration setting: a whole number with a unit, `s`, `m`, `h`
/// or `d` (`2s`, `10m`, `7d`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let unit = text.chars().last().ok_or("an empty duration")?;
    let secs_per = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(format!("{text:?} needs a unit: s, m, h or d (e.g. 7d)")),
    };
    let n: u64 = text[..text.len() - 1]
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number with a unit (e.g. 10m)"))?;
    n.checked_mul(secs_per)
        .filter(|&s| s > 0 && s <= 100 * 365 * 86_400)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} must be between 1s and 100 years"))
}

fn env_duration(name: &str, default: Duration, invalid: &mut Vec<String>) -> Duration {
    match std::env::var(name) {
        Ok(v) => parse_duration(&v).unwrap_or_else(|e| {
            invalid.push(format!("{name}: {e}"));
            default
        }),
        Err(_) => default,
    }
}

/// The operator's webhook: where notified events are posted, and the
/// secret their HMAC-SHA256 signature is made with.
#[derive(Clone)]
pub struct Webhook {
    /// An `http://` URL.
    pub url: String,
    /// The signing key (never printed).
    pub secret: String,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("url", &self.url)
            .field("secret", &"(hidden)")
            .finish()
    }
}

impl Webhook {
    /// `OPKERNEL_WEBHOOK_URL` with its `OPKERNEL_WEBHOOK_SECRET`.
    fn from_env(invalid: &mut Vec<String>) -> Option<Webhook> {
        let url = std::env::var("OPKERNEL_WEBHOOK_URL").unwrap_or_default();
        let secret = std::env::var("OPKERNEL_WEBHOOK_SECRET").unwrap_or_default();
        Webhook::parse(&url, &secret).unwrap_or_else(|e| {
            invalid.push(e);
            None
        })
    }

    /// A webhook from its settings: none for an empty URL; an http:// URL
    /// needs a secret of at least 16 characters (unsigned posts could be
    /// forged); https is refused (the kernel's HTTP client has no TLS).
    pub fn parse(url: &str, secret: &str) -> Result<Option<Webhook>, String> {
        let url = url.trim();
        if url.is_empty() {
            return Ok(None);
        }
        let parsed = reqwest::Url::parse(url);
        if !parsed
            .as_ref()
            .is_ok_and(|u| u.scheme() == "http" && u.host().is_some())
        {
            return Err(format!(
                "OPKERNEL_WEBHOOK_URL: {url:?} is not an http:// URL (https is not supported: \
                 post to a relay on a trusted network that forwards over TLS)"
            ));
        }
        if secret.trim().len() < 16 {
            return Err(
                "OPKERNEL_WEBHOOK_SECRET: the webhook needs a signing secret of at least \
                 16 characters"
                    .into(),
            );
        }
        Ok(Some(Webhook {
            url: url.to_owned(),
            secret: secret.trim().to_owned(),
        }))
    }
}

/// An address from `name`: a bare port means that port on loopback.
fn env_addr(name: &str, invalid: &mut Vec<String>) -> Option<SocketAddr> {
    let text = std::env::var(name).ok()?;
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if let Ok(port) = text.parse::<u16>() {
        return Some(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    match text.parse() {
        Ok(addr) => Some(addr),
        Err(_) => {
            invalid.push(format!(
                "{name}: {text:?} is neither a port nor an address such as 127.0.0.1:9464"
            ));
            None
        }
    }
}

/// A whole-number setting: unset (or blank) means `default`; anything
/// else that is not a whole number refuses the start, naming the setting
/// (a typo never silently means a default).
fn env_u64(name: &str, default: u64, invalid: &mut Vec<String>) -> u64 {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().unwrap_or_else(|_| {
            let unit = if name.ends_with("_MS") {
                " of milliseconds"
            } else if name.ends_with("_SECONDS") || name.ends_with("_SEC") {
                " of seconds"
            } else {
                ""
            };
            invalid.push(format!("{name}: {v:?} is not a whole number{unit}"));
            default
        }),
        _ => default,
    }
}

/// An on/off setting: `on`, `1`, `true` or `off`, `0`, `false`; unset
/// means `default`, anything else refuses the start.
fn env_switch(name: &str, default: bool, invalid: &mut Vec<String>) -> bool {
    match std::env::var(name).as_deref().map(str::trim) {
        Err(_) | Ok("") => default,
        Ok("on" | "1" | "true" | "yes") => true,
        Ok("off" | "0" | "false" | "no") => false,
        Ok(other) => {
            invalid.push(format!("{name}: {other:?} is neither on nor off"));
            default
        }
    }
}

/// A size setting in bytes: unset (or blank) means `default`; else
/// [`parse_bytes`], whose refusal names the setting.
fn env_bytes(name: &str, default: u64, invalid: &mut Vec<String>) -> u64 {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => parse_bytes(&v).unwrap_or_else(|e| {
            invalid.push(format!("{name}: {e}"));
            default
        }),
        _ => default,
    }
}

/// Reads a size: a whole number of bytes, or one with a binary unit
/// (`KiB`, `MiB`, `GiB`, `TiB`) or a decimal one (`kB`, `MB`, `GB`, `TB`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (a whole number of bytes, or e.g. 512MiB)"))?;
    let per: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (B, KiB, MiB, GiB, TiB, kB, MB, GB or TB; e.g. 512MiB)"
            ))
        }
    };
    n.checked_mul(per)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// `OPKERNEL_APPROVAL_MATCH`: one regex per line, blank lines skipped.
fn approval_match_from_env() -> Vec<String> {
    std::env::var("OPKERNEL_APPROVAL_MATCH")
        .map(|v| {
            v.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// `OPKERNEL_NODE`, `OPKERNEL_ADVERTISE` and `OPKERNEL_NODE_TTL_SEC` (the
/// first two also `serve --node`, `--advertise`, which override them).
fn node_from_env(invalid: &mut Vec<String>) -> Option<NodeConfig> {
    // read (and checked) even without a node name: `serve --node` uses it
    let ttl = node_ttl_sec(invalid);
    let name = std::env::var("OPKERNEL_NODE").ok()?;
    let url = std::env::var("OPKERNEL_ADVERTISE").unwrap_or_default();
    NodeConfig::new(&name, &url, ttl)
        .map_err(|e| invalid.push(e))
        .ok()
}

/// `OPKERNEL_NODE_TTL_SEC` (10 by default); a bad value goes to `invalid`
/// ([`Config::from_env`] checks it whether or not the node is named there:
/// `serve --node` names it later and reads the same value here).
pub fn node_ttl_sec(invalid: &mut Vec<String>) -> u64 {
    env_u64("OPKERNEL_NODE_TTL_SEC", 10, invalid)
}

/// The kernel's base container profile: defaults, overridden by
/// `OPKERNEL_IMAGE`, `OPKERNEL_RUN_AS`, `OPKERNEL_NETWORK`,
/// `OPKERNEL_MEMORY_BYTES` and `OPKERNEL_PIDS_LIMIT`.
fn profile_from_env(invalid: &mut Vec<String>) -> Profile {
    let mut profile = Profile::default();
    if let Ok(image) = std::env::var("OPKERNEL_IMAGE") {
        profile.image = image;
    }
    // the drop to an unprivileged user is never turned off silently: only
    // an explicit `root` runs commands as root; an image without the
    // user is refused when its first container is made (and at start)
    if let Ok(user) = std::env::var("OPKERNEL_RUN_AS") {
        match user.trim() {
            "" => {}
            "root" => profile.run_as = None,
            name => profile.run_as = Some(name.to_owned()),
        }
    }
    if let Ok(network) = std::env::var("OPKERNEL_NETWORK") {
        profile.network = network;
    }
    profile.memory_bytes = env_bytes(
        "OPKERNEL_MEMORY_BYTES",
        profile.memory_bytes as u64,
        invalid,
    ) as i64;
    profile.pids_limit = env_u64("OPKERNEL_PIDS_LIMIT", profile.pids_limit as u64, invalid) as i64;
    profile
}

/// `OPKERNEL_OP_FILES_RETENTION` (7 days) and `OPKERNEL_RETENTION` (30
/// days); a tree is purged only once its ops' files are gone, so a shorter
/// retention than the files' (which would never apply) is refused.
fn retention_from_env(invalid: &mut Vec<String>) -> (Duration, Duration) {
    let day = Duration::from_secs(86_400);
    let files = env_duration("OPKERNEL_OP_FILES_RETENTION", 7 * day, invalid);
    let retention = env_duration("OPKERNEL_RETENTION", 30 * day, invalid);
    if retention < files {
        invalid.push(format!(
            "OPKERNEL_RETENTION ({retention:?}) must be at least OPKERNEL_OP_FILES_RETENTION ({files:?})"
        ));
    }
    (files, retention)
}

/// Where the control plane lives.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// `<home>/kernel.db` (the default: nothing to install for one host).
    Sqlite,
    /// A PostgreSQL 15+ server: its `postgres://` URL.
    Postgres(String),
}

impl StoreLocation {
    /// `OPKERNEL_STORE` (SQLite when unset); a bad value goes to `invalid`.
    fn from_env(invalid: &mut Vec<String>) -> StoreLocation {
        StoreLocation::parse(&std::env::var("OPKERNEL_STORE").unwrap_or_default()).unwrap_or_else(
            |e| {
                invalid.push(e);
                StoreLocation::Sqlite
            },
        )
    }

    /// `sqlite` (or nothing), or a `postgres://`/`postgresql://` URL.
    pub fn parse(value: &str) -> Result<StoreLocation, String> {
        match value.trim() {
            "" | "sqlite" => Ok(StoreLocation::Sqlite),
            url if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                Ok(StoreLocation::Postgres(url.to_owned()))
            }
            other => Err(format!(
                "OPKERNEL_STORE: {:?} is neither `sqlite` nor a postgres:// URL",
                redacted(other)
            )),
        }
    }

    /// What logs and errors may show: the URL without its password.
    pub fn shown(&self) -> String {
        match self {
            StoreLocation::Sqlite => "sqlite (the home's kernel.db)".to_owned(),
            StoreLocation::Postgres(url) => redacted(url),
        }
    }
}

impl std::fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

/// A URL with its password hidden: between `:` and `@` after the scheme,
/// and a `password=` parameter.
fn redacted(url: &str) -> String {
    let url = match url.split_once('?') {
        Some((base, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some(("password", _)) => "password=…".to_owned(),
                    _ => p.to_owned(),
                })
                .collect();
            format!("{base}?{}", params.join("&"))
        }
        None => url.to_owned(),
    };
    hide_userinfo_password(&url)
}

fn hide_userinfo_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            let hidden = if userinfo.contains(':') { ":…" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}")
        }
        None => url.to_owned(),
    }
}

impl Config {
    /// Defaults, overridden by `OPKERNEL_*` environment variables.
    pub fn from_env(home: PathBuf, listen: SocketAddr) -> Config {
        let mut invalid = Vec::new();
        let profile = profile_from_env(&mut invalid);
        let (op_files_retention, retention) = retention_from_env(&mut invalid);
        let store = StoreLocation::from_env(&mut invalid);
        let metrics_listen = env_addr("OPKERNEL_METRICS_LISTEN", &mut invalid);
        let webhook = Webhook::from_env(&mut invalid);
        let pool = PoolConfig::from_env(&profile, &mut invalid);
        let node = node_from_env(&mut invalid);
        Config {
            pool,
            node,
            metrics_listen,
            webhook,
            op_files_retention,
            retention,
            home,
            listen,
            store,
            docker_socket: std::env::var("OPKERNEL_DOCKER_SOCKET").ok(),
            profile,
            fg_default_sec: 300,
            fg_max_sec: env_u64("OPKERNEL_FG_MAX_SECONDS", 900, &mut invalid),
            bg_default_sec: 900,
            bg_max_sec: env_u64("OPKERNEL_BG_MAX_SECONDS", 3600, &mut invalid),
            grace: Duration::from_millis(env_u64("OPKERNEL_GRACE_MS", 60_000, &mut invalid)),
            kill_grace: Duration::from_millis(env_u64(
                "OPKERNEL_KILL_GRACE_MS",
                5_000,
                &mut invalid,
            )),
            start_evidence_window: Duration::from_millis(env_u64(
                "OPKERNEL_START_EVIDENCE_MS",
                10_000,
                &mut invalid,
            )),
            launcher: env_switch("OPKERNEL_LAUNCHER", true, &mut invalid),
            launcher_claim: Duration::from_millis(env_u64(
                "OPKERNEL_LAUNCHER_CLAIM_MS",
                10_000,
                &mut invalid,
            )),
            log_cap_bytes: env_bytes("OPKERNEL_LOG_CAP_BYTES", 64 << 20, &mut invalid),
            probe_interval: Duration::from_millis(
                env_u64("OPKERNEL_PROBE_INTERVAL_MS", 5_000, &mut invalid).max(100),
            ),
            heartbeat_interval: Duration::from_millis(
                env_u64("OPKERNEL_HEARTBEAT_MS", 10_000, &mut invalid).max(100),
            ),
            max_live_ops_per_run: env_u64("OPKERNEL_MAX_OPS_PER_RUN", 512, &mut invalid),
            max_live_ops: env_u64("OPKERNEL_MAX_OPS", 16_384, &mut invalid),
            max_children: env_u64(
                "OPKERNEL_MAX_CHILDREN",
                crate::runs::DEFAULT_MAX_CHILDREN,
                &mut invalid,
            ),
            max_depth: env_u64("OPKERNEL_MAX_DEPTH", 4, &mut invalid) as usize,
            approval_match: approval_match_from_env(),
            reap_ttl: Duration::from_secs(env_u64("OPKERNEL_REAP_TTL_SECONDS", 3600, &mut invalid)),
            reap_interval: Duration::from_secs(
                env_u64("OPKERNEL_REAP_INTERVAL_SECONDS", 300, &mut invalid).max(1),
            ),
            drills: std::env::var("OPKERNEL_DRILLS").is_ok_and(|v| v == "1"),
            docker_timeout_secs: env_u64(
                "OPKERNEL_DOCKER_TIMEOUT_SECONDS",
                sandbox::docker::REQUEST_TIMEOUT_SECS,
                &mut invalid,
            ),
            attempt_healthy: Duration::from_millis(env_u64(
                "OPKERNEL_ATTEMPT_HEALTHY_MS",
                60_000,
                &mut invalid,
            )),
            // last: every setting above has had its say
            invalid,
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
            network: self.profile.network.clone(),
            max_live_ops: self.max_live_ops_per_run,
            max_children: self.max_children,
            approval: crate::runs::ApprovalRules::default(),
        }
    }

    /// The admission limits: the kernel-wide one and the defaults for
    /// runs without an envelope of their own.
    pub fn admission(&self) -> crate::store::Admission {
        crate::store::Admission {
            max_live_per_run: self.max_live_ops_per_run,
            max_live: self.max_live_ops,
            max_children: self.max_children,
            implicit_run: true,
        }
    }

    /// `<home>/scratch`: where every run's scratch dir lives.
    pub fn scratch_root(&self) -> PathBuf {
        self.home.join("scratch")
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
