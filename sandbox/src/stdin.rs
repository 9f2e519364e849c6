//! An interactive op seen from the host (SPEC §25): its stdin FIFO,
//! written in whole frames, and its log read from an offset.
//!
//! The FIFO `<id>.in` is made and held open by the op's shim. The kernel
//! opens it write-only and non-blocking, so a missing FIFO (stdin closed,
//! or the op ended), one without a reader, or one that is full never
//! blocks a kernel thread: each frame (at most `PIPE_BUF` bytes) is written
//! whole or not at all.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};

use opkernel_shim::stdin::FIFO_EXT;
use sha2::{Digest, Sha256};

use crate::opfiles::{OpFileError, OpsDir};
use crate::shim::validate_op_id;

pub use opkernel_shim::stdin::{
    check_size, write_frames, Action, Frame, MAX_COLS, MAX_PAYLOAD, MAX_ROWS,
};

/// Why a frame could not be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StdinError {
    /// The op's stdin is closed: EOF was sent, the command closed it, or
    /// the op ended (no FIFO, or nobody reads it).
    #[error("the operation's stdin is closed")]
    Closed,
    /// The open or write failed otherwise.
    #[error("cannot write to the operation's stdin: {0}")]
    Io(String),
}

/// The op's stdin FIFO, open for writing.
#[derive(Debug)]
pub struct StdinFifo {
    file: File,
    path: std::path::PathBuf,
}

/// A write's id for its `n`th frame: from its `Idempotency-Key` (the same
/// key gives the same ids, so the shim applies a retried write once), else
/// from a fresh nonce. Never 0 (0 is "not deduplicated").
pub fn write_id(op_id: &str, key: &str, n: u64) -> u64 {
    let digest = Sha256::digest(format!("opkernel-stdin\n{op_id}\n{key}\n{n}"));
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first).max(1)
}

impl OpsDir {
    /// Opens the op's stdin FIFO (write-only, non-blocking, no symlinks).
    pub fn open_stdin(&self, op_id: &str) -> Result<StdinFifo, StdinError> {
        validate_op_id(op_id).map_err(|e| StdinError::Io(e.to_string()))?;
        let path = self.path().join(format!("{op_id}.{FIFO_EXT}"));
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT | libc::ENXIO) => StdinError::Closed,
                _ => StdinError::Io(e.to_string()),
            })?;
        let fifo = file
            .metadata()
            .map_err(|e| StdinError::Io(e.to_string()))?
            .file_type()
            .is_fifo();
        if !fifo {
            return Err(StdinError::Io(format!("{} is not a FIFO", path.display())));
        }
        Ok(StdinFifo { file, path })
    }

    /// Up to `max` bytes of the op's log from `offset`, and the log's size
    /// now (a missing log reads as empty).
    pub fn read_log_at(
        &self,
        op_id: &str,
        offset: u64,
        max: u64,
    ) -> Result<(Vec<u8>, u64), OpFileError> {
        let name = format!("{op_id}.log");
        let mut file = match self.open_log(op_id) {
            Ok(file) => file,
            Err(OpFileError::Missing(_)) => return Ok((Vec::new(), 0)),
            Err(e) => return Err(e),
        };
        let unreadable = |e: std::io::Error| OpFileError::Unreadable(name.clone(), e.to_string());
        let size = file.metadata().map_err(unreadable)?.len();
        if offset >= size {
            return Ok((Vec::new(), size));
        }
        file.seek(SeekFrom::Start(offset)).map_err(unreadable)?;
        let mut buf = Vec::with_capacity(max.min(size - offset) as usize);
        file.take(max).read_to_end(&mut buf).map_err(unreadable)?;
        Ok((buf, size))
    }

    /// The log's size now (0 while it is missing).
    pub fn log_size(&self, op_id: &str) -> u64 {
        self.open_log(op_id)
            .ok()
            .and_then(|f| f.metadata().ok())
            .map_or(0, |m| m.len())
    }
}

impl StdinFifo {
    /// Writes one frame whole: `Ok(true)` once written, `Ok(false)` when
    /// the FIFO is full now (nothing written; try again later).
    pub fn try_write(&mut self, frame: &[u8]) -> Result<bool, StdinError> {
        match self.file.write(frame) {
            Ok(n) if n == frame.len() => Ok(true),
            Ok(n) => Err(StdinError::Io(format!(
                "a frame of {} bytes was cut at {n}",
                frame.len()
            ))),
            Err(e) => match e.raw_os_error() {
                Some(libc::EAGAIN) => Ok(false),
                Some(libc::EPIPE) => Err(StdinError::Closed),
                _ => Err(StdinError::Io(e.to_string())),
            },
        }
    }

    /// After EOF: the FIFO's name goes, so any later write is refused as
    /// closed (the shim, holding it open, still reads the EOF frame).
    pub fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0b6f1c2e-8a47-4c1e-9d3a-5f2b7c9e1a0d";

    #[test]
    fn write_ids_follow_the_key() {
        assert_eq!(write_id(ID, "k", 0), write_id(ID, "k", 0));
        assert_ne!(write_id(ID, "k", 0), write_id(ID, "k", 1));
        assert_ne!(write_id(ID, "k", 0), write_id(ID, "j", 0));
        assert_ne!(write_id(ID, "k", 0), 0);
    }

    #[test]
    fn a_missing_or_readerless_fifo_is_closed_and_a_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("opkernel-stdin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ops = OpsDir::new(&dir);
        assert_eq!(ops.open_stdin(ID).unwrap_err(), StdinError::Closed);
        let path = dir.join(format!("{ID}.in"));
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path and a mode.
        #[allow(unsafe_code)]
        let made = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(made, 0);
        assert_eq!(ops.open_stdin(ID).unwrap_err(), StdinError::Closed);
        let reader = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut fifo = ops.open_stdin(ID).unwrap();
        let frame = Frame {
            id: 1,
            action: Action::Data(b"hi".to_vec()),
        }
        .render();
        assert!(fifo.try_write(&frame).unwrap());
        // nobody reads: 64 KiB of whole frames fill the pipe, then a
        // frame is refused whole (never cut)
        let big = Frame {
            id: 2,
            action: Action::Data(vec![b'x'; MAX_PAYLOAD]),
        }
        .render();
        let written = (0..32)
            .take_while(|_| fifo.try_write(&big).unwrap())
            .count();
        assert!((1..32).contains(&written), "{written} frames fit");
        drop(reader);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"plain").unwrap();
        assert!(matches!(ops.open_stdin(ID), Err(StdinError::Io(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn logs_read_from_an_offset() {
        let dir = std::env::temp_dir().join(format!("opkernel-logat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ops = OpsDir::new(&dir);
        assert_eq!(ops.read_log_at(ID, 0, 10).unwrap(), (vec![], 0));
        std::fs::write(dir.join(format!("{ID}.log")), b"hello world").unwrap();
        assert_eq!(ops.read_log_at(ID, 6, 3).unwrap(), (b"wor".to_vec(), 11));
        assert_eq!(ops.read_log_at(ID, 20, 3).unwrap(), (vec![], 11));
        assert_eq!(ops.log_size(ID), 11);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
