//! Interactive ops on the node that runs them (SPEC §25): writes to an
//! op's stdin FIFO (whole frames, one write at a time per op), its output
//! since an offset (waited for), and one signal to its foreground group.
//!
//! Nothing here changes an op's lifecycle: the FIFO is the shim's, held
//! open for the op's life (so a write from any kernel, before or after a
//! restart, reaches the same process), and a write the kernel was told
//! happened is in the kernel's pipe buffer, safe from a kernel crash. An
//! `Idempotency-Key` names the write's frames, so the shim applies a
//! retried write once.

use std::time::Duration;

use sandbox::stdin::{write_frames, Action, Frame, StdinError};
use tokio::time::Instant;

use crate::lifecycle::Status;
use crate::runtime::kernel::Kernel;
use crate::store::{Op, StoreError};

/// Why an interactive call could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The op was started without stdin.
    #[error("operation {0} was started without stdin (start it with \"stdin\": true or \"tty\")")]
    NoStdin(String),
    /// The op does not run on a terminal.
    #[error("operation {0} does not run on a terminal (start it with \"tty\")")]
    NoTty(String),
    /// The op has ended.
    #[error("operation {0} has ended ({1})")]
    Ended(String, Status),
    /// Its stdin was closed (EOF sent, or the command closed it).
    #[error("the stdin of operation {0} is closed (EOF was sent, or the command closed it)")]
    Closed(String),
    /// Still starting (or waiting for approval) when the wait ended.
    #[error("operation {0} has not started running yet ({1}); try again")]
    NotRunning(String, Status),
    /// The command does not read its stdin: only part of the write fit.
    #[error("the stdin of operation {op} is full (the command is not reading it): {written} of {total} bytes were written")]
    Full {
        /// The op.
        op: String,
        /// Bytes written.
        written: u64,
        /// Bytes asked.
        total: u64,
    },
    /// The FIFO could not be used.
    #[error("{0}")]
    Io(String),
    /// The control plane failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The op as the store has it now.
async fn current(k: &Kernel, id: &str) -> Result<Op, InputError> {
    k.store
        .get_op(id)
        .await?
        .ok_or_else(|| InputError::Io(format!("operation {id} vanished")))
}

/// The op once it runs (its FIFO and `.pid` exist), waiting while it is
/// starting until `deadline`.
pub async fn until_running(k: &Kernel, id: &str, deadline: Instant) -> Result<Op, InputError> {
    loop {
        let op = current(k, id).await?;
        if op.status.is_terminal() {
            return Err(InputError::Ended(op.id, op.status));
        }
        if op.status == Status::Running {
            return Ok(op);
        }
        if Instant::now() >= deadline {
            return Err(InputError::NotRunning(op.id, op.status));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What to write: bytes (maybe none) and EOF, or a new terminal size.
#[derive(Debug, Clone)]
pub enum Input {
    /// Bytes, then EOF when asked.
    Bytes {
        /// The bytes.
        data: Vec<u8>,
        /// Close stdin after them.
        eof: bool,
    },
    /// The terminal's new size.
    Resize {
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
}

/// Writes `input` to the running op's stdin: its frames in order, each
/// whole, waiting on a full FIFO until `deadline`. `key` (an
/// `Idempotency-Key`) makes a retry apply nothing twice.
pub async fn write(
    k: &Kernel,
    op: &Op,
    input: &Input,
    key: Option<&str>,
    deadline: Instant,
) -> Result<(), InputError> {
    if !op.io.has_stdin() {
        return Err(InputError::NoStdin(op.id.clone()));
    }
    // a key names one write: its ids carry the input's digest, so the same
    // key with other input is another write, never a merge of the two
    let nonce = uuid::Uuid::new_v4().to_string();
    let key = match key {
        Some(key) => format!("{key}\n{}", digest(input)),
        None => nonce,
    };
    let id = |n: u64| sandbox::stdin::write_id(&op.id, &key, n);
    let frames = match input {
        Input::Bytes { data, eof } => write_frames(data, *eof, id),
        Input::Resize { rows, cols } if op.io.is_tty() => vec![Frame {
            id: id(0),
            action: Action::Resize {
                rows: *rows,
                cols: *cols,
            },
        }],
        Input::Resize { .. } => return Err(InputError::NoTty(op.id.clone())),
    };
    let _turn = k.inputs.turn(&op.id).await;
    let closed = |e: StdinError| match e {
        StdinError::Closed => InputError::Closed(op.id.clone()),
        StdinError::Io(e) => InputError::Io(e),
    };
    let mut fifo = match k.backend.ops_dir(&op.scratch_key).open_stdin(&op.id) {
        Ok(fifo) => fifo,
        // no FIFO on the host's side: closed, or inside a gVisor sandbox
        // (SPEC §30), where only the op's launcher reaches it; a container
        // with a launcher is asked, and says `closed` for a FIFO that is gone
        Err(StdinError::Closed) if !k.config.profile.runs_as_root() => {
            return relay(k, op, &frames, deadline).await
        }
        // closed, or the op just ended (its status says which)
        Err(e) => return Err(closed_or_ended(k, op, closed(e)).await),
    };
    let mut written = 0u64;
    for frame in &frames {
        let bytes = frame.render();
        let mut pause = Duration::from_millis(1);
        while !fifo.try_write(&bytes).map_err(closed)? {
            if Instant::now() >= deadline {
                return Err(full(op, &frames, written));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
        written += payload_len(frame);
        if frame.action == Action::Eof {
            fifo.unlink();
        }
    }
    Ok(())
}

/// How long the launcher may take to answer a relayed write.
const RELAY_ANSWER: Duration = Duration::from_secs(3);

/// The write through the op's launcher (SPEC §30): under gVisor the FIFO
/// is inside the sandbox, so the launcher (without launchers, the shim's
/// relay run by `docker exec`) writes the frames, each whole, and says how
/// many went in; a full FIFO is tried again until `deadline`.
async fn relay(k: &Kernel, op: &Op, frames: &[Frame], deadline: Instant) -> Result<(), InputError> {
    use sandbox::launcher::Relayed;
    // no `.pid` yet: no FIFO yet either
    let Some(host) = container_host(k, op, deadline).await else {
        return Err(closed_or_ended(k, op, InputError::Closed(op.id.clone())).await);
    };
    // without launchers, a `docker exec` of the shim's relay answers
    let by_exec = (!k.config.ops.launcher)
        .then_some(op.container_id.as_deref())
        .flatten();
    let mut from = 0;
    let mut pause = Duration::from_millis(2);
    loop {
        let bytes: Vec<u8> = frames[from..].iter().flat_map(Frame::render).collect();
        let answer = k
            .backend
            .relay_stdin(
                &op.scratch_key,
                &host,
                &op.id,
                &bytes,
                RELAY_ANSWER,
                by_exec,
            )
            .await
            .map_err(|e| InputError::Io(e.to_string()))?;
        match answer {
            Some(Relayed::All(_)) => return Ok(()),
            Some(Relayed::Full(n)) => from += n,
            Some(Relayed::Closed(_)) => {
                return Err(closed_or_ended(k, op, InputError::Closed(op.id.clone())).await)
            }
            // not taken: no FIFO on the host's side and no launcher to
            // reach one inside, so nothing can read this input
            None => return Err(closed_or_ended(k, op, InputError::Closed(op.id.clone())).await),
            Some(Relayed::Unknown) => {
                let why = format!(
                    "the launcher of operation {} took its stdin and did not say within {}s \
                     how much went in: retry with the same Idempotency-Key (nothing is applied twice)",
                    op.id,
                    2 * RELAY_ANSWER.as_secs()
                );
                return Err(closed_or_ended(k, op, InputError::Io(why)).await);
            }
        }
        if Instant::now() >= deadline {
            let written = frames[..from].iter().map(payload_len).sum();
            return Err(full(op, frames, written));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// The hostname of the op's container, from its pid record: the row's, or
/// the `.pid` file itself (a start Docker confirmed counts as running
/// before its observer has read the file), waited for a moment (at most
/// until `deadline`).
async fn container_host(k: &Kernel, op: &Op, deadline: Instant) -> Option<String> {
    if let Some(pid) = &op.pid {
        return Some(pid.hostname.clone());
    }
    let ops = k.backend.ops_dir(&op.scratch_key);
    let until = deadline.min(Instant::now() + Duration::from_secs(2));
    loop {
        if let Ok(pid) = ops.read_pid(&op.id) {
            return Some(pid.hostname);
        }
        if Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `closed`, unless the op has ended meanwhile (its status says which).
async fn closed_or_ended(k: &Kernel, op: &Op, closed: InputError) -> InputError {
    match current(k, &op.id).await {
        Ok(now) if now.status.is_terminal() => InputError::Ended(now.id, now.status),
        Ok(_) => closed,
        Err(e) => e,
    }
}

fn full(op: &Op, frames: &[Frame], written: u64) -> InputError {
    InputError::Full {
        op: op.id.clone(),
        written,
        total: frames.iter().map(payload_len).sum(),
    }
}

/// What a write carries, as a digest (part of its keyed ids).
fn digest(input: &Input) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    match input {
        Input::Bytes { data, eof } => {
            h.update(if *eof {
                b"bytes+eof" as &[u8]
            } else {
                b"bytes"
            });
            h.update(data);
        }
        Input::Resize { rows, cols } => h.update(format!("resize {rows}x{cols}")),
    }
    hex::encode(&h.finalize()[..8])
}

fn payload_len(frame: &Frame) -> u64 {
    match &frame.action {
        Action::Data(bytes) => bytes.len() as u64,
        _ => 0,
    }
}

/// The op's output from `from`, with its state after the wait.
#[derive(Debug, Clone)]
pub struct Output {
    /// The bytes (cut before a character the log has only part of).
    pub bytes: Vec<u8>,
    /// The offset after them.
    pub next_offset: u64,
    /// The op after the wait.
    pub op: Op,
}

/// How long an output wait stops after output went quiet.
#[derive(Debug, Clone, Copy)]
pub enum Until {
    /// As soon as there is any output past `from`.
    Any,
    /// Once there is output past `from` and none came for this long.
    Quiet(Duration),
}

/// Waits until the op's log has output past `from` (and then, for
/// [`Until::Quiet`], none came for a while), the op ended, or `deadline`;
/// answers at most `max` bytes from `from`.
pub async fn output_after(
    k: &Kernel,
    op: &Op,
    from: u64,
    until: Until,
    deadline: Instant,
    max: u64,
) -> Result<Output, InputError> {
    let ops = k.backend.ops_dir(&op.scratch_key);
    let mut op = op.clone();
    let (mut size, mut grew_at) = (ops.log_size(&op.id), Instant::now());
    let mut pause = Duration::from_millis(1);
    let mut checked = Instant::now();
    loop {
        let now = Instant::now();
        let done = match until {
            Until::Any => size > from,
            Until::Quiet(q) => size > from && now.duration_since(grew_at) >= q,
        };
        if done || op.status.is_terminal() || now >= deadline {
            break;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(20));
        let now_size = ops.log_size(&op.id);
        if now_size != size {
            (size, grew_at, pause) = (now_size, Instant::now(), Duration::from_millis(1));
        }
        if checked.elapsed() >= Duration::from_millis(50) {
            op = current(k, &op.id).await?;
            checked = Instant::now();
        }
    }
    let op = current(k, &op.id).await?;
    read_from(k, op, from, max)
}

/// At most `max` bytes of the op's log from `from`, now.
pub fn read_from(k: &Kernel, op: Op, from: u64, max: u64) -> Result<Output, InputError> {
    let ops = k.backend.ops_dir(&op.scratch_key);
    let (mut bytes, size) = ops
        .read_log_at(&op.id, from, max)
        .map_err(|e| InputError::Io(e.to_string()))?;
    // a character the log has only part of is left for the next read,
    // unless the log is complete
    let complete = op.status.is_terminal() && from + bytes.len() as u64 >= size;
    if !complete {
        bytes.truncate(whole_chars(&bytes));
    }
    Ok(Output {
        next_offset: from + bytes.len() as u64,
        bytes,
        op,
    })
}

/// How many bytes of `bytes` end on a character boundary: a UTF-8
/// sequence cut at the end is left out (invalid bytes count as whole).
pub fn whole_chars(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=n.min(3) {
        let b = bytes[n - back];
        if b & 0xC0 == 0x80 {
            continue;
        }
        let need = match b {
            0xF8.. => 1,
            0xF0.. => 4,
            0xE0.. => 3,
            0xC0.. => 2,
            _ => 1,
        };
        return if need > back { n - back } else { n };
    }
    n
}

/// Sends one signal to the running op's foreground process group; the
/// number of processes it reached.
pub async fn signal(k: &Kernel, op: &Op, signal: sandbox::Signal) -> Result<u32, InputError> {
    let (Some(container), Some(record)) = (&op.container_id, &op.pid) else {
        return Err(InputError::NotRunning(op.id.clone(), op.status));
    };
    let hit = k
        .backend
        .signal_group(container, &op.id, record, signal)
        .await
        .map_err(|e| InputError::Io(e.to_string()))?;
    Ok(hit.len() as u32)
}

#[cfg(test)]
mod tests {
    use super::whole_chars;

    #[test]
    fn a_cut_character_waits_for_the_next_read() {
        let text = "aé€😀".as_bytes();
        assert_eq!(whole_chars(text), text.len());
        for cut in 1..text.len() {
            let n = whole_chars(&text[..cut]);
            assert!(std::str::from_utf8(&text[..n]).is_ok(), "cut at {cut}");
            assert!(cut - n < 4);
        }
        assert_eq!(whole_chars(b""), 0);
        assert_eq!(whole_chars(&[0xff, 0xfe]), 2);
    }
}
