//! Workspace upkeep on the kernel's side (SPEC §26): where snapshots live,
//! the sweep of those whose run is gone, and the thaw of containers a
//! consistent fork left frozen when the kernel stopped during its copy.

use std::path::PathBuf;

use crate::runtime::kernel::Kernel;
use crate::store::StoreError;

/// Where a run's snapshots live: `<home>/snapshots/<run>`.
pub fn run_snapshots_dir(k: &Kernel, run: &str) -> PathBuf {
    k.config.home.join("snapshots").join(run)
}

/// Where one snapshot lives.
pub fn snapshot_dir(k: &Kernel, run: &str, name: &str) -> PathBuf {
    run_snapshots_dir(k, run).join(name)
}

/// Removes the snapshot dirs of runs the control plane no longer has (a
/// purged tree, on whichever node holds them), snapshot copies whose row
/// a crash kept from being written, and fork copies a crash left half
/// made. Returns how many went.
pub async fn sweep(k: &Kernel) -> Result<usize, StoreError> {
    let mut removed = 0;
    let root = k.config.home.join("snapshots");
    for run in names_in(&root) {
        if k.store.get_run(&run).await?.is_none() {
            removed += usize::from(std::fs::remove_dir_all(root.join(&run)).is_ok());
            continue;
        }
        // a copy put in place whose row a crash kept from being written
        for name in names_in(&root.join(&run)) {
            let dir = root.join(&run).join(&name);
            if stale(&dir) && k.store.snapshot(&run, &name).await?.is_none() {
                removed += usize::from(std::fs::remove_dir_all(&dir).is_ok());
            }
        }
    }
    let scratch = k.config.scratch_root();
    for name in names_in(&scratch)
        .into_iter()
        .filter(|n| n.starts_with(".fork-"))
    {
        if stale(&scratch.join(&name)) && std::fs::remove_dir_all(scratch.join(&name)).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// Whether a copy was last moved or made longer ago than any copy in
/// progress may take (an hour): a fork's or snapshot's copy is put in
/// place, then recorded, at once. By its inode's change time, which its
/// rename into place sets (its modification time may be its source's).
fn stale(dir: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let now = crate::store::now_ms() / 1000;
    std::fs::symlink_metadata(dir).is_ok_and(|m| now - m.ctime() > 3600)
}

fn names_in(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Where the marks of containers a fork's copy froze live: one empty file
/// per container id, made before the pause and removed after the thaw.
fn frozen_marks(k: &Kernel) -> PathBuf {
    k.config.home.join("frozen")
}

/// Marks `id` as frozen by a fork's copy, before it is paused: a kernel
/// that stops during the copy thaws it at its next start.
pub fn mark_frozen(k: &Kernel, id: &str) -> std::io::Result<()> {
    let dir = frozen_marks(k);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(id), b"")
}

/// Removes the mark of a thawed container.
pub fn unmark_frozen(k: &Kernel, id: &str) {
    let _ = std::fs::remove_file(frozen_marks(k).join(id));
}

/// What a mark says once the thaw that should have removed it failed: the
/// retention pass retries those (a mark without it belongs to a copy in
/// progress, thawed by that copy).
const THAW_FAILED: &[u8] = b"thaw failed";

/// Keeps the mark of a container whose thaw failed, for the retry.
pub fn thaw_failed(k: &Kernel, id: &str) {
    let _ = std::fs::write(frozen_marks(k).join(id), THAW_FAILED);
}

/// Unpauses the containers a fork's copy froze and a kernel that stopped
/// during the copy left so (by their marks: a container the operator
/// paused by hand stays paused). At start, every mark.
pub async fn thaw_all(k: &Kernel) {
    thaw_marked(k, false).await;
}

/// The retention pass's retry of the thaws that failed.
pub async fn retry_thaws(k: &Kernel) {
    thaw_marked(k, true).await;
}

async fn thaw_marked(k: &Kernel, failed_only: bool) {
    let dir = frozen_marks(k);
    let marked: Vec<String> = names_in(&dir)
        .into_iter()
        .filter(|id| !failed_only || std::fs::read(dir.join(id)).is_ok_and(|m| m == THAW_FAILED))
        .collect();
    if marked.is_empty() {
        return;
    }
    let Ok(list) = k.backend.list_managed().await else {
        return;
    };
    for id in &marked {
        let Some(c) = list.iter().find(|c| c.id == *id && k.backend.owns(c)) else {
            // gone meanwhile: nothing to thaw
            unmark_frozen(k, id);
            continue;
        };
        if c.state != "paused" {
            unmark_frozen(k, id);
            continue;
        }
        match k.backend.set_paused(&c.id, false).await {
            Ok(()) => {
                unmark_frozen(k, id);
                tracing::warn!(container = %c.name, "a container left frozen by a fork's copy was thawed")
            }
            Err(e) => {
                thaw_failed(k, id);
                tracing::error!(container = %c.name, %e, "a frozen container could not be thawed")
            }
        }
    }
}

/// Why a run's view cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// No such run.
    #[error("no run {0}")]
    NoRun(String),
    /// In a cluster, its workspace is on another node (or none can take
    /// its tree).
    #[error("run {0}'s workspace is on node {1:?}, not this one")]
    Elsewhere(String, Option<String>),
    /// The control plane failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Its container could not be had.
    #[error(transparent)]
    Sandbox(#[from] sandbox::SandboxError),
    /// The view could not be opened.
    #[error(transparent)]
    Files(#[from] sandbox::files::FileError),
}

/// The files API's view of a run (SPEC §26): its container (made, or
/// adopted from the pool, as a first op would), whose file system is the
/// view (under gVisor, its root file system and mounts on the host),
/// with its `.ops` and the run user (the owner of its `/scratch`). The
/// guard keeps the reaper off the container while the call uses it.
pub async fn view_of(
    k: &Kernel,
    run: &str,
) -> Result<(sandbox::files::View, tokio::sync::OwnedRwLockReadGuard<()>), ViewError> {
    let meta = k
        .run_meta(run)
        .await?
        .ok_or_else(|| ViewError::NoRun(run.to_owned()))?;
    let identity = k.run_identity(run, &meta.profile)?;
    // in a cluster, only the tree's node holds its workspace (a call is
    // relayed there; one that raced a move of the tree is refused)
    if let Some(me) = &k.node {
        let there = k.store.workspace_node(run).await?;
        if there.as_deref() != Some(me.config.name.as_str()) {
            return Err(ViewError::Elsewhere(run.to_owned(), there));
        }
    }
    let gate = k.launch_gate(run).await;
    let info = k.ensure_container(&identity, &meta.profile).await?;
    let root = k.backend.files_root(&info.id).await?;
    let scratch = k.config.scratch_root().join(&identity.scratch_key);
    let owner = std::fs::metadata(&scratch).map_err(|e| sandbox::files::FileError::Io {
        path: scratch.display().to_string(),
        source: e,
    })?;
    use std::os::unix::fs::MetadataExt;
    let user = sandbox::RunUser {
        uid: owner.uid(),
        gid: owner.gid(),
    };
    let ops = k.backend.ops_dir(&identity.scratch_key);
    let view = sandbox::files::View::open(&root, ops.path(), user)?;
    Ok((view, gate))
}
