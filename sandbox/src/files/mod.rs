//! The run's workspace as its commands see it (SPEC §26): files read,
//! written, listed and removed, directories moved as tar streams, and
//! workspaces copied for forks and snapshots.
//!
//! The I/O happens on the host, in the kernel's process, through the run
//! container's root (`/proc/<init pid>/root`; under gVisor its root file
//! system and mounts, see `mounts`), never by a command in the container. Two rules keep it inside the run's own view:
//!
//! - every path is resolved here, one component at a time, relative to
//!   directory descriptors already open (`openat` with `O_NOFOLLOW`); a
//!   symlink is read and its target resolved again from the container's
//!   root (an absolute target) or from where it was (a relative one), and
//!   `..` never climbs above that root. No path the kernel hands to the
//!   operating system can follow a link or climb out, whatever a command
//!   renames meanwhile;
//! - every directory opened is compared with the run's `.ops` (device and
//!   inode): the files API never reads or writes it, directly or through a
//!   link.
//!
//! The opening and creating is done on a thread of its own whose file
//! system identity is the run user's (`setfsuid`, `setfsgid` and its
//! groups): the kernel reads only what a command could read, and what it
//! writes belongs to the command's uid.

mod archive;
mod chan;
mod mounts;
mod ops;
mod tree;
mod walk;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

pub use archive::{pack, unpack, Unpacked};
pub use chan::{ChannelReader, ChannelWriter};
pub use mounts::{Mount, Reach, Root};
pub use ops::{list, read, remove, write, Entry, EntryType, Opened};
pub use tree::{copy_tree, copy_tree_within, Copied, CopyBounds};

/// Why a files call failed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Nothing at that path.
    #[error("no such file or directory: {0}")]
    NotFound(String),
    /// The run user may not read or write it (or the file system is
    /// read-only there).
    #[error("{0}")]
    Denied(String),
    /// The path leads somewhere the files API never goes (the run's
    /// `.ops`), or through too many links.
    #[error("{0}")]
    Refused(String),
    /// A directory where a file was wanted, or the other way round, or a
    /// kind of file the API does not move.
    #[error("{0}")]
    WrongType(String),
    /// A directory that is not empty (and no `recursive`).
    #[error("directory not empty: {0}")]
    NotEmpty(String),
    /// More than the allowed bytes.
    #[error("larger than the limit of {0} bytes")]
    TooLarge(u64),
    /// A malformed path, mode or archive.
    #[error("{0}")]
    Invalid(String),
    /// The body being written stopped before its end.
    #[error("the upload ended early: {0}")]
    Aborted(String),
    /// Anything else the operating system answered.
    #[error("{path}: {source}")]
    Io {
        /// The container path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// A files call's result.
pub type FileResult<T> = std::result::Result<T, FileError>;

impl FileError {
    /// The error of an operating-system call on `path`, by kind.
    pub(crate) fn os(path: &str, e: std::io::Error) -> FileError {
        match e.raw_os_error() {
            Some(libc::ENOENT) => FileError::NotFound(path.to_owned()),
            Some(libc::EACCES | libc::EPERM | libc::EROFS) => {
                FileError::Denied(format!("{path}: {e}"))
            }
            Some(libc::ENOTDIR | libc::EISDIR) => FileError::WrongType(format!("{path}: {e}")),
            Some(libc::ENOTEMPTY) => FileError::NotEmpty(path.to_owned()),
            Some(libc::ENAMETOOLONG | libc::EINVAL) => FileError::Invalid(format!("{path}: {e}")),
            Some(libc::ELOOP) => FileError::Refused(format!("{path}: too many links")),
            Some(libc::EFBIG | libc::ENOSPC | libc::EDQUOT) => {
                FileError::Denied(format!("{path}: {e}"))
            }
            _ => FileError::Io {
                path: path.to_owned(),
                source: e,
            },
        }
    }
}

/// A run container's file system as its commands see it, opened for one
/// files call.
#[derive(Debug)]
pub struct View {
    /// The container's root directory (`O_PATH`).
    root: OwnedFd,
    /// Device and inode of the run's `.ops`: never entered.
    ops: (u64, u64),
    /// Who the files are read and written as.
    pub user: crate::RunUser,
    /// Why the root file system is not written through this view, when it
    /// is not (a mapped view's, see [`Root::Mapped`]).
    root_read_only: Option<&'static str>,
    /// A mapped view's mounts.
    mounts: Vec<mounts::Mounted>,
}

impl View {
    /// The view whose root is the host directory `root` (a container's
    /// `/proc/<pid>/root`, or a plain directory in tests).
    pub fn open_root(root: &str, ops_dir: &Path, user: crate::RunUser) -> FileResult<View> {
        let root = walk::open_path(root).map_err(|e| FileError::Io {
            path: format!("the container's root ({root})"),
            source: e,
        })?;
        let ops = std::fs::metadata(ops_dir).map_err(|e| FileError::Io {
            path: ops_dir.display().to_string(),
            source: e,
        })?;
        use std::os::unix::fs::MetadataExt;
        Ok(View {
            root,
            ops: (ops.dev(), ops.ino()),
            user,
            root_read_only: None,
            mounts: Vec::new(),
        })
    }

    /// Whether an open directory is the run's `.ops`.
    pub(crate) fn is_ops(&self, fd: &OwnedFd) -> bool {
        walk::identity(fd.as_raw_fd()).is_ok_and(|id| id == self.ops)
    }
}

/// Runs `f` on a new thread acting on files as `user` (its file system
/// uid, gid and only group); the thread ends with `f`, so the identity
/// never leaks into another task. Root is kept as is.
pub fn as_user<R, F>(user: crate::RunUser, f: F) -> std::thread::JoinHandle<FileResult<R>>
where
    R: Send + 'static,
    F: FnOnce() -> FileResult<R> + Send + 'static,
{
    std::thread::spawn(move || {
        become_user(user)?;
        f()
    })
}

/// Turns the calling thread's file system identity into `user`'s.
fn become_user(user: crate::RunUser) -> FileResult<()> {
    if user.uid == 0 {
        return Ok(());
    }
    let gid = user.gid as libc::gid_t;
    // the raw system call: it changes this thread's groups alone (the C
    // library's wrapper would change every thread's)
    // SAFETY: a valid pointer to one gid, for the call's duration
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, 1usize, &gid as *const libc::gid_t) };
    let refused = |what: &str| {
        FileError::Denied(format!(
            "the kernel cannot act on files as uid {} ({what}): it must run as root",
            user.uid
        ))
    };
    if rc != 0 {
        return Err(refused("setgroups"));
    }
    // SAFETY: plain system calls on this thread's credentials
    unsafe {
        libc::setfsgid(gid);
        libc::setfsuid(user.uid as libc::uid_t);
        // each answers the identity in force: check both took
        if libc::setfsgid(u32::MAX) as u32 != gid || libc::setfsuid(u32::MAX) as u32 != user.uid {
            return Err(refused("setfsuid"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
