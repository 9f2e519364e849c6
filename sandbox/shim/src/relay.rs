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
    valid_nonce, validate_op_id, INBOX_DIR, LISTING_SUFFIX, MAX_STDIN_QUESTION, OPS_DIR,
    STDIN_SUFFIX, STDIN_TAKEN_SUFFIX,
};

use crate::launch::write_atomic;

/// `opkernel-shim relay <nonce> <host>`: answers one stdin question, for a
/// container without a launcher (the kernel runs this by `docker exec`).
/// 0 when it was answered, 1 when it was not (withdrawn, or not this
/// container's), 2 for arguments.
pub fn main(args: Vec<std::ffi::OsString>) -> i32 {
    let args: Vec<String> = args
        .into_iter()
        .filter_map(|a| a.into_string().ok())
        .collect();
    let [nonce, host] = args.as_slice() else {
        eprintln!("usage: opkernel-shim relay <nonce> <host>");
        return 2;
    };
    match relay_all(Path::new(INBOX_DIR), std::slice::from_ref(nonce), host) {
        1 => 0,
        _ => 1,
    }
}

/// Answers the stdin questions `nonces` meant for `host`; returns how many.
/// Each is claimed by a rename before anything is written: a question the
/// kernel withdrew first (it removes the name) is never applied, and one
/// taken is answered.
pub fn relay_all(inbox: &Path, nonces: &[String], host: &str) -> usize {
    let mut answered = 0;
    for nonce in nonces.iter().filter(|n| valid_nonce(n)) {
        let question = inbox.join(format!("{nonce}.{STDIN_SUFFIX}"));
        // the header names the container: another's is left alone
        let Some(op) = addressed_to(&question, host) else {
            continue;
        };
        let taken = inbox.join(format!("{nonce}.{STDIN_TAKEN_SUFFIX}"));
        if std::fs::rename(&question, &taken).is_err() {
            continue;
        }
        let answer = match read_question(&taken) {
            Some(bytes) => {
                let at = bytes
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(bytes.len(), |i| i + 1);
                feed(&op, &bytes[at..])
            }
            None => "closed 0\n".to_owned(),
        };
        if write_atomic(&inbox.join(format!("{nonce}.{LISTING_SUFFIX}")), &answer).is_ok() {
            answered += 1;
        }
        let _ = std::fs::remove_file(&taken);
    }
    answered
}

/// The op a question names when it is meant for `host` (its first line:
/// `<host>\t<op id>`, read alone).
fn addressed_to(path: &Path, host: &str) -> Option<String> {
    let mut head = [0u8; 320];
    let n = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .and_then(|mut f| f.read(&mut head))
        .ok()?;
    let line = head[..n].split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let (to, op) = line.split_once('\t')?;
    (to == host && validate_op_id(op).is_ok()).then(|| op.to_owned())
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
