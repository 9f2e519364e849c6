//! A view assembled from a container's root file system and its mounts,
//! for a container whose processes the host cannot see into (gVisor,
//! SPEC §30): `/proc/<pid>/root` of a gVisor sandbox is the sandbox's own
//! empty root, not the container's.
//!
//! Each mount is mapped to the host directory behind it (a bind mount such
//! as `/scratch`), or refused with its reason (a file system that lives
//! inside the sandbox, such as gVisor's `/tmp`). The root file system is
//! read here but never written: gVisor caches it (its directory entries
//! too) and would not see a file made or removed from outside, so a write
//! there would be one the command never sees. Writes go to the mounts.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::walk::{self, Place};
use super::{FileError, FileResult, View};

/// Where a container's file system is on the host.
#[derive(Debug, Clone)]
pub enum Root {
    /// Its main process's root (`/proc/<pid>/root`): the container's own
    /// view, mounts and all (runc).
    Proc(i64),
    /// Its root file system on the host (read only through this view) and
    /// its mounts (gVisor).
    Mapped {
        /// The root file system's host directory.
        rootfs: PathBuf,
        /// The container's mounts.
        mounts: Vec<Mount>,
    },
}

/// One mount of a mapped view.
#[derive(Debug, Clone)]
pub struct Mount {
    /// The container path it is mounted at.
    pub at: String,
    /// What is behind it.
    pub reach: Reach,
}

/// What is behind a mount, as the files API reaches it.
#[derive(Debug, Clone)]
pub enum Reach {
    /// A host directory (a bind mount).
    Host {
        /// The directory.
        dir: PathBuf,
        /// Whether it is mounted read-write.
        writable: bool,
    },
    /// Nothing the host can reach, with the reason given to the caller.
    Unreachable(String),
}

/// Why the files API does not write a gVisor container's root file system.
const ROOTFS_READ_ONLY: &str = "outside /scratch, a gVisor run's files are read only through \
     the files API (gVisor caches its root file system and would not see a change made from \
     outside): write under /scratch";

/// A mount of an open view.
#[derive(Debug)]
pub(crate) struct Mounted {
    /// Its container path, by component.
    at: Vec<Vec<u8>>,
    /// The host directory (`O_PATH`) and whether it is writable, or why it
    /// cannot be reached.
    reach: Result<(OwnedFd, bool), String>,
}

/// Which file system a directory of a place is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Area {
    /// The view's root file system.
    Root,
    /// The view's mount of that index.
    Mount(usize),
}

impl View {
    /// The view of a container's file system at `root`, with the run's
    /// `.ops` at `ops_dir` (host path) and files owned by `user`.
    pub fn open(root: &Root, ops_dir: &Path, user: crate::RunUser) -> FileResult<View> {
        match root {
            Root::Proc(pid) => View::open_root(&format!("/proc/{pid}/root"), ops_dir, user),
            Root::Mapped { rootfs, mounts } => {
                let mut view = View::open_root(&rootfs.to_string_lossy(), ops_dir, user)?;
                view.root_read_only = Some(ROOTFS_READ_ONLY);
                view.mounts = mounts.iter().map(open_mount).collect();
                Ok(view)
            }
        }
    }

    /// The mount at exactly the container path `at` (by component).
    pub(crate) fn mount_at(&self, at: &[Vec<u8>]) -> Option<usize> {
        self.mounts.iter().position(|m| m.at == at)
    }

    /// Opens the root directory of mount `i` (`O_PATH`), refusing one
    /// that cannot be reached or is the run's `.ops`.
    pub(crate) fn enter_mount(&self, i: usize, shown: &str) -> FileResult<OwnedFd> {
        let (fd, _) = self.mounts[i]
            .reach
            .as_ref()
            .map_err(|why| FileError::Refused(format!("{shown}: {why}")))?;
        let fd = fd.try_clone().map_err(|e| FileError::os(shown, e))?;
        if self.is_ops(&fd) {
            return Err(walk::ops_refused(shown));
        }
        Ok(fd)
    }

    /// Whether a directory in `area` may be written, and why not.
    pub(crate) fn may_write(&self, area: Area, shown: &str) -> FileResult<()> {
        match area {
            Area::Root => match self.root_read_only {
                Some(why) => Err(FileError::Denied(format!("{shown}: {why}"))),
                None => Ok(()),
            },
            Area::Mount(i) => match &self.mounts[i].reach {
                Ok((_, true)) => Ok(()),
                _ => Err(FileError::Denied(format!("{shown}: a read-only mount"))),
            },
        }
    }

    /// Whether the place's directory may be written.
    pub(crate) fn may_write_at(&self, place: &Place) -> FileResult<()> {
        self.may_write(place.area(), &place.shown)
    }

    /// The directory of mount `i` opened for reading its entries, or
    /// `None` when it cannot be reached (a directory listing or archive
    /// leaves it out).
    pub(crate) fn read_mount(&self, i: usize) -> Option<OwnedFd> {
        let (fd, _) = self.mounts[i].reach.as_ref().ok()?;
        let dir =
            walk::open_at(fd.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0).ok()?;
        (!self.is_ops(&dir)).then_some(dir)
    }
}

fn open_mount(m: &Mount) -> Mounted {
    let at = components(&m.at);
    let reach = match &m.reach {
        Reach::Unreachable(why) => Err(why.clone()),
        Reach::Host { dir, writable } => walk::open_path(&dir.to_string_lossy())
            .map(|fd| (fd, *writable))
            .map_err(|e| format!("its mount cannot be opened on the host: {e}")),
    };
    Mounted { at, reach }
}

/// A container path by component (`.` and empty ones left out).
pub(crate) fn components(path: &str) -> Vec<Vec<u8>> {
    path.as_bytes()
        .split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
        .collect()
}

#[cfg(test)]
#[path = "mounts_tests.rs"]
mod tests;
