//! Every call to the Docker engine: run containers (ensure, inspect, list,
//! remove), op execs (launched through the shim), the shim's marker probe
//! and identity-checked signaller, and `docker top`.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, DownloadFromContainerOptionsBuilder,
    ListContainersOptionsBuilder, RemoveContainerOptionsBuilder, RenameContainerOptionsBuilder,
    TopOptionsBuilder,
};
use bollard::{ClientVersion, Docker};
use futures::StreamExt;

use crate::error::{Result, SandboxError};
use crate::liveness::{op_liveness, OpLiveness};
use crate::opfiles::{OpsDir, PidRecord};
use crate::profile::{
    container_config, is_launcher_command, Profile, RunIdentity, LABEL_MANAGED, LAUNCHER_CMD,
    SCRATCH_MOUNT, SHIM_MOUNT,
};
use crate::shim::{
    install_shim, launch_argv, marker, parse_probe, parse_signalled, probe_argv, ps_argv,
    signal_argv, LaunchSpec, MarkedProcess, RunAs, Signal,
};
use opkernel_shim::table::{parse_table, ProcessRow};
use opkernel_shim::RunUser;

/// The API version spoken when negotiation is impossible (the daemon is down
/// at connect time): Docker 20.10's, understood by every newer engine.
const FALLBACK_API: ClientVersion = ClientVersion {
    major_version: 1,
    minor_version: 41,
};
/// Default bound of one Docker request.
pub const REQUEST_TIMEOUT_SECS: u64 = 60;
/// Bytes of an image's `/etc/passwd` read to resolve the run user.
const MAX_PASSWD_BYTES: usize = 1 << 20;
const MAX_HELPER_OUTPUT: usize = 4 << 20;

/// A run container as Docker describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// Docker's full container id.
    pub id: String,
    /// The container's name, without Docker's leading `/`.
    pub name: String,
    /// Its labels (`opkernel.*` carry the run's durable identity).
    pub labels: HashMap<String, String>,
    /// Whether its main process runs.
    pub running: bool,
    /// The container's hostname, as recorded in the op's `.pid` file.
    pub hostname: String,
    /// Docker's state word: created, running, exited, ...
    pub state: String,
    /// Host directory mounted at `/scratch`: tells which kernel home owns it.
    pub scratch_source: Option<String>,
    /// The shim is mounted: the container was made by a kernel with the
    /// shim (earlier containers can be judged by `docker top` only).
    pub has_shim: bool,
    /// Its main process is the shim's resident launcher (`serve`): ops can
    /// be handed to it through the inbox instead of `docker exec`.
    pub has_launcher: bool,
}

/// One row of `docker top` (host pids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopProcess {
    /// The process's pid on the host (Docker's `PID` column, as text).
    pub host_pid: String,
    /// Its command line (Docker's `CMD` or `COMMAND` column).
    pub command: String,
}

/// Handle on the Docker engine plus the host directory that holds every
/// run's scratch dir and the installed shim every run container mounts.
#[derive(Clone)]
pub struct Sandbox {
    pub(crate) docker: Docker,
    scratch_root: PathBuf,
    pub(crate) shim: PathBuf,
}

impl Sandbox {
    /// Connects to `docker_socket` (a unix socket path) or the local default,
    /// negotiating the API version; a daemon that is down now is not an error.
    /// Installs the shim beside the scratch root (`<home>/bin/`).
    pub async fn connect(docker_socket: Option<&str>, scratch_root: PathBuf) -> Result<Self> {
        Self::connect_with_timeout(docker_socket, scratch_root, REQUEST_TIMEOUT_SECS).await
    }

    /// [`Sandbox::connect`] with a bound (seconds) on every Docker request.
    pub async fn connect_with_timeout(
        docker_socket: Option<&str>,
        scratch_root: PathBuf,
        timeout_secs: u64,
    ) -> Result<Self> {
        let socket = docker_socket
            .map(str::to_owned)
            .or_else(|| std::env::var("DOCKER_HOST").ok())
            .unwrap_or_else(|| "unix:///var/run/docker.sock".to_owned());
        let path = socket.trim_start_matches("unix://");
        let docker = Docker::connect_with_unix(path, timeout_secs.max(1), &FALLBACK_API)?;
        let docker = match docker.clone().negotiate_version().await {
            Ok(negotiated) => negotiated,
            Err(err) => {
                tracing::warn!(%err, "docker api version negotiation failed; using 1.41");
                docker
            }
        };
        std::fs::create_dir_all(&scratch_root).map_err(|e| SandboxError::io(&scratch_root, e))?;
        let shim = install_shim(&scratch_root.with_file_name("bin"))?;
        Ok(Sandbox {
            docker,
            scratch_root,
            shim,
        })
    }

    /// Checks that the Docker daemon answers.
    pub async fn ping(&self) -> Result<()> {
        self.docker.ping().await?;
        Ok(())
    }

    /// The host directory holding every run's scratch dir.
    pub fn scratch_root(&self) -> &Path {
        &self.scratch_root
    }

    /// The host directory of a run's scratch: `<scratch root>/<key>`.
    pub fn scratch_dir(&self, scratch_key: &str) -> PathBuf {
        self.scratch_root.join(scratch_key)
    }

    /// Whether a container's `/scratch` is this sandbox's scratch dir for its
    /// key: containers of another kernel home are never used or touched.
    pub fn owns(&self, info: &ContainerInfo) -> bool {
        let Some(key) = info.labels.get(crate::profile::LABEL_SCRATCH_KEY) else {
            return false;
        };
        let ours = self.scratch_dir(key).display().to_string();
        info.scratch_source.as_deref() == Some(ours.as_str())
    }

    /// The host side of a run's `.ops` dir (`<scratch>/<key>/.ops`).
    pub fn ops_dir(&self, scratch_key: &str) -> OpsDir {
        OpsDir::new(self.scratch_dir(scratch_key).join(".ops"))
    }

    /// Creates `<scratch>/<key>/` (mode 0700, root's until
    /// [`Sandbox::hand_scratch_to`] gives it to the run user), its
    /// root-owned `.ops/` (writable only by the shim) and `.ops/inbox/`
    /// (0700: the kernel and the launcher only). The parent is root-owned
    /// 0711: no other host user can plant anything in it.
    pub fn prepare_scratch(&self, scratch_key: &str) -> Result<PathBuf> {
        let dir = self.scratch_dir(scratch_key);
        // a binding file whose pool dir is gone binds nothing: a plain dir
        // takes its place
        if std::fs::read_link(&dir).is_ok() && !dir.exists() {
            std::fs::remove_file(&dir).map_err(|e| SandboxError::io(&dir, e))?;
        }
        let ops = dir.join(".ops");
        let inbox = ops.join("inbox");
        std::fs::create_dir_all(&inbox).map_err(|e| SandboxError::io(&inbox, e))?;
        set_mode(&dir, 0o700)?;
        set_mode(&ops, 0o755)?;
        set_mode(&inbox, 0o700)?;
        Ok(dir)
    }

    /// Gives the run's scratch dir (not its `.ops/`) to the run user.
    pub fn hand_scratch_to(&self, scratch_key: &str, owner: RunUser) -> Result<()> {
        let dir = self.scratch_dir(scratch_key);
        std::os::unix::fs::chown(&dir, Some(owner.uid), Some(owner.gid))
            .map_err(|e| SandboxError::io(&dir, e))?;
        set_mode(&dir, 0o700)
    }

    /// Docker's record of an exec: `None` while it runs, else its exit
    /// status. Records vanish minutes after the exec ends and on a daemon
    /// restart (an error then): never the source of an op's exit code, only
    /// corroboration.
    pub async fn exec_status(&self, exec_id: &str) -> Result<Option<i64>> {
        let info = self.docker.inspect_exec(exec_id).await?;
        if info.running.unwrap_or(false) {
            return Ok(None);
        }
        info.exit_code
            .map(Some)
            .ok_or_else(|| SandboxError::NotFound(format!("exec {exec_id} has no exit status")))
    }

    /// Removes a run's scratch dir (only ever the dir of the given key):
    /// when it is a binding to a pool container's dir, that dir, then the
    /// binding.
    pub fn remove_scratch(&self, scratch_key: &str) -> Result<()> {
        let dir = self.scratch_dir(scratch_key);
        if let Some(pool_key) = self.scratch_binding(scratch_key)? {
            // the binding first: a kill in between leaves an orphaned pool
            // dir (swept), never a binding to a missing dir
            match std::fs::remove_file(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(SandboxError::io(dir, e))
                }
                _ => {}
            }
            return remove_tree(&self.scratch_dir(&pool_key));
        }
        remove_tree(&dir)
    }

    /// The run container of `identity`: reused when it exists (after checking
    /// its labels), created and started otherwise. The deterministic name
    /// makes a retried create collide instead of producing a twin.
    pub async fn ensure_container(
        &self,
        identity: &RunIdentity,
        profile: &Profile,
    ) -> Result<ContainerInfo> {
        for _ in 0..3 {
            match self.inspect(&identity.name).await {
                Ok(info) => {
                    identity.check_labels(&info.labels).map_err(|reason| {
                        SandboxError::Foreign {
                            name: identity.name.clone(),
                            reason,
                        }
                    })?;
                    if !self.owns(&info) {
                        return Err(SandboxError::Foreign {
                            name: identity.name.clone(),
                            reason: format!(
                                "its /scratch is {}, not this kernel's (another kernel home owns it)",
                                info.scratch_source.as_deref().unwrap_or("not mounted")
                            ),
                        });
                    }
                    if info.running {
                        return Ok(info);
                    }
                    self.start_as_run(&info.id, &identity.scratch_key, profile)
                        .await?;
                    return self.inspect(&info.id).await;
                }
                Err(SandboxError::NotFound(_)) => {}
                Err(err) => return Err(err),
            }
            let scratch = self.prepare_scratch(&identity.scratch_key)?;
            let labels = identity.labels(unix_now());
            let config = container_config(labels, profile, &scratch, &self.shim);
            let options = CreateContainerOptionsBuilder::default()
                .name(&identity.name)
                .build();
            match self.docker.create_container(Some(options), config).await {
                Ok(created) => {
                    self.start_as_run(&created.id, &identity.scratch_key, profile)
                        .await?;
                    return self.inspect(&created.id).await;
                }
                // someone (a lost earlier response, a concurrent call) made it: check and reuse
                Err(err) => match SandboxError::from(err) {
                    SandboxError::Conflict(_) => continue,
                    other => return Err(other),
                },
            }
        }
        Err(SandboxError::Conflict(format!(
            "container {} kept changing while it was being ensured",
            identity.name
        )))
    }

    /// Starts a run container once its scratch dir belongs to the run user.
    /// An image without that user: the container is removed and the error
    /// says what to set.
    pub(crate) async fn start_as_run(
        &self,
        id: &str,
        scratch_key: &str,
        profile: &Profile,
    ) -> Result<()> {
        let owner = match self.run_user(id, profile).await {
            Ok(owner) => owner,
            Err(e @ SandboxError::Invalid(_)) => {
                let _ = self.remove(id).await;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        self.prepare_scratch(scratch_key)?;
        self.hand_scratch_to(scratch_key, owner)?;
        self.start(id).await
    }

    async fn start(&self, id: &str) -> Result<()> {
        match self.docker.start_container(id, None).await {
            Ok(()) => Ok(()),
            // 304: already started
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 304, ..
            }) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Inspects a container by id or name; `NotFound` when it is gone.
    pub async fn inspect(&self, id_or_name: &str) -> Result<ContainerInfo> {
        let info = self.docker.inspect_container(id_or_name, None).await?;
        let config = info.config.unwrap_or_default();
        let state = info.state.unwrap_or_default();
        let mounts = info.mounts.unwrap_or_default();
        let has_shim = mounts
            .iter()
            .any(|m| m.destination.as_deref() == Some(SHIM_MOUNT));
        let scratch_source = mounts
            .into_iter()
            .find(|m| m.destination.as_deref() == Some(SCRATCH_MOUNT))
            .and_then(|m| m.source);
        Ok(ContainerInfo {
            id: info.id.unwrap_or_default(),
            name: info
                .name
                .unwrap_or_default()
                .trim_start_matches('/')
                .to_owned(),
            labels: config.labels.unwrap_or_default(),
            running: state.running.unwrap_or(false),
            hostname: config.hostname.unwrap_or_default(),
            state: state.status.map(|s| s.to_string()).unwrap_or_default(),
            scratch_source,
            has_shim,
            // `serve`, or `serve --poll-ms=N` under gVisor
            has_launcher: config.cmd.as_deref().and_then(<[String]>::first)
                == Some(&LAUNCHER_CMD.to_owned())
                && config.entrypoint.as_deref() == Some(&[SHIM_MOUNT.to_owned()][..]),
        })
    }

    /// Every container labelled `opkernel.managed=true`, stopped ones too.
    pub async fn list_managed(&self) -> Result<Vec<ContainerInfo>> {
        let filters = HashMap::from([("label".to_owned(), vec![format!("{LABEL_MANAGED}=true")])]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let listed = self.docker.list_containers(Some(options)).await?;
        Ok(listed
            .into_iter()
            .map(|c| {
                let state = c.state.map(|s| s.to_string()).unwrap_or_default();
                let mounts = c.mounts.unwrap_or_default();
                ContainerInfo {
                    id: c.id.unwrap_or_default(),
                    name: c
                        .names
                        .and_then(|n| n.into_iter().next())
                        .unwrap_or_default()
                        .trim_start_matches('/')
                        .to_owned(),
                    labels: c.labels.unwrap_or_default(),
                    running: state == "running",
                    // list does not report the hostname; Docker defaults it to the short id
                    hostname: String::new(),
                    state,
                    has_launcher: c.command.as_deref().is_some_and(is_launcher_command),
                    has_shim: mounts
                        .iter()
                        .any(|m| m.destination.as_deref() == Some(SHIM_MOUNT)),
                    scratch_source: mounts
                        .into_iter()
                        .find(|m| m.destination.as_deref() == Some(SCRATCH_MOUNT))
                        .and_then(|m| m.source),
                }
            })
            .collect())
    }

    /// Creates and starts the op's exec (detached).
    pub async fn launch(
        &self,
        container_id: &str,
        spec: &LaunchSpec<'_>,
        command: &[String],
    ) -> Result<String> {
        let exec_id = self.create_op_exec(container_id, spec, command).await?;
        self.start_op_exec(&exec_id).await?;
        Ok(exec_id)
    }

    /// Creates the op's exec (nothing runs yet).
    pub async fn create_op_exec(
        &self,
        container_id: &str,
        spec: &LaunchSpec<'_>,
        command: &[String],
    ) -> Result<String> {
        let argv = launch_argv(spec, command)?;
        let exec = self
            .docker
            .create_exec(
                container_id,
                CreateExecOptions {
                    cmd: Some(argv),
                    env: Some(vec![marker(spec.op_id)]),
                    user: Some("0".to_owned()),
                    working_dir: Some(SCRATCH_MOUNT.to_owned()),
                    attach_stdout: Some(false),
                    attach_stderr: Some(false),
                    attach_stdin: Some(false),
                    tty: Some(false),
                    ..Default::default()
                },
            )
            .await?;
        Ok(exec.id)
    }

    /// Starts a created op exec, detached. The only place a command is ever
    /// executed.
    pub async fn start_op_exec(&self, exec_id: &str) -> Result<()> {
        self.docker
            .start_exec(
                exec_id,
                Some(StartExecOptions {
                    detach: true,
                    ..Default::default()
                }),
            )
            .await?;
        Ok(())
    }

    /// Runs a shim verb as root in the container and returns its stdout.
    pub(crate) async fn run_helper(&self, container_id: &str, argv: Vec<String>) -> Result<String> {
        let exec = self
            .docker
            .create_exec(
                container_id,
                CreateExecOptions {
                    cmd: Some(argv),
                    user: Some("0".to_owned()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(false),
                    ..Default::default()
                },
            )
            .await?;
        let mut out = Vec::new();
        if let StartExecResults::Attached { mut output, .. } =
            self.docker.start_exec(&exec.id, None).await?
        {
            while let Some(chunk) = output.next().await {
                let chunk = chunk?;
                if out.len() < MAX_HELPER_OUTPUT {
                    out.extend_from_slice(&chunk.into_bytes());
                }
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Every process in the container that carries an op marker.
    pub async fn probe(&self, container_id: &str) -> Result<Vec<MarkedProcess>> {
        let out = self.run_helper(container_id, probe_argv()).await?;
        parse_probe(&out).map_err(|detail| SandboxError::Probe {
            container: container_id.to_owned(),
            detail,
        })
    }

    /// The process table of every marked process (`opkernel-shim ps`).
    pub async fn process_table(&self, container_id: &str) -> Result<Vec<ProcessRow>> {
        let out = self.run_helper(container_id, ps_argv()).await?;
        parse_table(&out).map_err(|detail| SandboxError::Probe {
            container: container_id.to_owned(),
            detail,
        })
    }

    /// The identity probe of one op: is its wrapper alive (pid, start time and
    /// marker all match), and how many of its processes remain.
    pub async fn probe_op(
        &self,
        container_id: &str,
        op_id: &str,
        record: &PidRecord,
    ) -> Result<OpLiveness> {
        Ok(op_liveness(&self.probe(container_id).await?, op_id, record))
    }

    /// Sends `signal` to every identity-checked process of the op except its
    /// wrapper (which survives to write the exit code), or with `group` to
    /// its foreground process group only (SPEC §25). Returns the pids hit.
    pub async fn signal_processes(
        &self,
        container_id: &str,
        op_id: &str,
        record: &PidRecord,
        signal: Signal,
        group: bool,
    ) -> Result<Vec<u32>> {
        let argv = signal_argv(op_id, record.pid, record.start_ticks, signal, group)?;
        let out = self.run_helper(container_id, argv).await?;
        parse_signalled(&out).ok_or_else(|| SandboxError::Probe {
            container: container_id.to_owned(),
            detail: format!("signaller output incomplete: {out:?}"),
        })
    }

    /// `docker top`: the container's processes with host pids. Under
    /// gVisor the engine's table is the host's, not the container's: the
    /// shim's `ps --all` reads the container's own `/proc` instead (its
    /// pids are the container's).
    pub async fn top(&self, container_id: &str) -> Result<Vec<TopProcess>> {
        if self.runs_gvisor(container_id).await? {
            return self.top_inside(container_id).await;
        }
        let options = TopOptionsBuilder::default().ps_args("-eo pid,args").build();
        let top = self
            .docker
            .top_processes(container_id, Some(options))
            .await?;
        let titles = top.titles.unwrap_or_default();
        let pid_col = titles.iter().position(|t| t == "PID").unwrap_or(0);
        let cmd_col = titles
            .iter()
            .position(|t| t == "COMMAND" || t == "CMD")
            .unwrap_or(titles.len().saturating_sub(1));
        Ok(top
            .processes
            .unwrap_or_default()
            .into_iter()
            .map(|row| TopProcess {
                host_pid: row.get(pid_col).cloned().unwrap_or_default(),
                command: row.get(cmd_col).cloned().unwrap_or_default(),
            })
            .collect())
    }

    /// Renames a container (its labels stay as they were made).
    pub async fn rename(&self, container_id: &str, name: &str) -> Result<()> {
        let options = RenameContainerOptionsBuilder::default().name(name).build();
        self.docker
            .rename_container(container_id, options)
            .await
            .map_err(SandboxError::from)
    }

    /// Force-removes a container; `Ok(false)` when it was already gone.
    pub async fn remove(&self, container_id: &str) -> Result<bool> {
        let options = RemoveContainerOptionsBuilder::default().force(true).build();
        match self
            .docker
            .remove_container(container_id, Some(options))
            .await
        {
            Ok(()) => Ok(true),
            Err(err) => match SandboxError::from(err) {
                SandboxError::NotFound(_) => Ok(false),
                other => Err(other),
            },
        }
    }
}

fn remove_tree(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(SandboxError::io(dir, e)),
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| SandboxError::io(path, e))
}

/// The wall clock in seconds since the Unix epoch (0 if the clock is before
/// it): the `opkernel.created_at` stamp.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[path = "docker_user.rs"]
mod user;
