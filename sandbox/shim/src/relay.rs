//! The launcher's stdin relay (SPEC §25 under gVisor, §30): the kernel
//! cannot open an op's FIFO when it lives inside a gVisor sandbox, so it
//! hands the frames to the launcher through the inbox, and the launcher
//! writes them, each whole, as the kernel would have. A frame written
//! twice (a retried question) is applied once: the shim reading the FIFO
//! skips write ids it has applied.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use opkernel_shim::stdin::{Action, Reader, FIFO_EXT};
use opkernel_shim::{
    valid_nonce, validate_op_id, LISTING_SUFFIX, MAX_STDIN_QUESTION, OPS_DIR, STDIN_SUFFIX,
};

use crate::launch::write_atomic;

/// Answers the stdin questions `nonces` meant for `host`; returns how many.
pub fn relay_all(inbox: &Path, nonces: &[String], host: &str) -> usize {
    let mut answered = 0;
    for nonce in nonces.iter().filter(|n| valid_nonce(n)) {
        let question = inbox.join(format!("{nonce}.{STDIN_SUFFIX}"));
        let Some(bytes) = read_question(&question) else {
            continue;
        };
        let Some(at) = bytes.iter().position(|&b| b == b'\n') else {
            continue;
        };
        let head = String::from_utf8_lossy(&bytes[..at]).into_owned();
        let Some((to, op)) = head.split_once('\t') else {
            continue;
        };
        if to != host || validate_op_id(op).is_err() {
            continue;
        }
        let answer = feed(op, &bytes[at + 1..]);
        let _ = write_atomic(&inbox.join(format!("{nonce}.{LISTING_SUFFIX}")), &answer);
        let _ = std::fs::remove_file(&question);
        answered += 1;
    }
    answered
}

fn read_question(path: &Path) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .and_then(|f| f.take(MAX_STDIN_QUESTION as u64).read_to_end(&mut bytes))
        .ok()?;
    Some(bytes)
}

/// Writes the frames into the op's FIFO, each whole, until one does not
/// fit (`full N`) or the FIFO is gone (`closed N`); `ok N` when all went.
fn feed(op: &str, frames: &[u8]) -> String {
    let path = Path::new(OPS_DIR).join(format!("{op}.{FIFO_EXT}"));
    let mut fifo = match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(f) => f,
        Err(_) => return "closed 0\n".to_owned(),
    };
    let mut reader = Reader::default();
    reader.feed(frames);
    let mut n = 0;
    while let Some(Ok(frame)) = reader.next_frame() {
        let bytes = frame.render();
        match fifo.write(&bytes) {
            Ok(w) if w == bytes.len() => {}
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return format!("full {n}\n"),
            _ => return format!("closed {n}\n"),
        }
        n += 1;
        if frame.action == Action::Eof {
            // as the kernel does after EOF: later writes find no FIFO
            let _ = std::fs::remove_file(&path);
        }
    }
    format!("ok {n}\n")
}
