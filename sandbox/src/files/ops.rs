//! One file or directory at a time: read, list, write (whole, through a
//! temporary name renamed into place) and remove. Each runs on a thread
//! acting as the run user ([`super::as_user`]).

use std::ffi::CStr;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::walk::{self, How};
use super::{FileError, FileResult, View};

/// A file opened for reading, with what the answer tells about it.
#[derive(Debug)]
pub struct Opened {
    /// The open file.
    pub file: std::fs::File,
    /// Its size when opened, bytes.
    pub size: u64,
    /// Its mode bits.
    pub mode: u32,
    /// Last modification, unix seconds.
    pub modified: i64,
}

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed in a listing).
    Symlink,
    /// Anything else (a FIFO, a socket, a device).
    Other,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its name in the directory.
    pub name: String,
    /// What it is.
    pub kind: EntryType,
    /// Size in bytes (a link's: its target's length).
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Last modification, unix seconds.
    pub modified: i64,
}

pub(crate) fn kind_of(st: &libc::stat64) -> EntryType {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => EntryType::File,
        libc::S_IFDIR => EntryType::Dir,
        libc::S_IFLNK => EntryType::Symlink,
        _ => EntryType::Other,
    }
}

/// Opens the regular file at `path` for reading (links followed inside
/// the view).
pub fn read(view: &View, path: &str) -> FileResult<Opened> {
    let place = view.resolve(
        path,
        How {
            follow_last: true,
            make_parents: false,
            write: false,
        },
    )?;
    let Some(name) = &place.name else {
        return Err(FileError::WrongType(format!(
            "{}: a directory",
            place.shown
        )));
    };
    let fd = walk::open_at(place.dir(view), name, libc::O_RDONLY | libc::O_NONBLOCK, 0)
        .map_err(|e| FileError::os(&place.shown, e))?;
    let st = walk::fstat(fd.as_raw_fd()).map_err(|e| FileError::os(&place.shown, e))?;
    match kind_of(&st) {
        EntryType::File => {}
        EntryType::Dir => {
            return Err(FileError::WrongType(format!(
                "{}: a directory (list it with a trailing /)",
                place.shown
            )))
        }
        _ => {
            return Err(FileError::WrongType(format!(
                "{}: not a regular file",
                place.shown
            )))
        }
    }
    Ok(Opened {
        file: std::fs::File::from(fd),
        size: st.st_size.max(0) as u64,
        mode: st.st_mode & 0o7777,
        modified: st.st_mtime,
    })
}

/// The entries of the directory at `path`, by name (`.ops` left out).
pub fn list(view: &View, path: &str) -> FileResult<Vec<Entry>> {
    let place = view.resolve(
        path,
        How {
            follow_last: true,
            make_parents: false,
            write: false,
        },
    )?;
    let dir = view.open_dir(&place)?;
    let mut out = Vec::new();
    for name in dir_names(&dir, &place.shown)? {
        let Ok(st) = walk::lstat_at(dir.as_raw_fd(), &name) else {
            continue;
        };
        if kind_of(&st) == EntryType::Dir && (st.st_dev, st.st_ino) == view.ops {
            continue;
        }
        out.push(Entry {
            name: name.to_string_lossy().into_owned(),
            kind: kind_of(&st),
            size: st.st_size.max(0) as u64,
            mode: st.st_mode & 0o7777,
            modified: st.st_mtime,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The names in an open directory (without `.` and `..`).
pub(crate) fn dir_names(dir: &OwnedFd, shown: &str) -> FileResult<Vec<std::ffi::CString>> {
    // SAFETY: a duplicate the stream owns and closes
    let dup = unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(FileError::os(shown, std::io::Error::last_os_error()));
    }
    // SAFETY: a valid descriptor, owned by the stream from here on
    let stream = unsafe { libc::fdopendir(dup) };
    if stream.is_null() {
        let e = std::io::Error::last_os_error();
        // SAFETY: not taken by a stream
        unsafe { libc::close(dup) };
        return Err(FileError::os(shown, e));
    }
    let mut names = Vec::new();
    loop {
        // SAFETY: a valid stream; the entry is read before the next call
        let entry = unsafe { libc::readdir64(stream) };
        if entry.is_null() {
            break;
        }
        // SAFETY: readdir's entry holds a NUL-terminated name
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    // SAFETY: the stream made above, closed once
    unsafe { libc::closedir(stream) };
    Ok(names)
}

/// Writes `body` to `path` (parents made), at most `max` bytes, as a new
/// file of `mode` renamed over whatever was there: a reader never sees
/// half a file, and a failed write leaves the old one. Returns the bytes.
pub fn write(view: &View, path: &str, mode: u32, body: &mut dyn Read, max: u64) -> FileResult<u64> {
    write_at(view, path, mode, None, body, max)
}

/// [`write`], with the file's modification time (unix seconds) when given.
pub(crate) fn write_at(
    view: &View,
    path: &str,
    mode: u32,
    mtime: Option<u64>,
    body: &mut dyn Read,
    max: u64,
) -> FileResult<u64> {
    let place = view.resolve(
        path,
        How {
            follow_last: true,
            make_parents: true,
            write: true,
        },
    )?;
    let Some(name) = place.name.clone() else {
        return Err(FileError::WrongType(format!(
            "{}: a directory",
            place.shown
        )));
    };
    let dir = place.dir(view);
    if let Ok(st) = walk::lstat_at(dir, &name) {
        if kind_of(&st) == EntryType::Dir {
            return Err(FileError::WrongType(format!(
                "{}: a directory",
                place.shown
            )));
        }
    }
    let temp = walk::c_name(
        format!(".opkernel-upload-{}", uuid::Uuid::new_v4().simple()).as_bytes(),
        &place.shown,
    )?;
    let fd = walk::open_at(
        dir,
        &temp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o600,
    )
    .map_err(|e| FileError::os(&place.shown, e))?;
    let mut file = std::fs::File::from(fd);
    let written = copy_bounded(body, &mut file, max, &place.shown).and_then(|n| {
        set_mode(file.as_raw_fd(), mode, &place.shown)?;
        if let Some(mtime) = mtime {
            set_mtime(file.as_raw_fd(), mtime);
        }
        rename_at(dir, &temp, &name, &place.shown)?;
        Ok(n)
    });
    if written.is_err() {
        // SAFETY: a valid descriptor and C string
        unsafe { libc::unlinkat(dir, temp.as_ptr(), 0) };
    }
    written
}

/// Copies `from` into `to`, failing past `max` bytes.
pub(crate) fn copy_bounded(
    from: &mut dyn Read,
    to: &mut dyn Write,
    max: u64,
    shown: &str,
) -> FileResult<u64> {
    let mut buf = vec![0u8; 256 << 10];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FileError::Aborted(e.to_string())),
        };
        total += n as u64;
        if total > max {
            return Err(FileError::TooLarge(max));
        }
        to.write_all(&buf[..n])
            .map_err(|e| FileError::os(shown, e))?;
    }
}

pub(crate) fn set_mode(fd: RawFd, mode: u32, shown: &str) -> FileResult<()> {
    // set-id bits never travel: a written file is the command's own
    // SAFETY: a valid descriptor
    if unsafe { libc::fchmod(fd, mode & 0o1777) } != 0 {
        return Err(FileError::os(shown, std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Sets a file's modification (and access) time; best effort.
fn set_mtime(fd: RawFd, mtime: u64) {
    let t = libc::timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(i64::MAX) as libc::time_t,
        tv_nsec: 0,
    };
    // SAFETY: a valid descriptor and two timespecs
    unsafe { libc::futimens(fd, [t, t].as_ptr()) };
}

fn rename_at(dir: RawFd, from: &CStr, to: &CStr, shown: &str) -> FileResult<()> {
    // SAFETY: a valid descriptor and C strings
    if unsafe { libc::renameat(dir, from.as_ptr(), dir, to.as_ptr()) } != 0 {
        return Err(FileError::os(shown, std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Removes the file, link or directory at `path` (a link itself, never its
/// target); a directory with entries only when `recursive`.
pub fn remove(view: &View, path: &str, recursive: bool) -> FileResult<()> {
    let place = view.resolve(
        path,
        How {
            write: true,
            ..How::default()
        },
    )?;
    let Some(name) = &place.name else {
        return Err(FileError::Denied(format!(
            "{}: the root of the view",
            place.shown
        )));
    };
    let dir = place.dir(view);
    let st = walk::lstat_at(dir, name).map_err(|e| FileError::os(&place.shown, e))?;
    if kind_of(&st) != EntryType::Dir {
        return unlink(dir, name, 0, &place.shown);
    }
    if recursive {
        let sub = view.open_dir(&place)?;
        empty_dir(view, &sub, &place.shown)?;
    }
    unlink(dir, name, libc::AT_REMOVEDIR, &place.shown)
}

/// Removes everything in an open directory (never following a link,
/// never entering `.ops`).
fn empty_dir(view: &View, dir: &OwnedFd, shown: &str) -> FileResult<()> {
    for name in dir_names(dir, shown)? {
        let here = format!("{shown}/{}", name.to_string_lossy());
        let Ok(st) = walk::lstat_at(dir.as_raw_fd(), &name) else {
            continue;
        };
        if kind_of(&st) == EntryType::Dir {
            let sub = walk::open_at(
                dir.as_raw_fd(),
                &name,
                libc::O_RDONLY | libc::O_DIRECTORY,
                0,
            )
            .map_err(|e| FileError::os(&here, e))?;
            if view.is_ops(&sub) {
                return Err(walk::ops_refused(&here));
            }
            empty_dir(view, &sub, &here)?;
            unlink(dir.as_raw_fd(), &name, libc::AT_REMOVEDIR, &here)?;
        } else {
            unlink(dir.as_raw_fd(), &name, 0, &here)?;
        }
    }
    Ok(())
}

fn unlink(dir: RawFd, name: &CStr, flags: i32, shown: &str) -> FileResult<()> {
    // SAFETY: a valid descriptor and C string
    if unsafe { libc::unlinkat(dir, name.as_ptr(), flags) } != 0 {
        return Err(FileError::os(shown, std::io::Error::last_os_error()));
    }
    Ok(())
}
