//! An interactive op's input (SPEC §25): how its stdin is wired ([`Io`])
//! and the frames the kernel writes into its FIFO, `<id>.in` in `.ops`.
//!
//! The shim makes the FIFO before the op's `.pid` and holds it open
//! (read and write) for the op's whole life, so a kernel writes to it
//! after any restart, and a write is never refused for want of a reader
//! while the op lives. The kernel writes whole frames of at most
//! [`MAX_FRAME`] bytes (`PIPE_BUF`): each lands in one piece, so writers
//! never interleave inside one. A frame names its write: the shim applies
//! a write id once (a retried write with the same `Idempotency-Key` is
//! not applied twice). The shim alone reads the FIFO; the command sees a
//! pipe or a terminal, never the FIFO nor any op file.

/// How a command's stdin is wired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Io {
    /// stdin is `/dev/null` (every op before SPEC §25, and the default).
    #[default]
    Null,
    /// stdin is a pipe the shim writes what the kernel sends.
    Pipe,
    /// The command runs on a pseudo-terminal of this size; its output is
    /// the terminal's stream.
    Tty {
        /// Rows (1 to [`MAX_ROWS`]).
        rows: u16,
        /// Columns (1 to [`MAX_COLS`]).
        cols: u16,
    },
}

/// Largest terminal height accepted.
pub const MAX_ROWS: u16 = 1000;
/// Largest terminal width accepted.
pub const MAX_COLS: u16 = 1000;

/// A terminal size within bounds, or why not.
pub fn check_size(rows: u16, cols: u16) -> Result<(), String> {
    if (1..=MAX_ROWS).contains(&rows) && (1..=MAX_COLS).contains(&cols) {
        Ok(())
    } else {
        Err(format!(
            "a terminal is 1 to {MAX_ROWS} rows by 1 to {MAX_COLS} columns, got {rows}x{cols}"
        ))
    }
}

impl Io {
    /// The spelling on a launch's command line and in a request:
    /// `null`, `pipe`, `tty:<rows>x<cols>`.
    pub fn spec(self) -> String {
        match self {
            Io::Null => "null".to_owned(),
            Io::Pipe => "pipe".to_owned(),
            Io::Tty { rows, cols } => format!("tty:{rows}x{cols}"),
        }
    }

    /// Reads [`Io::spec`] strictly.
    pub fn parse(text: &str) -> Result<Io, String> {
        match text {
            "null" => return Ok(Io::Null),
            "pipe" => return Ok(Io::Pipe),
            _ => {}
        }
        let size = text
            .strip_prefix("tty:")
            .and_then(|s| s.split_once('x'))
            .and_then(|(r, c)| Some((decimal(r)?, decimal(c)?)));
        let Some((rows, cols)) = size else {
            return Err(format!("bad stdin mode {text:?}"));
        };
        check_size(rows, cols)?;
        Ok(Io::Tty { rows, cols })
    }

    /// Whether the kernel may write to the op's stdin.
    pub fn has_stdin(self) -> bool {
        self != Io::Null
    }

    /// Whether the op runs on a terminal.
    pub fn is_tty(self) -> bool {
        matches!(self, Io::Tty { .. })
    }
}

fn decimal(text: &str) -> Option<u16> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

/// The FIFO's extension: `.ops/<id>.in`.
pub const FIFO_EXT: &str = "in";
/// A frame's header: magic (2), version (1), kind (1), write id (8, LE),
/// payload length (2, LE), reserved (2).
pub const HEADER: usize = 16;
/// Largest frame: `PIPE_BUF`, what one FIFO write delivers in one piece.
pub const MAX_FRAME: usize = 4096;
/// Largest payload of one frame.
pub const MAX_PAYLOAD: usize = MAX_FRAME - HEADER;
const MAGIC: [u8; 2] = *b"OK";
const VERSION: u8 = 1;

/// What one frame asks of the shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// These bytes go to the command's stdin (or its terminal).
    Data(Vec<u8>),
    /// stdin ends (a pipe is closed; a terminal gets its EOF character).
    Eof,
    /// The terminal takes this size (the command gets SIGWINCH).
    Resize {
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
}

/// One frame: a write's id (0: not deduplicated) and what it asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The write it belongs to; the shim applies each non-zero id once.
    pub id: u64,
    /// What it asks.
    pub action: Action,
}

impl Frame {
    /// The frame's bytes (at most [`MAX_FRAME`]; `Data` longer than
    /// [`MAX_PAYLOAD`] is the caller's error and is cut).
    pub fn render(&self) -> Vec<u8> {
        let (kind, payload): (u8, Vec<u8>) = match &self.action {
            Action::Data(bytes) => (0, bytes[..bytes.len().min(MAX_PAYLOAD)].to_vec()),
            Action::Eof => (1, Vec::new()),
            Action::Resize { rows, cols } => {
                let mut p = rows.to_le_bytes().to_vec();
                p.extend_from_slice(&cols.to_le_bytes());
                (2, p)
            }
        };
        let mut out = Vec::with_capacity(HEADER + payload.len());
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(kind);
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u16).to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&payload);
        out
    }
}

/// The frames of one write of `bytes` (then EOF when `eof`), the `n`th
/// chunk's id given by `id(n)`. An empty write without EOF has no frame.
pub fn write_frames(bytes: &[u8], eof: bool, id: impl Fn(u64) -> u64) -> Vec<Frame> {
    let mut frames: Vec<Frame> = bytes
        .chunks(MAX_PAYLOAD)
        .enumerate()
        .map(|(n, chunk)| Frame {
            id: id(n as u64),
            action: Action::Data(chunk.to_vec()),
        })
        .collect();
    if eof {
        frames.push(Frame {
            id: id(frames.len() as u64),
            action: Action::Eof,
        });
    }
    frames
}

/// Reassembles frames from the FIFO's byte stream (reads may split them).
#[derive(Debug, Default)]
pub struct Reader {
    buf: Vec<u8>,
}

impl Reader {
    /// Adds bytes read from the FIFO.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame; `None` until one is complete. An error means
    /// the stream is not frames (nothing after it can be trusted).
    pub fn next_frame(&mut self) -> Option<Result<Frame, String>> {
        if self.buf.len() < HEADER {
            return None;
        }
        let head = &self.buf[..HEADER];
        if head[..2] != MAGIC || head[2] != VERSION {
            return Some(Err(format!("not a stdin frame: {:02x?}", &head[..4])));
        }
        let len = u16::from_le_bytes([head[12], head[13]]) as usize;
        if len > MAX_PAYLOAD {
            return Some(Err(format!("frame payload of {len} bytes")));
        }
        if self.buf.len() < HEADER + len {
            return None;
        }
        let kind = head[3];
        let id = u64::from_le_bytes(head[4..12].try_into().unwrap_or([0; 8]));
        let payload: Vec<u8> = self.buf.drain(..HEADER + len).skip(HEADER).collect();
        let action = match (kind, payload.len()) {
            (0, _) => Action::Data(payload),
            (1, 0) => Action::Eof,
            (2, 4) => Action::Resize {
                rows: u16::from_le_bytes([payload[0], payload[1]]),
                cols: u16::from_le_bytes([payload[2], payload[3]]),
            },
            _ => return Some(Err(format!("bad frame kind {kind} ({len} bytes)"))),
        };
        Some(Ok(Frame { id, action }))
    }
}

/// The write ids applied lately: a frame whose id is here is skipped.
/// Bounded (the oldest are forgotten): a retry comes soon after its write.
#[derive(Debug, Default)]
pub struct Applied {
    order: std::collections::VecDeque<u64>,
    seen: std::collections::HashSet<u64>,
}

/// Write ids remembered per op.
pub const REMEMBERED_WRITES: usize = 65_536;

impl Applied {
    /// Whether the frame is to be applied now (first sight of its id, or
    /// id 0); records it.
    pub fn first(&mut self, id: u64) -> bool {
        if id == 0 {
            return true;
        }
        if !self.seen.insert(id) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > REMEMBERED_WRITES {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_modes_round_trip_strictly() {
        for io in [Io::Null, Io::Pipe, Io::Tty { rows: 24, cols: 80 }] {
            assert_eq!(Io::parse(&io.spec()), Ok(io));
        }
        for bad in [
            "",
            "tty",
            "tty:0x80",
            "tty:24x",
            "tty:024x80",
            "tty:1001x5",
            "TTY:1x1",
        ] {
            assert!(Io::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn frames_survive_any_split_of_the_stream() {
        let payload: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut frames = write_frames(&payload, true, |n| 100 + n);
        frames.push(Frame {
            id: 7,
            action: Action::Resize {
                rows: 30,
                cols: 120,
            },
        });
        assert!(frames.iter().all(|f| f.render().len() <= MAX_FRAME));
        let stream: Vec<u8> = frames.iter().flat_map(Frame::render).collect();
        for step in [1, 7, 4096, stream.len()] {
            let mut reader = Reader::default();
            let mut got = Vec::new();
            for piece in stream.chunks(step) {
                reader.feed(piece);
                while let Some(frame) = reader.next_frame() {
                    got.push(frame.unwrap());
                }
            }
            assert_eq!(got, frames, "split every {step}");
        }
        let mut bad = Reader::default();
        bad.feed(&[b'X'; 20]);
        assert!(bad.next_frame().unwrap().is_err());
    }

    #[test]
    fn a_write_id_is_applied_once() {
        let mut applied = Applied::default();
        assert!(applied.first(5));
        assert!(!applied.first(5));
        assert!(applied.first(0) && applied.first(0));
        assert!(write_frames(b"", false, |n| n).is_empty());
    }
}
