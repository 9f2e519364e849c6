//! Path resolution inside a run's view, one component at a time from
//! descriptors already open; links are read and resolved here, never by
//! the operating system (see the module above).

use std::collections::VecDeque;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::mounts::Area;
use super::{FileError, FileResult, View};

/// Links followed while resolving one path (as Linux's own bound).
const MAX_LINKS: usize = 40;

/// A path's place: the directory it is in (open) and its last name (`None`
/// for the view's root, a mount's root, or a path naming a directory by `/`
/// or `..`).
#[derive(Debug)]
pub(crate) struct Place {
    /// The directories from the root down to the parent (empty: the root).
    dirs: Vec<Dir>,
    /// The last component, when the path has one.
    pub name: Option<CString>,
    /// The path as written (for messages).
    pub shown: String,
}

/// One directory on a place's way down.
#[derive(Debug)]
struct Dir {
    /// The directory (`O_PATH`).
    fd: OwnedFd,
    /// Its name in its parent (as the container sees it).
    name: Vec<u8>,
    /// The file system it is on.
    area: Area,
}

/// How to resolve.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct How {
    /// Follow a link in the last component.
    pub follow_last: bool,
    /// Create missing directories on the way (as the thread's user).
    pub make_parents: bool,
    /// The place is to be written (made, replaced or removed): refused
    /// where the view does not write.
    pub write: bool,
}

impl Place {
    /// The descriptor of the directory holding [`Place::name`] (or of the
    /// place itself when it has no name).
    pub fn dir<'a>(&'a self, view: &'a View) -> RawFd {
        self.dirs
            .last()
            .map_or(view.root.as_raw_fd(), |d| d.fd.as_raw_fd())
    }

    /// The file system of [`Place::dir`].
    pub fn area(&self) -> Area {
        self.dirs.last().map_or(Area::Root, |d| d.area)
    }

    /// The container path of [`Place::dir`], by component.
    pub fn at(&self) -> Vec<Vec<u8>> {
        self.dirs.iter().map(|d| d.name.clone()).collect()
    }

    /// The container path of the place itself, by component.
    pub fn full(&self) -> Vec<Vec<u8>> {
        let mut at = self.at();
        at.extend(self.name.as_ref().map(|n| n.as_bytes().to_vec()));
        at
    }

    fn push(&mut self, fd: OwnedFd, name: Vec<u8>, area: Area) {
        self.dirs.push(Dir { fd, name, area });
    }
}

/// Opens `path` (a host path the kernel chose) as an `O_PATH` directory.
pub(crate) fn open_path(path: &str) -> std::io::Result<OwnedFd> {
    let c = CString::new(path).map_err(std::io::Error::other)?;
    // SAFETY: a valid C string; the result is checked
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    owned(fd)
}

/// An owned descriptor, or the error of the call that made it.
pub(crate) fn owned(fd: RawFd) -> std::io::Result<OwnedFd> {
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just returned to us and owned by no one else
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Device and inode of an open file.
pub(crate) fn identity(fd: RawFd) -> std::io::Result<(u64, u64)> {
    let st = fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// `fstat`.
pub(crate) fn fstat(fd: RawFd) -> std::io::Result<libc::stat64> {
    // SAFETY: zeroed plain data filled by the call
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and buffer
    if unsafe { libc::fstat64(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// `fstatat` without following a link.
pub(crate) fn lstat_at(dir: RawFd, name: &CStr) -> std::io::Result<libc::stat64> {
    // SAFETY: zeroed plain data filled by the call
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor, C string and buffer
    let rc = unsafe { libc::fstatat64(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// `openat` with `O_NOFOLLOW | O_CLOEXEC` added.
pub(crate) fn open_at(dir: RawFd, name: &CStr, flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: a valid descriptor and C string; the result is checked
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    owned(fd)
}

/// The target of the link `name` in `dir`.
pub(crate) fn read_link_at(dir: RawFd, name: &CStr) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: a valid descriptor, C string and buffer of that length
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// A path component as a C string (no NUL inside).
pub(crate) fn c_name(name: &[u8], shown: &str) -> FileResult<CString> {
    CString::new(name).map_err(|_| FileError::Invalid(format!("{shown}: a NUL in the path")))
}

fn is_dir(st: &libc::stat64) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

fn is_link(st: &libc::stat64) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

fn components(path: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    path.split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
}

impl View {
    /// Resolves `path` (a container path, `/` or not in front) to its place.
    pub(crate) fn resolve(&self, path: &str, how: How) -> FileResult<Place> {
        let place = self.walk(path, how)?;
        if how.write {
            self.may_write_at(&place)?;
        }
        Ok(place)
    }

    fn walk(&self, path: &str, how: How) -> FileResult<Place> {
        let mut todo: VecDeque<Vec<u8>> = components(path.as_bytes()).collect();
        let mut place = Place {
            dirs: Vec::new(),
            name: None,
            shown: format!("/{}", path.trim_start_matches('/')),
        };
        let mut links = 0;
        while let Some(part) = todo.pop_front() {
            if part == b".." {
                place.dirs.pop();
                continue;
            }
            let name = c_name(&part, &place.shown)?;
            let last = todo.is_empty();
            let mut at = place.at();
            at.push(part.clone());
            if let Some(i) = self.mount_at(&at) {
                // a mount: its host directory, not the one under it
                let fd = self.enter_mount(i, &place.shown)?;
                place.push(fd, part, Area::Mount(i));
                continue;
            }
            let dir = place.dir(self);
            let area = place.area();
            let st = match lstat_at(dir, &name) {
                Ok(st) => st,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && last => {
                    place.name = Some(name);
                    return Ok(place);
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && how.make_parents => {
                    self.may_write(area, &place.shown)?;
                    self.make_dir(dir, &name, &place.shown)?;
                    let fd = self.enter(dir, &name, &place.shown)?;
                    place.push(fd, part, area);
                    continue;
                }
                Err(e) => return Err(FileError::os(&place.shown, e)),
            };
            if is_link(&st) && (!last || how.follow_last) {
                links += 1;
                if links > MAX_LINKS {
                    return Err(FileError::Refused(format!(
                        "{}: more than {MAX_LINKS} links",
                        place.shown
                    )));
                }
                let target =
                    read_link_at(dir, &name).map_err(|e| FileError::os(&place.shown, e))?;
                if target.first() == Some(&b'/') {
                    place.dirs.clear();
                }
                for part in components(&target).collect::<Vec<_>>().into_iter().rev() {
                    todo.push_front(part);
                }
                continue;
            }
            if last {
                if is_dir(&st) {
                    // entered once to check it is not `.ops`
                    drop(self.enter(dir, &name, &place.shown)?);
                }
                place.name = Some(name);
                return Ok(place);
            }
            if !is_dir(&st) {
                return Err(FileError::WrongType(format!(
                    "{}: a path component is not a directory",
                    place.shown
                )));
            }
            let fd = self.enter(dir, &name, &place.shown)?;
            place.push(fd, part, area);
        }
        Ok(place)
    }

    /// Opens the directory `name` in `dir` (`O_PATH`), refusing `.ops`.
    pub(crate) fn enter(&self, dir: RawFd, name: &CStr, shown: &str) -> FileResult<OwnedFd> {
        let fd = open_at(dir, name, libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| FileError::os(shown, e))?;
        if self.is_ops(&fd) {
            return Err(ops_refused(shown));
        }
        Ok(fd)
    }

    /// Opens the directory a place names (its root when it has no name)
    /// for reading its entries, refusing `.ops`.
    pub(crate) fn open_dir(&self, place: &Place) -> FileResult<OwnedFd> {
        let name = place.name.clone().unwrap_or_else(|| c".".to_owned());
        let fd = open_at(
            place.dir(self),
            &name,
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )
        .map_err(|e| FileError::os(&place.shown, e))?;
        if self.is_ops(&fd) {
            return Err(ops_refused(&place.shown));
        }
        Ok(fd)
    }

    /// `mkdirat` (mode 0755, as the thread's user); one made meanwhile is
    /// fine.
    pub(crate) fn make_dir(&self, dir: RawFd, name: &CStr, shown: &str) -> FileResult<()> {
        // SAFETY: a valid descriptor and C string
        if unsafe { libc::mkdirat(dir, name.as_ptr(), 0o755) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(FileError::os(shown, e));
            }
        }
        Ok(())
    }
}

/// The refusal of a path that leads into `.ops`.
pub(crate) fn ops_refused(shown: &str) -> FileError {
    FileError::Refused(format!(
        "{shown}: leads into the run's .ops, which the files API never reads or writes"
    ))
}
