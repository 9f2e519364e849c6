//! The Docker side of workspaces (SPEC §26): where a run container's file
//! system is on the host (the files API's view) and the freeze of a
//! consistent fork.

use crate::error::{Result, SandboxError};
use crate::files::Root;
use crate::Sandbox;

impl Sandbox {
    /// Where the files API finds a running container's file system
    /// (SPEC §26): under runc, its main process's root as the host sees it
    /// (`/proc/<pid>/root`, mounts and all); under gVisor, whose processes
    /// the host cannot see into, its root file system on the host and its
    /// mounts, each mapped to the host directory behind it.
    pub async fn files_root(&self, container_id: &str) -> Result<Root> {
        let info = self
            .docker
            .inspect_container(
                container_id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await?;
        let state = info.state.clone().unwrap_or_default();
        let pid = match state.pid {
            Some(pid) if pid > 0 && state.running == Some(true) => pid,
            _ => {
                return Err(SandboxError::NotFound(format!(
                    "container {container_id} is not running"
                )))
            }
        };
        let runtime = info.host_config.as_ref().and_then(|h| h.runtime.clone());
        if runtime.as_deref() != Some(crate::Runtime::Runsc.as_str()) {
            return Ok(Root::Proc(pid));
        }
        crate::gvisor::files_root(container_id, &info)
    }

    /// Pauses (freezes every process of) or unpauses a container; one
    /// already so is fine.
    pub async fn set_paused(&self, container_id: &str, paused: bool) -> Result<()> {
        let done = if paused {
            self.docker.pause_container(container_id).await
        } else {
            self.docker.unpause_container(container_id).await
        };
        match done.map_err(SandboxError::from) {
            Ok(()) | Err(SandboxError::Conflict(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
