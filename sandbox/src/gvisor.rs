//! What differs for a container under gVisor (`runsc`, SPEC §30) on the
//! Docker side: the engine's `docker top` lists the host's processes for
//! it, so its table is read from inside.

use crate::docker::{Sandbox, TopProcess};
use crate::error::{Result, SandboxError};
use crate::profile::SHIM_MOUNT;
use crate::Runtime;
use opkernel_shim::table::parse_table;

impl Sandbox {
    /// Whether the container runs under gVisor.
    pub async fn runs_gvisor(&self, container_id: &str) -> Result<bool> {
        let info = self.docker.inspect_container(container_id, None).await?;
        let runtime = info.host_config.and_then(|h| h.runtime);
        Ok(runtime.as_deref() == Some(Runtime::Runsc.as_str()))
    }

    /// The container's whole process table from its own `/proc` (the
    /// shim's `ps --all`); the pids are the container's.
    pub(crate) async fn top_inside(&self, container_id: &str) -> Result<Vec<TopProcess>> {
        let argv = vec![SHIM_MOUNT.to_owned(), "ps".to_owned(), "--all".to_owned()];
        let out = self.run_helper(container_id, argv).await?;
        let rows = parse_table(&out).map_err(|detail| SandboxError::Probe {
            container: container_id.to_owned(),
            detail,
        })?;
        Ok(rows
            .into_iter()
            .map(|r| TopProcess {
                host_pid: r.pid.to_string(),
                command: r.command,
            })
            .collect())
    }
}
