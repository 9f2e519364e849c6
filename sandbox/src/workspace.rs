//! The Docker side of workspaces (SPEC §26): a run container's main pid
//! (whose `/proc/<pid>/root` is the files API's view) and the freeze of a
//! consistent fork.

use crate::error::{Result, SandboxError};
use crate::Sandbox;

impl Sandbox {
    /// The host pid of a running container's main process.
    pub async fn main_pid(&self, container_id: &str) -> Result<i64> {
        let info = self
            .docker
            .inspect_container(
                container_id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await?;
        let state = info.state.unwrap_or_default();
        match state.pid {
            Some(pid) if pid > 0 && state.running == Some(true) => Ok(pid),
            _ => Err(SandboxError::NotFound(format!(
                "container {container_id} is not running"
            ))),
        }
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
