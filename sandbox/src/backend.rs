//! The seam between the kernel and whatever runs its commands. The kernel
//! asks for containers, launches, probes, signals and removals only through
//! [`OpBackend`]; [`Sandbox`] (Docker) implements it, unit tests use a fake,
//! and a second backend (Kubernetes, later) would implement it too.

use futures::future::BoxFuture;

use crate::docker::{ContainerInfo, Sandbox, TopProcess};
use crate::error::Result;
use crate::opfiles::{OpsDir, PidRecord};
use crate::profile::{PoolIdentity, Profile, RunIdentity};
use crate::shim::{LaunchSpec, MarkedProcess, Signal};
use opkernel_shim::table::ProcessRow;
use opkernel_shim::RunUser;

/// What the kernel needs from a sandbox backend, by concern. Every call is
/// bounded by the backend's own request timeout; errors are typed
/// [`crate::SandboxError`]s. Call sites bring the concerns' traits into
/// scope with `use sandbox::backend::prelude::*` to implement them.
pub trait OpBackend: Containers + Launches + Processes + Scratch + Send + Sync + 'static {}

impl<T: Containers + Launches + Processes + Scratch + Send + Sync + 'static> OpBackend for T {}

/// The concerns' traits, to call a backend's methods.
pub mod prelude {
    pub use super::{Containers, Launches, OpBackend, Processes, Scratch};
}

/// The run containers: made, found, listed, looked into, renamed and removed
/// (the warm pool's too).
pub trait Containers {
    /// Whether a container's scratch mount is this kernel home's.
    fn owns(&self, info: &ContainerInfo) -> bool;
    /// The user commands are dropped to, as the run image defines it.
    fn check_run_user<'a>(&'a self, profile: &'a Profile) -> BoxFuture<'a, Result<RunUser>>;
    /// The run's container, created (hardened, labelled) when missing.
    fn ensure_container<'a>(
        &'a self,
        identity: &'a RunIdentity,
        profile: &'a Profile,
    ) -> BoxFuture<'a, Result<ContainerInfo>>;
    /// The container as Docker describes it now (id or name); `NotFound` when
    /// it is gone.
    fn inspect<'a>(&'a self, id_or_name: &'a str) -> BoxFuture<'a, Result<ContainerInfo>>;
    /// Every container labelled as managed by opkernel.
    fn list_managed(&self) -> BoxFuture<'_, Result<Vec<ContainerInfo>>>;
    /// The container's process table, as the host sees it.
    fn top<'a>(&'a self, container_id: &'a str) -> BoxFuture<'a, Result<Vec<TopProcess>>>;
    /// Force-removes a container; `Ok(false)` when it was already gone.
    fn remove<'a>(&'a self, container_id: &'a str) -> BoxFuture<'a, Result<bool>>;
    /// Renames a container (an adopted pool container takes its run's
    /// container name, SPEC §24).
    fn rename<'a>(&'a self, container_id: &'a str, _name: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { Err(no_pool(container_id)) })
    }
    /// The id of an image as the engine has it now.
    fn image_id<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<String>> {
        Box::pin(async move { Err(no_pool(image)) })
    }
    /// The OCI runtimes the engine has registered, by name (SPEC §30).
    fn runtimes(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(async { Ok(vec!["runc".to_owned()]) })
    }
    /// Creates and starts a warm-pool container (SPEC §22).
    fn create_pool_container<'a>(
        &'a self,
        identity: &'a PoolIdentity,
        _profile: &'a Profile,
    ) -> BoxFuture<'a, Result<ContainerInfo>> {
        Box::pin(async move { Err(no_pool(&identity.name)) })
    }
    /// Freezes (`true`) or thaws a container's processes (a consistent
    /// fork, SPEC §26).
    fn set_paused<'a>(&'a self, container_id: &'a str, _paused: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { Err(no_pool(container_id)) })
    }
    /// Where a running container's file system is on the host (the files
    /// API's view, SPEC §26).
    fn files_root<'a>(
        &'a self,
        container_id: &'a str,
    ) -> BoxFuture<'a, Result<crate::files::Root>> {
        Box::pin(async move { Err(no_pool(container_id)) })
    }
    /// Finds or makes the kernel's internal egress network (SPEC §27),
    /// made for the proxy's `port`.
    fn ensure_egress_network<'a>(
        &'a self,
        name: &'a str,
        _port: u16,
    ) -> BoxFuture<'a, Result<crate::egress::EgressNetwork>> {
        Box::pin(async move { Err(no_egress(name)) })
    }
    /// The containers on a network, with their IPv4 addresses.
    fn network_peers<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(String, std::net::Ipv4Addr)>>> {
        Box::pin(async move { Err(no_egress(name)) })
    }
}

/// An op's one launch: created, started (the only place a command is ever
/// executed) and its own exit status.
pub trait Launches {
    /// Creates the op's launch (nothing runs yet); returns its id.
    fn create_launch<'a>(
        &'a self,
        container_id: &'a str,
        spec: &'a LaunchSpec<'a>,
        command: &'a [String],
    ) -> BoxFuture<'a, Result<String>>;
    /// Starts a created launch: the only place a command is ever executed.
    fn start_launch<'a>(&'a self, launch_id: &'a str) -> BoxFuture<'a, Result<()>>;
    /// The launch's own exit status (`None` while it runs), out of the command's reach.
    fn launch_status<'a>(&'a self, launch_id: &'a str) -> BoxFuture<'a, Result<Option<i64>>>;
}

/// The processes of a container: the marked ones, their table, and the
/// identity-checked signals.
pub trait Processes {
    /// Every process in the container that carries an op marker.
    fn probe<'a>(&'a self, container_id: &'a str) -> BoxFuture<'a, Result<Vec<MarkedProcess>>>;
    /// The process table of every marked process, for the operator's
    /// inspect (pid, user, CPU, RSS, age, command).
    fn process_table<'a>(
        &'a self,
        container_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ProcessRow>>> {
        Box::pin(async move {
            Err(crate::SandboxError::Probe {
                container: container_id.to_owned(),
                detail: "this backend lists no process table".into(),
            })
        })
    }
    /// The process table asked of the run container's resident launcher
    /// through its inbox; `Ok(None)` when no answer came in `timeout` (or
    /// the backend has no such path).
    fn process_table_by_launcher<'a>(
        &'a self,
        _scratch_key: &'a str,
        _host: &'a str,
        _timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<Option<Vec<ProcessRow>>>> {
        Box::pin(async { Ok(None) })
    }
    /// Stdin frames handed to the launcher of `host` for op `op_id` (its
    /// FIFO is inside a gVisor sandbox), or with `by_exec` (a container id)
    /// to a `docker exec` of the shim's relay; `Ok(None)`: no answer in
    /// `timeout` (or the backend has no such path).
    fn relay_stdin<'a>(
        &'a self,
        _scratch_key: &'a str,
        _host: &'a str,
        _op_id: &'a str,
        _frames: &'a [u8],
        _timeout: std::time::Duration,
        _by_exec: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<crate::launcher::Relayed>>> {
        Box::pin(async { Ok(None) })
    }
    /// The same listing, asked of the run container's resident launcher
    /// through its inbox; `Ok(None)` when no answer came in `timeout` (or
    /// the backend has no such path).
    fn probe_by_launcher<'a>(
        &'a self,
        _scratch_key: &'a str,
        _host: &'a str,
        _timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<Option<Vec<MarkedProcess>>>> {
        Box::pin(async { Ok(None) })
    }
    /// Signals the op's identity-checked processes (never its wrapper); returns the pids hit.
    fn signal_op<'a>(
        &'a self,
        container_id: &'a str,
        op_id: &'a str,
        record: &'a PidRecord,
        signal: Signal,
    ) -> BoxFuture<'a, Result<Vec<u32>>>;
    /// Signals the op's foreground process group only (SPEC §25); returns
    /// the pids hit.
    fn signal_group<'a>(
        &'a self,
        _container_id: &'a str,
        op_id: &'a str,
        _record: &'a PidRecord,
        _signal: Signal,
    ) -> BoxFuture<'a, Result<Vec<u32>>> {
        Box::pin(async move {
            Err(crate::SandboxError::Invalid(format!(
                "this backend sends no group signals ({op_id})"
            )))
        })
    }
}

/// A run's host scratch dir: its `.ops` files and a pool container's binding.
pub trait Scratch {
    /// The host directory holding a run's `.ops` files.
    fn ops_dir(&self, scratch_key: &str) -> OpsDir;
    /// Removes a run's scratch dir (after its container is gone).
    fn remove_scratch(&self, scratch_key: &str) -> Result<()>;
    /// Writes a run's binding file to a pool container's scratch dir.
    fn bind_scratch(&self, _run_key: &str, pool_key: &str) -> Result<()> {
        Err(no_pool(pool_key))
    }
    /// The pool key a run's scratch is bound to (its binding file).
    fn scratch_binding(&self, _run_key: &str) -> Result<Option<String>> {
        Ok(None)
    }
    /// Every binding file: (run key, pool key).
    fn scratch_bindings(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Whether a run's scratch path exists (a dir or a binding file).
    fn scratch_exists(&self, _scratch_key: &str) -> bool {
        false
    }
}

/// What a backend without a warm pool answers to the pool's calls.
fn no_egress(what: &str) -> crate::SandboxError {
    crate::SandboxError::Invalid(format!("this backend has no egress network ({what})"))
}

fn no_pool(what: &str) -> crate::SandboxError {
    crate::SandboxError::Invalid(format!("this backend keeps no warm pool ({what})"))
}

impl Containers for Sandbox {
    fn owns(&self, info: &ContainerInfo) -> bool {
        Sandbox::owns(self, info)
    }
    fn check_run_user<'a>(&'a self, profile: &'a Profile) -> BoxFuture<'a, Result<RunUser>> {
        Box::pin(Sandbox::check_run_user(self, profile))
    }
    fn ensure_container<'a>(
        &'a self,
        identity: &'a RunIdentity,
        profile: &'a Profile,
    ) -> BoxFuture<'a, Result<ContainerInfo>> {
        Box::pin(Sandbox::ensure_container(self, identity, profile))
    }
    fn inspect<'a>(&'a self, id_or_name: &'a str) -> BoxFuture<'a, Result<ContainerInfo>> {
        Box::pin(Sandbox::inspect(self, id_or_name))
    }
    fn list_managed(&self) -> BoxFuture<'_, Result<Vec<ContainerInfo>>> {
        Box::pin(Sandbox::list_managed(self))
    }
    fn top<'a>(&'a self, container_id: &'a str) -> BoxFuture<'a, Result<Vec<TopProcess>>> {
        Box::pin(Sandbox::top(self, container_id))
    }
    fn remove<'a>(&'a self, container_id: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(Sandbox::remove(self, container_id))
    }
    fn rename<'a>(&'a self, container_id: &'a str, name: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(Sandbox::rename(self, container_id, name))
    }
    fn image_id<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<String>> {
        Box::pin(Sandbox::image_id(self, image))
    }
    fn runtimes(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(Sandbox::runtimes(self))
    }
    fn set_paused<'a>(&'a self, container_id: &'a str, paused: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(Sandbox::set_paused(self, container_id, paused))
    }
    fn files_root<'a>(
        &'a self,
        container_id: &'a str,
    ) -> BoxFuture<'a, Result<crate::files::Root>> {
        Box::pin(Sandbox::files_root(self, container_id))
    }
    fn ensure_egress_network<'a>(
        &'a self,
        name: &'a str,
        port: u16,
    ) -> BoxFuture<'a, Result<crate::egress::EgressNetwork>> {
        Box::pin(Sandbox::ensure_egress_network(self, name, port))
    }
    fn network_peers<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(String, std::net::Ipv4Addr)>>> {
        Box::pin(Sandbox::network_peers(self, name))
    }
    fn create_pool_container<'a>(
        &'a self,
        identity: &'a PoolIdentity,
        profile: &'a Profile,
    ) -> BoxFuture<'a, Result<ContainerInfo>> {
        Box::pin(Sandbox::create_pool_container(self, identity, profile))
    }
}

impl Launches for Sandbox {
    fn create_launch<'a>(
        &'a self,
        container_id: &'a str,
        spec: &'a LaunchSpec<'a>,
        command: &'a [String],
    ) -> BoxFuture<'a, Result<String>> {
        Box::pin(Sandbox::create_op_exec(self, container_id, spec, command))
    }
    fn start_launch<'a>(&'a self, launch_id: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(Sandbox::start_op_exec(self, launch_id))
    }
    fn launch_status<'a>(&'a self, launch_id: &'a str) -> BoxFuture<'a, Result<Option<i64>>> {
        Box::pin(Sandbox::exec_status(self, launch_id))
    }
}

impl Processes for Sandbox {
    fn probe<'a>(&'a self, container_id: &'a str) -> BoxFuture<'a, Result<Vec<MarkedProcess>>> {
        Box::pin(Sandbox::probe(self, container_id))
    }
    fn process_table<'a>(
        &'a self,
        container_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ProcessRow>>> {
        Box::pin(Sandbox::process_table(self, container_id))
    }
    fn process_table_by_launcher<'a>(
        &'a self,
        scratch_key: &'a str,
        host: &'a str,
        timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<Option<Vec<ProcessRow>>>> {
        Box::pin(Sandbox::process_table_by_launcher(
            self,
            scratch_key,
            host,
            timeout,
        ))
    }
    fn probe_by_launcher<'a>(
        &'a self,
        scratch_key: &'a str,
        host: &'a str,
        timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<Option<Vec<MarkedProcess>>>> {
        Box::pin(Sandbox::probe_by_launcher(self, scratch_key, host, timeout))
    }
    fn relay_stdin<'a>(
        &'a self,
        scratch_key: &'a str,
        host: &'a str,
        op_id: &'a str,
        frames: &'a [u8],
        timeout: std::time::Duration,
        by_exec: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<crate::launcher::Relayed>>> {
        Box::pin(Sandbox::relay_stdin(
            self,
            scratch_key,
            host,
            op_id,
            frames,
            timeout,
            by_exec,
        ))
    }
    fn signal_op<'a>(
        &'a self,
        container_id: &'a str,
        op_id: &'a str,
        record: &'a PidRecord,
        signal: Signal,
    ) -> BoxFuture<'a, Result<Vec<u32>>> {
        Box::pin(self.signal_processes(container_id, op_id, record, signal, false))
    }
    fn signal_group<'a>(
        &'a self,
        container_id: &'a str,
        op_id: &'a str,
        record: &'a PidRecord,
        signal: Signal,
    ) -> BoxFuture<'a, Result<Vec<u32>>> {
        Box::pin(self.signal_processes(container_id, op_id, record, signal, true))
    }
}

impl Scratch for Sandbox {
    fn ops_dir(&self, scratch_key: &str) -> OpsDir {
        Sandbox::ops_dir(self, scratch_key)
    }
    fn remove_scratch(&self, scratch_key: &str) -> Result<()> {
        Sandbox::remove_scratch(self, scratch_key)
    }
    fn bind_scratch(&self, run_key: &str, pool_key: &str) -> Result<()> {
        Sandbox::bind_scratch(self, run_key, pool_key)
    }
    fn scratch_binding(&self, run_key: &str) -> Result<Option<String>> {
        Sandbox::scratch_binding(self, run_key)
    }
    fn scratch_bindings(&self) -> Vec<(String, String)> {
        Sandbox::scratch_bindings(self)
    }
    fn scratch_exists(&self, scratch_key: &str) -> bool {
        Sandbox::scratch_exists(self, scratch_key)
    }
}
