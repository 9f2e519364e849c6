//! An interactive op's input in the shim (SPEC §25): the FIFO `<id>.in`,
//! made before `.pid` and held open (read and write) for the op's life,
//! and the thread that applies its frames to the command's stdin pipe or
//! terminal.
//!
//! Who holds what: the shim holds the FIFO (so it never lacks a reader
//! while the op lives, and a kernel's write lands in the kernel's pipe
//! buffer, safe from a kernel crash), the write end of the command's
//! stdin pipe or the terminal's master; the command holds only the read
//! end or the slave. Both the FIFO and the master close on exec. The
//! input ends (the FIFO is unlinked and closed, so later writes fail) on
//! EOF, when the command closed its stdin, and when the command ends.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use opkernel_shim::stdin::{Action, Applied, Reader, FIFO_EXT};
use opkernel_shim::OPS_DIR;

use crate::pty;

/// The op's FIFO, open.
pub struct Fifo {
    path: PathBuf,
    file: File,
}

impl Fifo {
    /// Makes `.ops/<op>.in` and opens it read-write (a FIFO opened so
    /// never blocks, and always has a reader).
    pub fn create(op: &str) -> io::Result<Fifo> {
        let path = Path::new(OPS_DIR).join(format!("{op}.{FIFO_EXT}"));
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        pty::mkfifo(&path)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        if !file.metadata()?.file_type().is_fifo() {
            return Err(io::Error::other(format!(
                "{} is not a FIFO",
                path.display()
            )));
        }
        Ok(Fifo { path, file })
    }

    /// The path, to unlink when the input ends.
    pub fn path(&self) -> PathBuf {
        self.path.clone()
    }
}

/// Where the input goes.
pub enum Sink {
    /// The write end of the command's stdin pipe.
    Pipe(io::PipeWriter),
    /// The terminal's master (a duplicate of the one read for output).
    Tty(File),
}

/// Ends the input: later opens of the FIFO fail, so a write is refused
/// rather than lost.
pub fn close(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// Starts the thread that applies the FIFO's frames to `sink` until EOF,
/// the command closing its stdin, or the process's end.
pub fn start(fifo: Fifo, sink: Sink) -> io::Result<()> {
    std::thread::Builder::new()
        .name("input".into())
        .spawn(move || {
            let Fifo { path, file } = fifo;
            let why = apply(file, sink);
            close(&path);
            if let Err(e) = why {
                eprintln!("opkernel-shim launch: stdin ended: {e}");
            }
        })
        .map(drop)
}

fn apply(mut fifo: File, mut sink: Sink) -> io::Result<()> {
    let mut reader = Reader::default();
    let mut applied = Applied::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // the command closing its stdin (or its terminal gone) ends the
        // input at once: a later write is refused, not dropped
        if pty::input_or_hangup(&fifo, sink.fd())? {
            return Ok(());
        }
        let n = match fifo.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        reader.feed(&buf[..n]);
        while let Some(frame) = reader.next_frame() {
            let frame = frame.map_err(io::Error::other)?;
            if !applied.first(frame.id) {
                continue;
            }
            match frame.action {
                Action::Data(bytes) => match sink.write(&bytes) {
                    Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
                    other => other?,
                },
                Action::Eof => return sink.eof(),
                Action::Resize { rows, cols } => sink.resize(rows, cols)?,
            }
        }
    }
}

impl Sink {
    fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match self {
            Sink::Pipe(p) => p.as_raw_fd(),
            Sink::Tty(t) => t.as_raw_fd(),
        }
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Sink::Pipe(p) => p.write_all(bytes),
            Sink::Tty(t) => t.write_all(bytes),
        }
    }

    /// stdin ends: the pipe closes (on drop), a terminal reads its EOF
    /// character.
    fn eof(self) -> io::Result<()> {
        match self {
            Sink::Pipe(_) => Ok(()),
            Sink::Tty(mut t) => {
                let c = pty::eof_char(&t);
                t.write_all(&[c])
            }
        }
    }

    fn resize(&self, rows: u16, cols: u16) -> io::Result<()> {
        match self {
            Sink::Pipe(_) => Ok(()),
            Sink::Tty(t) => pty::set_size(t, rows, cols),
        }
    }
}

/// The master's duplicate the input writes to.
pub fn master_sink(master: &File) -> io::Result<Sink> {
    let fd: OwnedFd = pty::dup(master)?;
    Ok(Sink::Tty(File::from(fd)))
}
