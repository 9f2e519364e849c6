//! Run identity and container settings as pure functions: run id validation,
//! scratch key, run fingerprint, deterministic container name, durable labels
//! and the hardened container configuration.

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{ContainerCreateBody, HostConfig};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Result, SandboxError};
pub use opkernel_domain::envelope::Runtime;

/// Label `true` on every container opkernel made; the reaper and recovery look
/// at no other.
pub const LABEL_MANAGED: &str = "opkernel.managed";
/// Label: the run the container belongs to.
pub const LABEL_RUN_ID: &str = "opkernel.run_id";
/// Label: the run's scratch key (which `<home>/scratch/<key>/` it mounts).
pub const LABEL_SCRATCH_KEY: &str = "opkernel.scratch_key";
/// Label: the run fingerprint the container was made for.
pub const LABEL_FINGERPRINT: &str = "opkernel.run_fingerprint";
/// Label: when the container was created, unix seconds (ages it for the
/// reaper).
pub const LABEL_CREATED_AT: &str = "opkernel.created_at";

/// Label: on a warm-pool container, the fingerprint of the profile it was
/// made for ([`pool_fingerprint`]). A pool container has no run label: a
/// run adopts it later, and the binding (control plane + binding file)
/// says whose it is (SPEC §22).
pub const LABEL_POOL: &str = "opkernel.pool";
/// Label: on a warm-pool container, the id of the image it was made from
/// (a rebuilt image drains the pool).
pub const LABEL_POOL_IMAGE: &str = "opkernel.pool_image";
/// How a pool container's scratch key begins (a run's key is hex only).
pub const POOL_KEY_PREFIX: &str = "pool-";
/// How a pool container's name begins (until a run adopts it and it takes
/// the run's name).
pub const POOL_NAME_PREFIX: &str = "opkernel-pool-";

/// Where the run's scratch directory is mounted inside the container.
pub const SCRATCH_MOUNT: &str = "/scratch";
/// Where the op files live inside the container (a separate, root-owned mount).
pub const OPS_MOUNT: &str = opkernel_shim::OPS_DIR;
/// Where the shim is mounted (read-only) in every run container.
pub const SHIM_MOUNT: &str = opkernel_shim::SHIM_PATH;
/// The resident launcher's record in `.ops` (its pid and start time).
pub const LAUNCHER_RECORD: &str = opkernel_shim::LAUNCHER_RECORD;
/// The run container's main process: the shim's resident launcher.
pub const LAUNCHER_CMD: &str = "serve";

/// Capabilities kept in a run container. The agent's command runs as an
/// unprivileged user and holds none of them; the shim (run as root) needs
/// them: SETUID/SETGID to drop to that user; DAC_READ_SEARCH and SYS_PTRACE
/// to open another user's `/proc/<pid>/environ` (mode 0400, then a ptrace
/// access check) for the identity check; KILL to signal the op's processes.
pub const KEPT_CAPABILITIES: [&str; 5] =
    ["KILL", "SETUID", "SETGID", "SYS_PTRACE", "DAC_READ_SEARCH"];

/// The container settings of a run. Set by the operator (kernel config),
/// never by the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    /// The Docker image the container runs.
    pub image: String,
    /// Memory limit, in bytes (0 or less: unlimited).
    pub memory_bytes: i64,
    /// CPU limit, in billionths of a CPU (Docker's `NanoCpus`).
    pub nano_cpus: i64,
    /// Limit on the container's processes (0 or less: unlimited).
    pub pids_limit: i64,
    /// Docker network mode; `none` unless the operator opts in.
    pub network: String,
    /// `NAME=VALUE` pairs, sorted for a stable fingerprint.
    pub env: Vec<String>,
    /// Who the command runs as: `uid:gid` (whether or not the image has
    /// such a user) or a name from the image's /etc/passwd; `None` runs the
    /// command as root (only for an explicit `OPKERNEL_RUN_AS=root`).
    pub run_as: Option<String>,
    /// The container's root filesystem is read-only (writes go to `/scratch`
    /// and `/tmp`).
    pub read_only_root: bool,
    /// Size of the tmpfs mounted at `/tmp` (mode 1777), in bytes.
    pub tmpfs_bytes: i64,
    /// The OCI runtime Docker runs the container with. Left out of the
    /// canonical form while `runc`, so runc profiles keep the fingerprints
    /// they had before runtimes existed.
    #[serde(default, skip_serializing_if = "Runtime::is_runc")]
    pub runtime: Runtime,
}

/// How often, at most, a launcher under gVisor looks at its inbox (ms):
/// the host's renames into a bind mount raise no inotify event there.
pub const RUNSC_POLL_MS: u32 = 25;

impl Default for Profile {
    fn default() -> Self {
        Profile {
            image: "opkernel-sandbox:latest".to_owned(),
            memory_bytes: 2 << 30,
            nano_cpus: 2_000_000_000,
            pids_limit: 1024,
            network: "none".to_owned(),
            env: Vec::new(),
            run_as: Some("1000:1000".to_owned()),
            read_only_root: true,
            tmpfs_bytes: 512 << 20,
            runtime: Runtime::Runc,
        }
    }
}

impl Profile {
    /// Whether commands run as root (`run_as` unset or spelled `root`):
    /// then a command can reach `.ops` and its results need corroboration.
    pub fn runs_as_root(&self) -> bool {
        self.run_as.as_deref().is_none_or(|r| r == "root")
    }
}

/// Checks a run id against `[A-Za-z0-9_.-]{1,64}`, with no `..` and not `.`.
pub fn validate_run_id(run_id: &str) -> Result<()> {
    let charset_ok = run_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if run_id.is_empty() || run_id.len() > 64 || !charset_ok {
        return Err(SandboxError::Invalid(format!(
            "run id must match [A-Za-z0-9_.-]{{1,64}}, got {:?}",
            truncate_for_message(run_id)
        )));
    }
    if run_id == "." || run_id.contains("..") {
        return Err(SandboxError::Invalid(format!(
            "run id may not be '.' or contain '..', got {run_id:?}"
        )));
    }
    Ok(())
}

fn truncate_for_message(s: &str) -> String {
    s.chars().take(80).collect()
}

fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hex::encode(hasher.finalize())
}

/// The run's scratch key: path-safe by construction, stable for a run id.
pub fn scratch_key(run_id: &str) -> String {
    sha256_hex(&[b"opkernel-scratch", run_id.as_bytes()])[..24].to_owned()
}

/// What a run container must provide to the kernel (the shim mount, its
/// verbs and file formats). Part of the fingerprint: a container made for
/// another contract is never reused, it is left to the reaper.
pub const CONTAINER_CONTRACT: &[u8] = b"shim-1";

/// sha256 over run id + container contract + canonical profile. A changed
/// profile means a new container.
pub fn run_fingerprint(run_id: &str, profile: &Profile) -> String {
    let mut canonical = profile.clone();
    canonical.env.sort();
    // serde_json keeps struct field order, so this is canonical for a given type.
    let json = serde_json::to_vec(&canonical).unwrap_or_default();
    sha256_hex(&[
        b"opkernel-fingerprint",
        CONTAINER_CONTRACT,
        run_id.as_bytes(),
        &json,
    ])
}

/// Deterministic container name: a lost create response can never produce a
/// twin, because a retry collides with the first container's name.
pub fn container_name(scratch_key: &str, fingerprint: &str) -> String {
    format!("opkernel-{}-{}", scratch_key, &fingerprint[..12])
}

/// sha256 over the container contract + canonical profile: which pool a
/// container belongs to, and which runs may adopt it (those whose profile
/// has this fingerprint).
pub fn pool_fingerprint(profile: &Profile) -> String {
    let mut canonical = profile.clone();
    canonical.env.sort();
    let json = serde_json::to_vec(&canonical).unwrap_or_default();
    sha256_hex(&[b"opkernel-pool", CONTAINER_CONTRACT, &json])
}

/// Whether a scratch key is a pool container's (`pool-<hex>`).
pub fn is_pool_key(key: &str) -> bool {
    key.strip_prefix(POOL_KEY_PREFIX).is_some_and(|hex| {
        !hex.is_empty() && hex.len() <= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// What identifies a warm-pool container: its own scratch key (random), the
/// profile and image it was made for, and its name. It names no run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolIdentity {
    /// Its scratch key: `pool-` and 20 random hex digits.
    pub scratch_key: String,
    /// [`pool_fingerprint`] of its profile.
    pub fingerprint: String,
    /// The image id it was made from.
    pub image_id: String,
    /// `opkernel-pool-<hex>`.
    pub name: String,
}

impl PoolIdentity {
    /// A fresh pool identity for `profile` on image `image_id`.
    pub fn new(profile: &Profile, image_id: &str) -> PoolIdentity {
        let hex = uuid::Uuid::new_v4().simple().to_string()[..20].to_owned();
        PoolIdentity {
            scratch_key: format!("{POOL_KEY_PREFIX}{hex}"),
            fingerprint: pool_fingerprint(profile),
            image_id: image_id.to_owned(),
            name: format!("{POOL_NAME_PREFIX}{hex}"),
        }
    }

    /// The durable labels of a new pool container.
    pub fn labels(&self, created_at_unix: u64) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_MANAGED.to_owned(), "true".to_owned()),
            (LABEL_POOL.to_owned(), self.fingerprint.clone()),
            (LABEL_POOL_IMAGE.to_owned(), self.image_id.clone()),
            (LABEL_SCRATCH_KEY.to_owned(), self.scratch_key.clone()),
            (LABEL_CREATED_AT.to_owned(), created_at_unix.to_string()),
        ])
    }
}

/// What identifies a run container: checked against its labels before any use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIdentity {
    /// The run's id.
    pub run_id: String,
    /// The run's scratch key ([`scratch_key`]).
    pub scratch_key: String,
    /// The run fingerprint ([`run_fingerprint`]).
    pub fingerprint: String,
    /// The deterministic container name ([`container_name`]).
    pub name: String,
}

impl RunIdentity {
    /// The identity of `run_id`'s container under `profile`; refuses an invalid
    /// run id.
    pub fn new(run_id: &str, profile: &Profile) -> Result<Self> {
        validate_run_id(run_id)?;
        let scratch_key = scratch_key(run_id);
        let fingerprint = run_fingerprint(run_id, profile);
        let name = container_name(&scratch_key, &fingerprint);
        Ok(RunIdentity {
            run_id: run_id.to_owned(),
            scratch_key,
            fingerprint,
            name,
        })
    }

    /// The same identity with the cluster node's name in the container's
    /// name: nodes sharing one Docker engine never collide on a run's name
    /// (a run placed again on another node makes its container there).
    pub fn on_node(mut self, node: &str) -> Self {
        self.name = format!(
            "opkernel-{node}-{}-{}",
            self.scratch_key,
            &self.fingerprint[..12]
        );
        self
    }

    /// The durable labels a new container carries; `created_at_unix` in
    /// seconds.
    pub fn labels(&self, created_at_unix: u64) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_MANAGED.to_owned(), "true".to_owned()),
            (LABEL_RUN_ID.to_owned(), self.run_id.clone()),
            (LABEL_SCRATCH_KEY.to_owned(), self.scratch_key.clone()),
            (LABEL_FINGERPRINT.to_owned(), self.fingerprint.clone()),
            (LABEL_CREATED_AT.to_owned(), created_at_unix.to_string()),
        ])
    }

    /// Confirms that a container's labels name this run and fingerprint.
    pub fn check_labels(&self, labels: &HashMap<String, String>) -> Result<(), String> {
        let expect = [
            (LABEL_MANAGED, "true"),
            (LABEL_RUN_ID, self.run_id.as_str()),
            (LABEL_SCRATCH_KEY, self.scratch_key.as_str()),
            (LABEL_FINGERPRINT, self.fingerprint.as_str()),
        ];
        for (key, want) in expect {
            match labels.get(key) {
                None => return Err(format!("label {key} is missing")),
                Some(got) if got != want => {
                    return Err(format!("label {key} is {got:?}, expected {want:?}"))
                }
                Some(_) => {}
            }
        }
        if !labels.contains_key(LABEL_CREATED_AT) {
            return Err(format!("label {LABEL_CREATED_AT} is missing"));
        }
        Ok(())
    }
}

/// The full create body of a hardened run (or pool) container, carrying
/// `labels`. Its main process is the shim's resident launcher (under
/// Docker's init), so the image needs no shell at all.
pub fn container_config(
    labels: HashMap<String, String>,
    profile: &Profile,
    scratch_dir: &Path,
    shim: &Path,
) -> ContainerCreateBody {
    let scratch = scratch_dir.display().to_string();
    let host_config = HostConfig {
        binds: Some(vec![
            format!("{scratch}:{SCRATCH_MOUNT}:rw"),
            format!("{scratch}/.ops:{OPS_MOUNT}:rw"),
            format!("{}:{SHIM_MOUNT}:ro", shim.display()),
        ]),
        cap_drop: Some(vec!["ALL".to_owned()]),
        cap_add: Some(KEPT_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect()),
        security_opt: Some(vec!["no-new-privileges".to_owned()]),
        readonly_rootfs: Some(profile.read_only_root),
        tmpfs: Some(HashMap::from([(
            "/tmp".to_owned(),
            format!("rw,nosuid,nodev,mode=1777,size={}", profile.tmpfs_bytes),
        )])),
        pids_limit: Some(profile.pids_limit),
        memory: Some(profile.memory_bytes),
        nano_cpus: Some(profile.nano_cpus),
        network_mode: Some(profile.network.clone()),
        privileged: Some(false),
        init: Some(true),
        runtime: (!profile.runtime.is_runc()).then(|| profile.runtime.as_str().to_owned()),
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(profile.image.clone()),
        entrypoint: Some(vec![SHIM_MOUNT.to_owned()]),
        // a root command could write the inbox: no launcher then
        cmd: Some(main_command(profile)),
        env: Some(profile.env.clone()),
        labels: Some(labels),
        working_dir: Some(SCRATCH_MOUNT.to_owned()),
        user: Some("0".to_owned()),
        network_disabled: Some(profile.network == "none"),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// Whether a container's command line (as `docker ps` shows it) is the
/// resident launcher's: `serve`, or `serve --poll-ms=N` under gVisor.
pub fn is_launcher_command(cmd: &str) -> bool {
    cmd.strip_prefix(SHIM_MOUNT)
        .and_then(|rest| rest.strip_prefix(' '))
        .and_then(|rest| rest.strip_prefix(LAUNCHER_CMD))
        .is_some_and(|poll| {
            poll.is_empty()
                || poll
                    .strip_prefix(" --poll-ms=")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// The container's main process (after the shim's path): the resident
/// launcher, polling its inbox under gVisor; `idle` when a root command
/// could write the inbox (no launcher then).
fn main_command(profile: &Profile) -> Vec<String> {
    if profile.runs_as_root() {
        return vec!["idle".to_owned()];
    }
    let mut cmd = vec![LAUNCHER_CMD.to_owned()];
    if profile.runtime == Runtime::Runsc {
        cmd.push(format!("--poll-ms={RUNSC_POLL_MS}"));
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_validated() {
        for ok in ["a", "run-1", "A.b_c-9", &"x".repeat(64)] {
            assert!(validate_run_id(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a..b",
            "a/b",
            "a b",
            "ä",
            &"x".repeat(65),
            "a\0b",
        ] {
            assert!(validate_run_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn scratch_key_is_stable_and_path_safe() {
        assert_eq!(scratch_key("run-1"), scratch_key("run-1"));
        assert_ne!(scratch_key("run-1"), scratch_key("run-2"));
        assert!(scratch_key("..x").chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn fingerprint_changes_with_profile_not_env_order() {
        let a = Profile {
            env: vec!["A=1".into(), "B=2".into()],
            ..Profile::default()
        };
        let b = Profile {
            env: vec!["B=2".into(), "A=1".into()],
            ..Profile::default()
        };
        let c = Profile {
            memory_bytes: 1 << 30,
            ..Profile::default()
        };
        assert_eq!(run_fingerprint("r", &a), run_fingerprint("r", &b));
        assert_ne!(run_fingerprint("r", &a), run_fingerprint("r", &c));
        assert_ne!(run_fingerprint("r", &a), run_fingerprint("s", &a));
    }

    #[test]
    fn a_runtime_is_its_own_container_and_runc_keeps_old_fingerprints() {
        let runc = Profile::default();
        let runsc = Profile {
            runtime: Runtime::Runsc,
            ..Profile::default()
        };
        // runc is left out of the canonical form: the fingerprints of
        // containers made before runtimes existed are unchanged
        let canonical = serde_json::to_string(&runc).unwrap();
        assert!(!canonical.contains("runtime"), "{canonical}");
        assert_ne!(run_fingerprint("r", &runc), run_fingerprint("r", &runsc));
        assert_ne!(pool_fingerprint(&runc), pool_fingerprint(&runsc));
        let body = container_config(HashMap::new(), &runsc, Path::new("/s"), Path::new("/shim"));
        let host = body.host_config.unwrap();
        assert_eq!(host.runtime.as_deref(), Some("runsc"));
        assert_eq!(
            body.cmd.unwrap(),
            vec!["serve".to_owned(), "--poll-ms=25".to_owned()]
        );
        let plain = container_config(HashMap::new(), &runc, Path::new("/s"), Path::new("/shim"));
        assert_eq!(plain.host_config.unwrap().runtime, None);
        assert_eq!(plain.cmd.unwrap(), vec!["serve".to_owned()]);
        for (cmd, launcher) in [
            ("/.opkernel/shim serve", true),
            ("/.opkernel/shim serve --poll-ms=25", true),
            ("/.opkernel/shim serve --poll-ms=", false),
            ("/.opkernel/shim serve --poll-ms=25; sh", false),
            ("/.opkernel/shim idle", false),
            ("sh serve", false),
        ] {
            assert_eq!(is_launcher_command(cmd), launcher, "{cmd}");
        }
    }

    #[test]
    fn labels_round_trip_and_mismatch_is_named() {
        let id = RunIdentity::new("run-1", &Profile::default()).unwrap();
        let labels = id.labels(1_700_000_000);
        assert_eq!(id.check_labels(&labels), Ok(()));
        let other = RunIdentity::new("run-2", &Profile::default()).unwrap();
        let err = other.check_labels(&labels).unwrap_err();
        assert!(err.contains(LABEL_RUN_ID), "{err}");
        let mut missing = labels.clone();
        missing.remove(LABEL_FINGERPRINT);
        assert!(id.check_labels(&missing).unwrap_err().contains("missing"));
    }

    #[test]
    fn pool_identities_are_fresh_and_name_no_run() {
        let profile = Profile::default();
        let a = PoolIdentity::new(&profile, "sha256:1");
        let b = PoolIdentity::new(&profile, "sha256:1");
        assert_ne!(a.scratch_key, b.scratch_key);
        assert!(is_pool_key(&a.scratch_key), "{}", a.scratch_key);
        assert!(!is_pool_key(&scratch_key("run-1")));
        assert!(!is_pool_key("pool-../x"));
        assert_eq!(a.fingerprint, b.fingerprint);
        let labels = a.labels(5);
        assert!(!labels.contains_key(LABEL_RUN_ID));
        assert_eq!(labels[LABEL_POOL], pool_fingerprint(&profile));
        let narrower = Profile {
            memory_bytes: 1 << 30,
            ..Profile::default()
        };
        assert_ne!(pool_fingerprint(&narrower), a.fingerprint);
    }

    #[test]
    fn container_name_is_deterministic() {
        let id = RunIdentity::new("run-1", &Profile::default()).unwrap();
        let again = RunIdentity::new("run-1", &Profile::default()).unwrap();
        assert_eq!(id.name, again.name);
        assert!(id
            .name
            .starts_with(&format!("opkernel-{}-", id.scratch_key)));
    }

    #[test]
    fn container_config_is_hardened() {
        let profile = Profile::default();
        let id = RunIdentity::new("run-1", &profile).unwrap();
        let cfg = container_config(
            id.labels(5),
            &profile,
            Path::new("/h/scratch/k"),
            Path::new("/h/bin/shim"),
        );
        let host = cfg.host_config.unwrap();
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(
            host.security_opt,
            Some(vec!["no-new-privileges".to_owned()])
        );
        assert_eq!(host.readonly_rootfs, Some(true));
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.privileged, Some(false));
        assert_eq!(
            host.binds,
            Some(vec![
                "/h/scratch/k:/scratch:rw".to_owned(),
                "/h/scratch/k/.ops:/scratch/.ops:rw".to_owned(),
                "/h/bin/shim:/.opkernel/shim:ro".to_owned(),
            ])
        );
        assert_eq!(cfg.entrypoint, Some(vec![SHIM_MOUNT.to_owned()]));
        assert_eq!(cfg.user.as_deref(), Some("0"));
        assert!(host.tmpfs.unwrap()["/tmp"].contains("mode=1777"));
        assert_eq!(cfg.labels.unwrap()[LABEL_MANAGED], "true");
    }
}
