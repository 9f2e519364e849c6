//! Blocking ends of bounded channels: a file thread reads an upload from
//! the HTTP body, or writes a download into it, a chunk at a time (memory
//! stays bounded by the channel whatever the size).

use bytes::Bytes;
use tokio::sync::mpsc;

/// Reads what the async side sends, until it closes the channel; an error
/// it sends ends the read with that error.
#[derive(Debug)]
pub struct ChannelReader {
    rx: mpsc::Receiver<std::io::Result<Bytes>>,
    chunk: Bytes,
}

impl ChannelReader {
    /// A reader of `rx`.
    pub fn new(rx: mpsc::Receiver<std::io::Result<Bytes>>) -> Self {
        ChannelReader {
            rx,
            chunk: Bytes::new(),
        }
    }
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => self.chunk = chunk,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}

/// Sends what is written, in chunks of at most 256 KiB; a closed channel
/// (the client went away) is a broken pipe.
#[derive(Debug)]
pub struct ChannelWriter {
    tx: mpsc::Sender<std::io::Result<Bytes>>,
    buf: Vec<u8>,
}

const CHUNK: usize = 256 << 10;

impl ChannelWriter {
    /// A writer into `tx`.
    pub fn new(tx: mpsc::Sender<std::io::Result<Bytes>>) -> Self {
        ChannelWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
        }
    }

    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }

    /// Ends the stream with an error the reader sees.
    pub fn fail(mut self, e: std::io::Error) {
        self.buf.clear();
        let _ = self.tx.blocking_send(Err(e));
    }
}

impl std::io::Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}
