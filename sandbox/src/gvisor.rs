//! What differs for a container under gVisor (`runsc`, SPEC §30) on the
//! Docker side: the engine's `docker top` lists the host's processes for
//! it, so its table is read from inside; and its files are reached
//! through its root file system and mounts on the host.

use crate::docker::{Sandbox, TopProcess};
use crate::error::{Result, SandboxError};
use crate::files::{Mount, Reach, Root};
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

/// File systems a gVisor sandbox keeps inside itself: the host reaches
/// none of them.
const INSIDE: &[(&str, &str)] = &[
    ("/proc", "the sandbox's own process file system"),
    ("/sys", "the sandbox's own system file system"),
    ("/dev", "the sandbox's own device file system"),
    // files Docker mounts over the image's (not in the inspect's mounts)
    ("/etc/hosts", "a file Docker mounts"),
    ("/etc/hostname", "a file Docker mounts"),
    ("/etc/resolv.conf", "a file Docker mounts"),
];

/// The files API's root of a gVisor container (see
/// [`crate::files::Root::Mapped`]): its root file system on the host (the
/// storage driver's merged directory) and its mounts, from its inspect.
pub(crate) fn files_root(
    container_id: &str,
    info: &bollard::models::ContainerInspectResponse,
) -> Result<Root> {
    let driver = info.graph_driver.as_ref();
    let Some(rootfs) = driver.and_then(|d| d.data.get("MergedDir")) else {
        let name = driver.map_or("unknown", |d| d.name.as_str());
        return Err(SandboxError::Io {
            path: format!("container {container_id}'s root file system").into(),
            source: std::io::Error::other(format!(
                "the engine's storage driver ({name}) shows no host directory for it; \
                 the files API needs overlay2 or fuse-overlayfs under gVisor"
            )),
        });
    };
    let mut mounts: Vec<Mount> = INSIDE
        .iter()
        .map(|(at, what)| unreachable(at, what))
        .collect();
    let tmpfs = info.host_config.as_ref().and_then(|h| h.tmpfs.as_ref());
    for at in tmpfs.into_iter().flat_map(|t| t.keys()) {
        mounts.push(unreachable(
            at,
            "a memory file system inside the gVisor sandbox",
        ));
    }
    for m in info.mounts.iter().flatten() {
        let (Some(at), Some(source)) = (&m.destination, &m.source) else {
            continue;
        };
        let reach = match std::fs::metadata(source) {
            Ok(meta) if meta.is_dir() => Reach::Host {
                dir: source.into(),
                writable: m.rw.unwrap_or(false),
            },
            _ => Reach::Unreachable(format!("{at}: a file the kernel mounts, not a directory")),
        };
        mounts.push(Mount {
            at: at.clone(),
            reach,
        });
    }
    Ok(Root::Mapped {
        rootfs: rootfs.into(),
        mounts,
    })
}

fn unreachable(at: &str, what: &str) -> Mount {
    Mount {
        at: at.to_owned(),
        reach: Reach::Unreachable(format!(
            "{at} is {what}, which the files API cannot reach: use /scratch"
        )),
    }
}
