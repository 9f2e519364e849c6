//! The kernel's [`Config`] from the settings table: each layer's options
//! filled from its rows, every refusal collected in `Config::invalid`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use sandbox::Profile;

use super::table as t;
use super::Reader;
use crate::runtime::config::{
    Config, DockerOptions, DrillOptions, Images, NodeConfig, OpOptions, PoolConfig, RunOptions,
    TlsOptions, UpkeepOptions, Webhook,
};
use crate::store::StoreLocation;

/// The config of `opkernel serve`: `flags` (by variable name) over the
/// process's environment. Old names in use are logged as warnings.
pub fn from_env(flags: BTreeMap<&'static str, String>) -> Config {
    let env = |name: &str| std::env::var(name).ok();
    let mut r = Reader::new(&env, flags);
    let config = config(&mut r);
    for warning in &r.warnings {
        tracing::warn!("{warning}");
    }
    Config {
        invalid: r.invalid,
        ..config
    }
}

/// The config of every default, in `home` (tests' kernels).
pub fn defaults(home: PathBuf) -> Config {
    let env = |_: &str| None;
    let mut r = Reader::new(&env, BTreeMap::new());
    Config {
        home,
        ..config(&mut r)
    }
}

/// The config `r` reads; what does not parse is left in `r.invalid`.
pub fn config(r: &mut Reader) -> Config {
    let profile = profile(r);
    let images = images(r, &profile);
    let pool = pool(r, &profile, &images);
    let ops = ops(r);
    let declared = declared(r, &ops);
    Config {
        home: home(r),
        listen: listen(r),
        store: store(r),
        docker: DockerOptions {
            socket: r.text(&t::DOCKER_SOCKET),
            timeout: r.duration(&t::DOCKER_TIMEOUT),
        },
        ops,
        declared,
        runs: runs(r),
        upkeep: upkeep(r),
        pool,
        profile,
        images,
        file_max_bytes: r.bytes(&t::FILE_MAX_BYTES),
        egress: egress(r),
        node: node(r),
        metrics_listen: r.address(&t::METRICS_LISTEN),
        webhook: webhook(r),
        tls: tls(r),
        drills: DrillOptions {
            on: r.switch(&t::DRILLS),
            crash_at: r.text(&t::DRILL_CRASH_AT),
        },
        invalid: Vec::new(),
    }
}

/// The API's address: loopback unless `OPKERNEL_ALLOW_REMOTE` is on.
fn listen(r: &mut Reader) -> std::net::SocketAddr {
    let listen = r
        .address(&t::LISTEN)
        .unwrap_or_else(|| std::net::SocketAddr::from(([127, 0, 0, 1], 7878)));
    if !listen.ip().is_loopback() && !r.switch(&t::ALLOW_REMOTE) {
        r.invalid.push(format!(
            "{}: refusing to listen on the non-loopback address {listen}: \
             pass --allow-remote (or {}=on) to expose the kernel",
            t::LISTEN.env,
            t::ALLOW_REMOTE.env
        ));
    }
    listen
}

/// `OPKERNEL_HOME`, `~` standing for `$HOME`.
pub fn home(r: &mut Reader) -> PathBuf {
    let text = r.text(&t::HOME).unwrap_or_default();
    match text.strip_prefix('~') {
        Some(rest) => {
            let base = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
            PathBuf::from(format!("{base}{rest}"))
        }
        None => PathBuf::from(text),
    }
}

fn store(r: &mut Reader) -> StoreLocation {
    let text = r.text(&t::STORE).unwrap_or_default();
    StoreLocation::parse(&text).unwrap_or_else(|e| {
        r.invalid.push(e);
        StoreLocation::Sqlite
    })
}

/// The declared schedules file, read and checked (SPEC §28); what is wrong
/// with it names its line.
fn declared(
    r: &mut Reader,
    ops: &crate::runtime::config::OpOptions,
) -> Option<crate::store::DeclaredFile> {
    let path = r.text(&t::SCHEDULES).filter(|p| !p.is_empty())?;
    let timeouts = super::declared::Timeouts {
        default_sec: ops.bg_default_sec,
        max_sec: ops.bg_max_sec,
    };
    super::declared::read(std::path::Path::new(&path), timeouts)
        .map_err(|e| r.invalid.push(format!("OPKERNEL_SCHEDULES: {e}")))
        .ok()
}

/// The egress proxy's settings (SPEC §27).
fn egress(r: &mut Reader) -> crate::runtime::config::EgressConfig {
    let port = r.count(&t::EGRESS_PORT);
    let hosts = r.text(&t::EGRESS_HOSTS).unwrap_or_default();
    let hosts = crate::runtime::config::EgressConfig::parse_hosts(&hosts).unwrap_or_else(|e| {
        r.invalid.push(format!("OPKERNEL_EGRESS_HOSTS: {e}"));
        Default::default()
    });
    let port = u16::try_from(port)
        .ok()
        .filter(|p| *p > 0)
        .unwrap_or_else(|| {
            r.invalid.push(format!(
                "OPKERNEL_EGRESS_PORT: a port from 1 to 65535, got {port}"
            ));
            3128
        });
    crate::runtime::config::EgressConfig {
        on: r.switch(&t::EGRESS),
        private: r.switch(&t::EGRESS_PRIVATE),
        port,
        hosts,
    }
}

/// The base profile: the sandbox's defaults with the table's settings.
fn profile(r: &mut Reader) -> Profile {
    let mut profile = Profile {
        image: r.text(&t::IMAGE).unwrap_or_default(),
        network: r.text(&t::NETWORK).unwrap_or_default(),
        memory_bytes: clamp_i64(r.bytes(&t::MEMORY)),
        pids_limit: clamp_i64(r.count(&t::PIDS_LIMIT)),
        ..Profile::default()
    };
    // the drop to an unprivileged user is never turned off silently: only
    // an explicit `root` runs commands as root; an image without the user
    // is refused when its first container is made (and at start)
    profile.run_as = match r.text(&t::RUN_AS).as_deref() {
        Some("root") => None,
        other => other.map(str::to_owned),
    };
    let runtime = r.text(&t::RUNTIME).unwrap_or_default();
    match sandbox::Runtime::parse(&runtime) {
        Some(sandbox::Runtime::Runsc) if profile.network != "none" => r.invalid.push(format!(
            "{}=runsc runs with network none (gVisor's network stack cannot start here), \
             but {} is {:?}",
            t::RUNTIME.env,
            t::NETWORK.env,
            profile.network
        )),
        // stdin reaches a gVisor op through its launcher, and a root
        // command's container has none
        Some(sandbox::Runtime::Runsc) if profile.runs_as_root() => r.invalid.push(format!(
            "{}=runsc needs commands that do not run as root ({} is root)",
            t::RUNTIME.env,
            t::RUN_AS.env
        )),
        Some(rt) => profile.runtime = rt,
        None => r.invalid.push(format!(
            "{}: runc or runsc, got {runtime:?}",
            t::RUNTIME.env
        )),
    }
    profile
}

fn clamp_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn ops(r: &mut Reader) -> OpOptions {
    let at_least = |d: Duration, min: Duration| d.max(min);
    OpOptions {
        fg_max_sec: r.duration(&t::FG_MAX_TIMEOUT).as_secs(),
        bg_max_sec: r.duration(&t::BG_MAX_TIMEOUT).as_secs(),
        grace: r.duration(&t::GRACE),
        kill_grace: r.duration(&t::KILL_GRACE),
        start_evidence_window: r.duration(&t::START_EVIDENCE),
        launcher: r.switch(&t::LAUNCHER),
        launcher_claim: r.duration(&t::LAUNCHER_CLAIM),
        log_cap_bytes: r.bytes(&t::LOG_CAP),
        probe_interval: at_least(r.duration(&t::PROBE_INTERVAL), Duration::from_millis(100)),
        heartbeat_interval: at_least(r.duration(&t::HEARTBEAT), Duration::from_millis(100)),
        attempt_healthy: r.duration(&t::ATTEMPT_HEALTHY),
        // a start without a timeout of its own gets these (capped by the
        // ceilings above)
        fg_default_sec: 300,
        bg_default_sec: 900,
    }
}

fn runs(r: &mut Reader) -> RunOptions {
    RunOptions {
        max_live_ops_per_run: r.count(&t::MAX_OPS_PER_RUN),
        max_live_ops: r.count(&t::MAX_OPS),
        max_children: r.count(&t::MAX_CHILDREN),
        max_depth: usize::try_from(r.count(&t::MAX_DEPTH)).unwrap_or(usize::MAX),
        approval_match: r.list(&t::APPROVAL_MATCH),
    }
}

/// A tree is purged only once its ops' files are gone, so a retention
/// shorter than the files' (which would never apply) is refused.
fn upkeep(r: &mut Reader) -> UpkeepOptions {
    let files = r.duration(&t::OP_FILES_RETENTION);
    let retention = r.duration(&t::RETENTION);
    if files.is_zero() || retention.is_zero() {
        r.invalid.push(format!(
            "{} and {} must be longer than 0s",
            t::OP_FILES_RETENTION.env,
            t::RETENTION.env
        ));
    }
    if retention < files {
        r.invalid.push(format!(
            "{} ({retention:?}) must be at least {} ({files:?})",
            t::RETENTION.env,
            t::OP_FILES_RETENTION.env
        ));
    }
    UpkeepOptions {
        reap_ttl: r.duration(&t::REAP_TTL),
        reap_interval: r.duration(&t::REAP_INTERVAL).max(Duration::from_secs(1)),
        op_files_retention: files,
        retention,
    }
}

fn images(r: &mut Reader, base: &Profile) -> Images {
    let listed = r.text(&t::IMAGES).unwrap_or_default();
    Images::parse(&listed, &base.image).unwrap_or_else(|e| {
        r.invalid.push(format!("{}: {e}", t::IMAGES.env));
        Images::parse("", &base.image).unwrap_or_else(|_| unreachable!())
    })
}

fn pool(r: &mut Reader, base: &Profile, images: &Images) -> PoolConfig {
    let size = usize::try_from(r.count(&t::POOL)).unwrap_or(usize::MAX);
    let listed = r.text(&t::POOL_PROFILES).unwrap_or_default();
    let profiles = PoolConfig::profiles(base, &listed, images).unwrap_or_else(|e| {
        r.invalid.push(format!("{}: {e}", t::POOL_PROFILES.env));
        vec![base.clone()]
    });
    PoolConfig { size, profiles }
}

/// A node needs its name and advertised URL; the TTL is read (and
/// checked) whether or not the node is named.
fn node(r: &mut Reader) -> Option<NodeConfig> {
    let ttl = r.duration(&t::NODE_TTL);
    let name = r.text(&t::NODE);
    let url = r.text(&t::ADVERTISE);
    match (name, url) {
        (None, None) => None,
        (Some(name), url) => NodeConfig::new(&name, url.as_deref().unwrap_or_default(), ttl)
            .map_err(|e| r.invalid.push(e))
            .ok(),
        (None, Some(_)) => {
            r.invalid.push(format!(
                "{} is set but {} is not: name the node too",
                t::ADVERTISE.env,
                t::NODE.env
            ));
            None
        }
    }
}

fn webhook(r: &mut Reader) -> Option<Webhook> {
    let url = r.text(&t::WEBHOOK_URL).unwrap_or_default();
    let secret = r.text(&t::WEBHOOK_SECRET).unwrap_or_default();
    let ca = ca_file(r, &t::WEBHOOK_CA);
    Webhook::parse(&url, &secret, ca).unwrap_or_else(|e| {
        r.invalid.push(e);
        None
    })
}

/// A CA file setting: none when empty, refused when it holds no readable
/// PEM certificate.
pub fn ca_file(r: &mut Reader, s: &super::Setting) -> Option<PathBuf> {
    let path = PathBuf::from(r.text(s).filter(|p| !p.is_empty())?);
    match crate::base::tls::certificates(&path) {
        Ok(_) => Some(path),
        Err(e) => {
            r.invalid.push(format!("{}: {e:#}", s.env));
            None
        }
    }
}

/// The API's certificate and key (both or neither, and they must load)
/// and the peers' CA.
fn tls(r: &mut Reader) -> TlsOptions {
    let cert = r.text(&t::TLS_CERT).filter(|p| !p.is_empty());
    let key = r.text(&t::TLS_KEY).filter(|p| !p.is_empty());
    let server = match (cert, key) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            let pair = (PathBuf::from(cert), PathBuf::from(key));
            match crate::base::tls::ServerTls::load(&pair.0, &pair.1) {
                Ok(_) => Some(pair),
                Err(e) => {
                    r.invalid.push(format!("{e:#}"));
                    None
                }
            }
        }
        _ => {
            r.invalid.push(format!(
                "{} and {} go together: set both or neither",
                t::TLS_CERT.env,
                t::TLS_KEY.env
            ));
            None
        }
    };
    TlsOptions {
        server,
        ca: ca_file(r, &t::CA),
    }
}
