//! Host-side reading of an op's files in `<scratch>/.ops/`: the pid record,
//! the exit code and the log. Every open refuses symlinks and non-regular
//! files and every read is bounded, so a hostile file can neither redirect
//! the kernel outside the scratch dir nor make it read without end.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use opkernel_shim::FormatError;
use sha2::{Digest, Sha256};

use crate::shim::validate_op_id;

/// Why an op file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpFileError {
    /// Not written (yet): the file's name.
    #[error("{0} is missing")]
    Missing(String),
    /// Created but nothing written: its writer may be mid-way.
    #[error("{0} is empty")]
    Empty(String),
    /// No trailing newline yet: a writer may be mid-way; the name and the text
    /// read.
    #[error("{0} is only partly written: {1:?}")]
    Partial(String, String),
    /// Complete but not a record the shim writes: the name and the text read.
    #[error("{0} holds garbage: {1:?}")]
    Garbage(String, String),
    /// A symlink, fifo or directory where a file should be: never followed.
    #[error("{0} is not a regular file (symlink, fifo or directory)")]
    NotRegular(String),
    /// The open or read failed; the name and the OS error.
    #[error("{0} could not be read: {1}")]
    Unreadable(String, String),
}

pub use opkernel_shim::{ExitRecord, Handback, OpResult, PidRecord, Request, Usage};

const MAX_PID_FILE: u64 = 512;
const MAX_CODE_FILE: u64 = 320;

fn named(name: &str, e: FormatError) -> OpFileError {
    match e {
        FormatError::Empty => OpFileError::Empty(name.to_owned()),
        FormatError::Partial(text) => OpFileError::Partial(name.to_owned(), text),
        FormatError::Garbage(text) => OpFileError::Garbage(name.to_owned(), text),
    }
}

/// Parses the content of a `.pid` file: `<pid> <start ticks> <hostname>\n`.
pub fn parse_pid_record(name: &str, text: &str) -> Result<PidRecord, OpFileError> {
    PidRecord::parse(text).map_err(|e| named(name, e))
}

/// Parses the content of a `.code` file: `<code> <cpu ms> <max rss KiB>\n`
/// (or a bare `<code>\n`), code 0..=255; or `not-started <reason>\n`.
pub fn parse_op_result(name: &str, text: &str) -> Result<OpResult, OpFileError> {
    OpResult::parse(text).map_err(|e| named(name, e))
}

/// Digest of a finished log: its output artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogDigest {
    /// Hex sha256 of the whole log.
    pub sha256: String,
    /// The log's size, in bytes.
    pub size: u64,
}

/// The `.ops` directory of one run, seen from the host.
#[derive(Debug, Clone)]
pub struct OpsDir {
    dir: PathBuf,
}

impl OpsDir {
    /// The `.ops` dir at `dir` (the host side of `/scratch/.ops`).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        OpsDir { dir: dir.into() }
    }

    /// The directory on the host.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn file(&self, op_id: &str, ext: &str) -> Result<PathBuf, OpFileError> {
        validate_op_id(op_id)
            .map_err(|e| OpFileError::Garbage(format!("{op_id}.{ext}"), e.to_string()))?;
        Ok(self.dir.join(format!("{op_id}.{ext}")))
    }

    /// `<id>.log`: the command's output (the op id is checked first).
    pub fn log_path(&self, op_id: &str) -> Result<PathBuf, OpFileError> {
        self.file(op_id, "log")
    }

    /// Reads and strictly parses `<id>.pid` (bounded, no symlinks).
    pub fn read_pid(&self, op_id: &str) -> Result<PidRecord, OpFileError> {
        let name = format!("{op_id}.pid");
        let text = read_small(&self.file(op_id, "pid")?, &name, MAX_PID_FILE)?;
        parse_pid_record(&name, &text)
    }

    /// Reads and strictly parses `<id>.code` (bounded, no symlinks).
    pub fn read_code(&self, op_id: &str) -> Result<OpResult, OpFileError> {
        let name = format!("{op_id}.code");
        let text = read_small(&self.file(op_id, "code")?, &name, MAX_CODE_FILE)?;
        parse_op_result(&name, &text)
    }

    /// The op's `.code` with when it was written (its mtime, unix ms: the
    /// end of the command, as the shim recorded it), from one open.
    pub fn read_code_written(&self, op_id: &str) -> Result<(OpResult, Option<i64>), OpFileError> {
        let name = format!("{op_id}.code");
        let file = open_regular(&self.file(op_id, "code")?, &name)?;
        let written = file
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_millis()).ok());
        let text = read_bounded(file, &name, MAX_CODE_FILE)?;
        Ok((parse_op_result(&name, &text)?, written))
    }

    fn inbox_file(&self, op_id: &str, state: &str) -> Result<PathBuf, OpFileError> {
        validate_op_id(op_id)
            .map_err(|e| OpFileError::Garbage(format!("{op_id}.{state}"), e.to_string()))?;
        Ok(self.dir.join("inbox").join(format!("{op_id}.{state}")))
    }

    /// Hands an op to the launcher: writes `inbox/<id>.req.tmp` and renames
    /// it to `inbox/<id>.req`, so the launcher never sees a partial request.
    pub fn submit(&self, request: &Request) -> std::io::Result<()> {
        let invalid =
            |e: OpFileError| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string());
        let path = self.inbox_file(&request.op_id, "req").map_err(invalid)?;
        let tmp = self
            .inbox_file(&request.op_id, "req.tmp")
            .map_err(invalid)?;
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        file.write_all(&request.render())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, &path)?;
        // filed durably before it counts (SPEC §28)
        sync_dir_of(&path)
    }

    /// Takes a request back from the launcher: renames `<id>.req` to
    /// `<id>.withdrawn`. The launcher claims by renaming the same file, so
    /// exactly one of the two wins; only [`Handback::Withdrawn`] and
    /// [`Handback::NeverFiled`] allow starting the op another way.
    pub fn withdraw(&self, op_id: &str) -> Result<Handback, OpFileError> {
        let pending = self.inbox_file(op_id, "req")?;
        let withdrawn = self.inbox_file(op_id, "withdrawn")?;
        let claimed = self.inbox_file(op_id, "claimed")?;
        match std::fs::rename(&pending, &withdrawn) {
            Ok(()) => {
                // taken back durably before any other path may run it
                sync_dir_of(&withdrawn).map_err(|e| {
                    OpFileError::Unreadable(format!("{op_id}.withdrawn"), e.to_string())
                })?;
                return Ok(Handback::Withdrawn);
            }
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(OpFileError::Unreadable(
                    format!("{op_id}.req"),
                    e.to_string(),
                ))
            }
            Err(_) => {}
        }
        // already gone: say who has it
        Ok(if std::fs::symlink_metadata(&claimed).is_ok() {
            Handback::Claimed
        } else if std::fs::symlink_metadata(&withdrawn).is_ok() {
            Handback::Withdrawn
        } else {
            Handback::NeverFiled
        })
    }

    /// Removes an op's handover files (`.req`, `.req.tmp`, `.claimed`,
    /// `.withdrawn`) once the op is terminal: they decided who runs it,
    /// and nothing asks again after the verdict (a `.withdraw` of a live op
    /// would read their absence as "never filed"). Returns how many went.
    pub fn clear_handover(&self, op_id: &str) -> Result<usize, OpFileError> {
        let mut removed = 0;
        for state in ["req", "req.tmp", "claimed", "withdrawn"] {
            let path = self.inbox_file(op_id, state)?;
            match std::fs::remove_file(&path) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(OpFileError::Unreadable(
                        format!("{op_id}.{state}"),
                        e.to_string(),
                    ))
                }
            }
        }
        Ok(removed)
    }

    /// Removes an op's own files once it is delivered and old (SPEC §21):
    /// `.pid` first, so a `.pid` never stands without its `.code` (which
    /// would read as a live op), then `.code`, `.log`, the stdin FIFO and
    /// the handover files. Already gone is fine.
    pub fn remove_op_files(&self, op_id: &str) -> Result<(), OpFileError> {
        // `.in`: an interactive op's stdin FIFO, left by a shim that was killed
        for ext in ["pid", "code", "log", "in"] {
            let path = self.file(op_id, ext)?;
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(OpFileError::Unreadable(
                        format!("{op_id}.{ext}"),
                        e.to_string(),
                    ))
                }
            }
        }
        self.clear_handover(op_id).map(|_| ())
    }

    /// The inbox's entries: file name and age, for the sweep of handover
    /// files a crash left behind (empty when there is no inbox).
    pub fn inbox_entries(&self) -> Vec<(String, std::time::Duration)> {
        let Ok(dir) = std::fs::read_dir(self.dir.join("inbox")) else {
            return Vec::new();
        };
        let now = std::time::SystemTime::now();
        dir.filter_map(|e| {
            let e = e.ok()?;
            let age = e.metadata().ok()?.modified().ok()?;
            let name = e.file_name().into_string().ok()?;
            Some((name, now.duration_since(age).unwrap_or_default()))
        })
        .collect()
    }

    /// Removes one inbox entry by name (a stale probe question or answer);
    /// a name with a path separator is refused.
    pub fn remove_inbox_entry(&self, name: &str) -> std::io::Result<()> {
        if name.contains('/') || name.starts_with('.') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("bad inbox entry {name:?}"),
            ));
        }
        std::fs::remove_file(self.dir.join("inbox").join(name))
    }

    /// Asks the launcher of the container with hostname `host` for a probe
    /// listing: renames `inbox/<nonce>.probe` (holding `host`) into place.
    /// Returns the nonce to collect the answer with.
    pub fn ask_probe(&self, host: &str) -> std::io::Result<String> {
        self.ask_launcher(host.as_bytes(), opkernel_shim::PROBE_SUFFIX)
    }

    /// Asks the launcher of `host` for its process table (the shim's `ps`),
    /// collected like a probe's listing.
    pub fn ask_ps(&self, host: &str) -> std::io::Result<String> {
        let question = format!("{host}\t{}", opkernel_shim::PS_QUESTION);
        self.ask_launcher(question.as_bytes(), opkernel_shim::PROBE_SUFFIX)
    }

    /// Asks the launcher of `host` to put `frames` (whole, rendered) into
    /// op `op_id`'s stdin FIFO (gVisor: the FIFO is out of the host's
    /// reach); the answer is collected like a probe's listing.
    pub fn ask_stdin(&self, host: &str, op_id: &str, frames: &[u8]) -> std::io::Result<String> {
        let mut question = format!("{host}\t{op_id}\n").into_bytes();
        question.extend_from_slice(frames);
        self.ask_launcher(&question, opkernel_shim::STDIN_SUFFIX)
    }

    fn ask_launcher(&self, question: &[u8], suffix: &str) -> std::io::Result<String> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let nonce = format!(
            "{:x}{:08x}{:x}",
            std::process::id(),
            nanos & 0xffff_ffff,
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let inbox = self.dir.join("inbox");
        let tmp = inbox.join(format!("{nonce}.{suffix}.tmp"));
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?
            .write_all(question)?;
        std::fs::rename(&tmp, inbox.join(format!("{nonce}.{suffix}")))?;
        Ok(nonce)
    }

    /// Withdraws stdin question `nonce` unless the launcher took it first:
    /// `true` when it was still there (now gone: nothing of it is written).
    pub fn withdraw_stdin(&self, nonce: &str) -> bool {
        let question = self
            .dir
            .join("inbox")
            .join(format!("{nonce}.{}", opkernel_shim::STDIN_SUFFIX));
        std::fs::remove_file(question).is_ok()
    }

    /// The launcher's answer to [`OpsDir::ask_probe`], once there (taken:
    /// the file is removed).
    pub fn take_listing(&self, nonce: &str) -> Option<String> {
        let path = self
            .dir
            .join("inbox")
            .join(format!("{nonce}.{}", opkernel_shim::LISTING_SUFFIX));
        let text = read_small(&path, "probe listing", 4 << 20).ok()?;
        let _ = std::fs::remove_file(&path);
        Some(text)
    }

    /// Drops an unanswered probe question (and an answer that came late).
    pub fn cancel_probe(&self, nonce: &str) {
        let inbox = self.dir.join("inbox");
        for suffix in [
            opkernel_shim::PROBE_SUFFIX,
            opkernel_shim::STDIN_SUFFIX,
            opkernel_shim::LISTING_SUFFIX,
        ] {
            let _ = std::fs::remove_file(inbox.join(format!("{nonce}.{suffix}")));
        }
    }

    /// Opens the log for reading; refuses symlinks and non-regular files.
    pub fn open_log(&self, op_id: &str) -> Result<File, OpFileError> {
        let path = self.log_path(op_id)?;
        open_regular(&path, &format!("{op_id}.log"))
    }

    /// The last `max` bytes of the log (fewer if it is shorter) and its size.
    pub fn log_tail(&self, op_id: &str, max: u64) -> Result<(Vec<u8>, u64), OpFileError> {
        let name = format!("{op_id}.log");
        let mut file = self.open_log(op_id)?;
        let size = file
            .metadata()
            .map_err(|e| OpFileError::Unreadable(name.clone(), e.to_string()))?
            .len();
        let from = size.saturating_sub(max);
        file.seek(SeekFrom::Start(from))
            .map_err(|e| OpFileError::Unreadable(name.clone(), e.to_string()))?;
        let mut buf = Vec::with_capacity((size - from) as usize);
        file.take(max)
            .read_to_end(&mut buf)
            .map_err(|e| OpFileError::Unreadable(name, e.to_string()))?;
        Ok((buf, size))
    }

    /// sha256 and size of the whole log, and its last `tail` bytes, in one pass.
    pub fn log_digest(&self, op_id: &str, tail: u64) -> Result<(LogDigest, Vec<u8>), OpFileError> {
        let name = format!("{op_id}.log");
        let mut file = self.open_log(op_id)?;
        let (mut hasher, mut size, mut last) = (Sha256::new(), 0u64, Vec::new());
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(OpFileError::Unreadable(name, e.to_string())),
            };
            hasher.update(&buf[..n]);
            size += n as u64;
            last.extend_from_slice(&buf[..n]);
            last.drain(..last.len().saturating_sub(tail as usize));
        }
        let digest = LogDigest {
            sha256: hex::encode(hasher.finalize()),
            size,
        };
        Ok((digest, last))
    }
}

fn open_regular(path: &Path, name: &str) -> Result<File, OpFileError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => OpFileError::Missing(name.to_owned()),
            _ if e.raw_os_error() == Some(libc::ELOOP) => OpFileError::NotRegular(name.to_owned()),
            _ => OpFileError::Unreadable(name.to_owned(), e.to_string()),
        })?;
    let meta = file
        .metadata()
        .map_err(|e| OpFileError::Unreadable(name.to_owned(), e.to_string()))?;
    if !meta.is_file() {
        return Err(OpFileError::NotRegular(name.to_owned()));
    }
    Ok(file)
}

fn read_small(path: &Path, name: &str, max: u64) -> Result<String, OpFileError> {
    read_bounded(open_regular(path, name)?, name, max)
}

/// An open file's text, refused above `max` bytes or when not UTF-8.
fn read_bounded(file: File, name: &str, max: u64) -> Result<String, OpFileError> {
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| OpFileError::Unreadable(name.to_owned(), e.to_string()))?;
    if bytes.len() as u64 > max {
        return Err(OpFileError::Garbage(
            name.to_owned(),
            format!("larger than {max} bytes"),
        ));
    }
    String::from_utf8(bytes).map_err(|_| OpFileError::Garbage(name.to_owned(), "not utf-8".into()))
}

/// Syncs the directory holding `path`: a rename in it is durable once
/// its directory is.
fn sync_dir_of(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0b6f1c2e-8a47-4c1e-9d3a-5f2b7c9e1a0d";

    #[test]
    fn pid_records_parse() {
        assert_eq!(
            parse_pid_record("p", "42 123456 abc123\n"),
            Ok(PidRecord {
                pid: 42,
                start_ticks: 123456,
                hostname: "abc123".into()
            })
        );
        assert!(matches!(
            parse_pid_record("p", ""),
            Err(OpFileError::Empty(_))
        ));
        assert!(matches!(
            parse_pid_record("p", "42 1234"),
            Err(OpFileError::Partial(..))
        ));
        assert!(matches!(
            parse_pid_record("p", "42\n"),
            Err(OpFileError::Partial(..))
        ));
        assert!(matches!(
            parse_pid_record("p", "x 1 h\n"),
            Err(OpFileError::Garbage(..))
        ));
        assert!(matches!(
            parse_pid_record("p", "0 1 h\n"),
            Err(OpFileError::Garbage(..))
        ));
        assert!(matches!(
            parse_pid_record("p", "1 2 h extra\n"),
            Err(OpFileError::Garbage(..))
        ));
    }

    #[test]
    fn exit_records_parse_with_and_without_usage() {
        let code = |c| match parse_op_result("c", c)? {
            OpResult::Exited(e) => Ok(e.code),
            OpResult::NotStarted(why) => Err(OpFileError::Garbage("c".into(), why)),
        };
        assert_eq!(code("0\n"), Ok(0));
        assert_eq!(code("137 20 1024\n"), Ok(137));
        assert_eq!(
            parse_op_result("c", "3 20 1024\n").unwrap().usage(),
            Some(Usage {
                cpu_ms: 20,
                max_rss_kb: 1024
            })
        );
        assert_eq!(
            parse_op_result("c", "not-started cannot fork\n"),
            Ok(OpResult::NotStarted("cannot fork".into()))
        );
        assert!(matches!(code(""), Err(OpFileError::Empty(_))));
        assert!(matches!(code("13"), Err(OpFileError::Partial(..))));
        for bad in ["-1\n", "256\n", "abc\n", "+3\n", "1 2\n", "\n"] {
            assert!(
                matches!(code(bad), Err(OpFileError::Garbage(..))),
                "{bad:?}"
            );
        }
    }

    fn tmp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("opfiles-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn files_are_read_bounded_and_never_through_symlinks() {
        let dir = tmp_dir("sym");
        let ops = OpsDir::new(&dir);
        assert!(matches!(ops.read_code(ID), Err(OpFileError::Missing(_))));
        std::fs::write(dir.join("secret"), "0\n").unwrap();
        std::os::unix::fs::symlink(dir.join("secret"), dir.join(format!("{ID}.code"))).unwrap();
        assert!(matches!(ops.read_code(ID), Err(OpFileError::NotRegular(_))));
        std::fs::write(dir.join(format!("{ID}.pid")), "1 ".repeat(10_000)).unwrap();
        assert!(matches!(ops.read_pid(ID), Err(OpFileError::Garbage(..))));
        std::fs::create_dir(dir.join(format!("{ID}.log"))).unwrap();
        assert!(matches!(
            ops.log_tail(ID, 10),
            Err(OpFileError::NotRegular(_))
        ));
        assert!(ops.read_code("../secret").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_request_is_claimed_or_withdrawn_never_both() {
        let dir = tmp_dir("inbox");
        std::fs::create_dir(dir.join("inbox")).unwrap();
        let ops = OpsDir::new(&dir);
        let req = |id: &str| Request {
            host: "h".into(),
            op_id: id.into(),
            run_as: "1000:1000".into(),
            log_cap: 10,
            io: opkernel_shim::Io::Null,
            argv: vec!["true".into()],
        };
        assert_eq!(ops.withdraw(ID), Ok(Handback::NeverFiled));
        ops.submit(&req(ID)).unwrap();
        assert_eq!(ops.withdraw(ID), Ok(Handback::Withdrawn));
        assert_eq!(ops.withdraw(ID), Ok(Handback::Withdrawn), "idempotent");
        // a launcher claiming while the kernel withdraws: exactly one wins
        for _ in 0..200 {
            let id = uuid_like();
            ops.submit(&req(&id)).unwrap();
            let inbox = dir.join("inbox");
            let (pending, claimed) = (
                inbox.join(format!("{id}.req")),
                inbox.join(format!("{id}.claimed")),
            );
            let launcher = std::thread::spawn(move || std::fs::rename(pending, claimed).is_ok());
            let handback = ops.withdraw(&id).unwrap();
            let launched = launcher.join().unwrap();
            assert_eq!(launched, handback == Handback::Claimed, "{handback:?}");
            assert_ne!(handback, Handback::NeverFiled);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn uuid_like() -> String {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        format!(
            "00000000-0000-4000-8000-{:012x}",
            NEXT.fetch_add(1, Ordering::Relaxed)
        )
    }

    #[test]
    fn log_tail_and_digest() {
        let dir = tmp_dir("log");
        let ops = OpsDir::new(&dir);
        std::fs::write(dir.join(format!("{ID}.log")), b"hello\0world").unwrap();
        assert_eq!(ops.log_tail(ID, 5).unwrap(), (b"world".to_vec(), 11));
        assert_eq!(ops.log_tail(ID, 100).unwrap().0, b"hello\0world".to_vec());
        let (digest, tail) = ops.log_digest(ID, 5).unwrap();
        assert_eq!((digest.size, digest.sha256.len()), (11, 64));
        assert_eq!(tail, b"world".to_vec());
        assert_eq!(ops.log_digest(ID, 100).unwrap().1, b"hello\0world".to_vec());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
