//! Whole workspaces copied on the host, for forks and snapshots (SPEC
//! §26): a run's scratch dir without its `.ops`, owners, modes and times
//! kept, links copied as links (never followed), FIFOs, sockets and
//! devices left out. Each file is cloned (`FICLONE`, a reflink) where the
//! file system can, else copied in the kernel (`copy_file_range`).

use std::ffi::CStr;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use super::ops::{dir_names, kind_of, EntryType};
use super::walk;

/// What a copy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copied {
    /// Bytes of file content.
    pub bytes: u64,
    /// Files cloned by reflink (none on a file system without them).
    pub reflinked: u64,
    /// Files copied byte by byte.
    pub copied: u64,
}

/// Bounds of a copy: a deadline (a consistent fork keeps its source
/// frozen no longer than that) and a byte budget (a snapshot stays within
/// its chain's `disk_bytes` while it is made, not only once it is).
#[derive(Debug, Clone, Copy, Default)]
pub struct CopyBounds {
    /// Give up (`TimedOut`) once it passes, checked between files and
    /// between chunks of one.
    pub deadline: Option<std::time::Instant>,
    /// Give up (`FileTooLarge`) before file content past it is written.
    pub max_bytes: Option<u64>,
}

impl CopyBounds {
    fn check(&self, done: &Copied, next: u64) -> std::io::Result<()> {
        if self.deadline.is_some_and(|d| std::time::Instant::now() > d) {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        if self
            .max_bytes
            .is_some_and(|max| done.bytes.saturating_add(next) > max)
        {
            return Err(std::io::ErrorKind::FileTooLarge.into());
        }
        Ok(())
    }
}

/// Copies the directory `from` into `to` (made, mode of `from`; must not
/// exist), leaving out a top-level `.ops`.
pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<Copied> {
    copy_tree_within(from, to, CopyBounds::default())
}

/// [`copy_tree`] within `bounds`.
pub fn copy_tree_within(from: &Path, to: &Path, bounds: CopyBounds) -> std::io::Result<Copied> {
    let from = std::fs::canonicalize(from)?;
    let src = walk::open_path(&from.display().to_string())?;
    let src = walk::open_at(src.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    let st = walk::fstat(src.as_raw_fd())?;
    std::fs::create_dir(to)?;
    let dst = walk::open_path(&to.display().to_string())?;
    let dst = walk::open_at(dst.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    let mut done = Copied::default();
    copy_dir(&src, &dst, true, &mut done, bounds)?;
    keep_owner_mode_times(dst.as_raw_fd(), &st)?;
    Ok(done)
}

fn copy_dir(
    src: &OwnedFd,
    dst: &OwnedFd,
    top: bool,
    done: &mut Copied,
    bounds: CopyBounds,
) -> std::io::Result<()> {
    let names = dir_names(src, "").map_err(std::io::Error::other)?;
    for name in names {
        bounds.check(done, 0)?;
        if top && name.as_bytes() == b".ops" {
            continue;
        }
        let Ok(st) = walk::lstat_at(src.as_raw_fd(), &name) else {
            continue;
        };
        match kind_of(&st) {
            EntryType::Dir => {
                let from = walk::open_at(
                    src.as_raw_fd(),
                    &name,
                    libc::O_RDONLY | libc::O_DIRECTORY,
                    0,
                )?;
                // SAFETY: a valid descriptor and C string
                if unsafe { libc::mkdirat(dst.as_raw_fd(), name.as_ptr(), 0o700) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let to = walk::open_at(
                    dst.as_raw_fd(),
                    &name,
                    libc::O_RDONLY | libc::O_DIRECTORY,
                    0,
                )?;
                copy_dir(&from, &to, false, done, bounds)?;
                keep_owner_mode_times(to.as_raw_fd(), &st)?;
            }
            EntryType::File => copy_file(src.as_raw_fd(), dst.as_raw_fd(), &name, done, bounds)?,
            EntryType::Symlink => copy_link(src.as_raw_fd(), dst.as_raw_fd(), &name, &st)?,
            EntryType::Other => {}
        }
    }
    Ok(())
}

/// A chunk of a byte-by-byte copy: the bounds are checked between two.
const CHUNK: u64 = 8 << 20;

fn copy_file(
    src: RawFd,
    dst: RawFd,
    name: &CStr,
    done: &mut Copied,
    bounds: CopyBounds,
) -> std::io::Result<()> {
    let from = walk::open_at(src, name, libc::O_RDONLY | libc::O_NONBLOCK, 0)?;
    let st = walk::fstat(from.as_raw_fd())?;
    if kind_of(&st) != EntryType::File {
        return Ok(());
    }
    let size = st.st_size.max(0) as u64;
    bounds.check(done, size)?;
    let to = walk::open_at(
        dst,
        name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o600,
    )?;
    // SAFETY: two valid descriptors; FICLONE takes the source's
    let cloned = unsafe { libc::ioctl(to.as_raw_fd(), libc::FICLONE, from.as_raw_fd()) } == 0;
    if cloned {
        done.reflinked += 1;
    } else {
        let mut from = std::fs::File::from(from);
        let mut to_file = std::fs::File::from(to.try_clone()?);
        // the standard library copies file to file with copy_file_range;
        // by chunks, so a deadline holds inside a large file too, and a
        // file that grows meanwhile stays within the budget
        let mut copied = 0u64;
        loop {
            let n = std::io::copy(&mut (&mut from).take(CHUNK), &mut to_file)?;
            copied += n;
            if n < CHUNK {
                break;
            }
            bounds.check(done, copied.max(size))?;
        }
        done.copied += 1;
        done.bytes += copied;
        return keep_owner_mode_times(to.as_raw_fd(), &st);
    }
    done.bytes += size;
    keep_owner_mode_times(to.as_raw_fd(), &st)
}

fn copy_link(src: RawFd, dst: RawFd, name: &CStr, st: &libc::stat64) -> std::io::Result<()> {
    let target = walk::read_link_at(src, name)?;
    let target = std::ffi::CString::new(target).map_err(std::io::Error::other)?;
    // SAFETY: valid C strings and descriptor
    if unsafe { libc::symlinkat(target.as_ptr(), dst, name.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a valid descriptor and C string; the link itself is changed
    unsafe {
        libc::fchownat(
            dst,
            name.as_ptr(),
            st.st_uid,
            st.st_gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    Ok(())
}

/// The copy gets its source's owner, mode (set-id bits dropped) and times.
fn keep_owner_mode_times(fd: RawFd, st: &libc::stat64) -> std::io::Result<()> {
    // SAFETY: plain calls on a valid descriptor
    unsafe {
        if libc::fchown(fd, st.st_uid, st.st_gid) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::fchmod(fd, st.st_mode & 0o1777) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let times = [
            libc::timespec {
                tv_sec: st.st_atime,
                tv_nsec: st.st_atime_nsec,
            },
            libc::timespec {
                tv_sec: st.st_mtime,
                tv_nsec: st.st_mtime_nsec,
            },
        ];
        libc::futimens(fd, times.as_ptr());
    }
    Ok(())
}
