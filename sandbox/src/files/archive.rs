//! Directories moved as tar streams: packed from the view (links stored as
//! links, never followed; `.ops` left out) and unpacked into it, each
//! entry placed through the same resolution as a single file.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;

use super::ops::{dir_names, kind_of, set_mode, EntryType};
use super::walk::{self, How};
use super::{FileError, FileResult, View};

/// What an unpacked archive wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unpacked {
    /// Entries written (files, directories, links).
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

/// Writes the directory at `path` as a tar stream into `out` (entries
/// relative to it); returns the bytes of file content packed.
pub fn pack(view: &View, path: &str, out: &mut dyn Write) -> FileResult<u64> {
    let place = view.resolve(
        path,
        How {
            follow_last: true,
            make_parents: false,
            write: false,
        },
    )?;
    let dir = view.open_dir(&place)?;
    let mut builder = tar::Builder::new(out);
    let mut bytes = 0;
    let at = place.full();
    pack_dir(view, &mut builder, &dir, &at, "", &place.shown, &mut bytes)?;
    builder
        .into_inner()
        .and_then(|w| w.flush())
        .map_err(|e| FileError::Aborted(e.to_string()))?;
    Ok(bytes)
}

fn header_of(st: &libc::stat64, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(st.st_mode & 0o7777);
    h.set_uid(st.st_uid as u64);
    h.set_gid(st.st_gid as u64);
    h.set_mtime(st.st_mtime.max(0) as u64);
    h.set_size(0);
    h
}

/// Packs the entries of `dir`, whose container path is `at`.
fn pack_dir(
    view: &View,
    builder: &mut tar::Builder<&mut dyn Write>,
    dir: &OwnedFd,
    at: &[Vec<u8>],
    prefix: &str,
    shown: &str,
    bytes: &mut u64,
) -> FileResult<()> {
    let aborted = |e: std::io::Error| FileError::Aborted(e.to_string());
    let mut names = dir_names(dir, shown)?;
    names.sort();
    for name in names {
        let rel = format!("{prefix}{}", name.to_string_lossy());
        let here = format!("{shown}/{rel}");
        let Ok(st) = walk::lstat_at(dir.as_raw_fd(), &name) else {
            continue;
        };
        match kind_of(&st) {
            EntryType::Dir => {
                let mut sub_at = at.to_vec();
                sub_at.push(name.as_bytes().to_vec());
                let Some(sub) = open_sub(view, dir, &name, &sub_at, &here)? else {
                    continue;
                };
                let mut h = header_of(&st, tar::EntryType::Directory);
                builder
                    .append_data(&mut h, format!("{rel}/"), std::io::empty())
                    .map_err(aborted)?;
                pack_dir(
                    view,
                    builder,
                    &sub,
                    &sub_at,
                    &format!("{rel}/"),
                    shown,
                    bytes,
                )?;
            }
            EntryType::Symlink => {
                let target = walk::read_link_at(dir.as_raw_fd(), &name)
                    .map_err(|e| FileError::os(&here, e))?;
                let target = std::ffi::OsString::from_vec(target);
                let mut h = header_of(&st, tar::EntryType::Symlink);
                builder.append_link(&mut h, &rel, target).map_err(aborted)?;
            }
            EntryType::File => {
                let fd =
                    walk::open_at(dir.as_raw_fd(), &name, libc::O_RDONLY | libc::O_NONBLOCK, 0)
                        .map_err(|e| FileError::os(&here, e))?;
                let st = walk::fstat(fd.as_raw_fd()).map_err(|e| FileError::os(&here, e))?;
                if kind_of(&st) != EntryType::File {
                    continue;
                }
                let size = st.st_size.max(0) as u64;
                let mut h = header_of(&st, tar::EntryType::Regular);
                h.set_size(size);
                // exactly `size` bytes, whatever the file does meanwhile
                let body = std::fs::File::from(fd)
                    .take(size)
                    .chain(std::io::repeat(0))
                    .take(size);
                builder.append_data(&mut h, &rel, body).map_err(aborted)?;
                *bytes += size;
            }
            EntryType::Other => {}
        }
    }
    Ok(())
}

/// The subdirectory `name` of `dir` (at `at`) opened for reading: the
/// mount's directory when one is there, `None` for the run's `.ops` or a
/// mount the view cannot reach (left out).
fn open_sub(
    view: &View,
    dir: &OwnedFd,
    name: &std::ffi::CStr,
    at: &[Vec<u8>],
    here: &str,
) -> FileResult<Option<OwnedFd>> {
    if let Some(i) = view.mount_at(at) {
        return Ok(view.read_mount(i));
    }
    let sub = walk::open_at(dir.as_raw_fd(), name, libc::O_RDONLY | libc::O_DIRECTORY, 0)
        .map_err(|e| FileError::os(here, e))?;
    Ok((!view.is_ops(&sub)).then_some(sub))
}

/// Unpacks the tar stream `input` into the directory at `path` (made when
/// missing), at most `max` bytes of file content. Entries with an
/// absolute path or a `..`, hard links and devices are refused, naming the
/// entry; entries before it stay written.
pub fn unpack(view: &View, path: &str, input: &mut dyn Read, max: u64) -> FileResult<Unpacked> {
    let base = format!("{}/", path.trim_end_matches('/'));
    ensure_dir(view, &base)?;
    let mut archive = tar::Archive::new(input);
    let mut done = Unpacked::default();
    let entries = archive
        .entries()
        .map_err(|e| FileError::Invalid(format!("not a tar stream: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| FileError::Invalid(format!("a bad tar entry: {e}")))?;
        let raw = entry.path_bytes().into_owned();
        let rel = relative(&raw)?;
        if rel.is_empty() {
            continue;
        }
        let target = format!("{base}{rel}");
        let mode = entry.header().mode().unwrap_or(0o644);
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                let dir = ensure_dir(view, &target)?;
                set_mode(dir.as_raw_fd(), mode, &target)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let mtime = entry.header().mtime().ok();
                let left = max.saturating_sub(done.bytes);
                let n = super::ops::write_at(view, &target, mode, mtime, &mut entry, left)
                    .map_err(|e| match e {
                        FileError::TooLarge(_) => FileError::TooLarge(max),
                        e => e,
                    })?;
                done.bytes += n;
            }
            tar::EntryType::Symlink => {
                let link = entry
                    .link_name_bytes()
                    .ok_or_else(|| FileError::Invalid(format!("entry {rel}: a link without a target")))?;
                symlink(view, &target, &link)?;
            }
            other => {
                return Err(FileError::Invalid(format!(
                    "entry {rel}: {other:?} entries are not supported (files, directories and symbolic links are)"
                )))
            }
        }
        done.entries += 1;
    }
    Ok(done)
}

/// An entry's path, checked: relative, no `..`, no NUL; `./` dropped.
fn relative(raw: &[u8]) -> FileResult<String> {
    let text = String::from_utf8_lossy(raw);
    if text.starts_with('/') {
        return Err(FileError::Invalid(format!(
            "entry {text}: an absolute path"
        )));
    }
    let parts: Vec<&str> = text
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(FileError::Invalid(format!("entry {text}: a path with ..")));
    }
    Ok(parts.join("/"))
}

/// The directory at `path`, made (with its parents) when missing.
fn ensure_dir(view: &View, path: &str) -> FileResult<OwnedFd> {
    let place = view.resolve(
        path,
        How {
            follow_last: true,
            make_parents: true,
            write: true,
        },
    )?;
    if let Some(name) = &place.name {
        view.make_dir(place.dir(view), name, &place.shown)?;
    }
    view.open_dir(&place)
}

/// A link at `path` to `target` (whatever non-directory was there goes).
fn symlink(view: &View, path: &str, target: &[u8]) -> FileResult<()> {
    let place = view.resolve(
        path,
        How {
            follow_last: false,
            make_parents: true,
            write: true,
        },
    )?;
    let Some(name) = &place.name else {
        return Err(FileError::WrongType(format!(
            "{}: a directory",
            place.shown
        )));
    };
    let dir = place.dir(view);
    if let Ok(st) = walk::lstat_at(dir, name) {
        if kind_of(&st) == EntryType::Dir {
            return Err(FileError::WrongType(format!(
                "{}: a directory",
                place.shown
            )));
        }
        // SAFETY: a valid descriptor and C string
        unsafe { libc::unlinkat(dir, name.as_ptr(), 0) };
    }
    let target = walk::c_name(target, &place.shown)?;
    // SAFETY: valid C strings and descriptor
    if unsafe { libc::symlinkat(target.as_ptr(), dir, name.as_ptr()) } != 0 {
        return Err(FileError::os(&place.shown, std::io::Error::last_os_error()));
    }
    Ok(())
}
