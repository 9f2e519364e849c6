//! What the transports tell a session's [`Ledger`] about the answers they
//! wrote out: the evidence behind [`super::ack`].
//!
//! Both transports write JSON-RPC messages one per line: stdio as
//! newline-delimited JSON, streamable HTTP as SSE `data:` lines (rmcp
//! writes each message as one line of JSON). A [`Scanner`] picks out the
//! answers carrying a report (`result.structuredContent.report_id`); the
//! wrappers here take a tick of the session's clock when such a line is
//! handed to the transport and record it delivered once the write held:
//!
//! - [`TrackedBody`] wraps the SSE body of an HTTP session's response
//!   (a POST's stream, or a GET stream a response fell back to or was
//!   resumed on). A frame is handed to hyper when hyper polls it; the
//!   write held when hyper polls the body again (it encoded the frame, and
//!   flushed it whenever its buffer filled). A connection hyper finds
//!   closed (the client hung up: hyper reads EOF mid-message) drops the
//!   body instead, before or after the frame: then nothing is delivered.
//! - [`TrackedWriter`] wraps stdout for `opkernel mcp`: a line is handed
//!   over when `poll_write` takes its last byte, and held when the next
//!   flush succeeds (the bytes are in the pipe to the host).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Bytes;
use futures::Stream;
use serde::Deserialize;

use super::ack::Ledger;
use crate::base::sync::Lock;

/// The ledger of the session a transport writes for, looked up when it is
/// needed (an HTTP session's handler exists only after its first call).
pub type LedgerOf = Arc<dyn Fn() -> Option<Arc<Lock<Ledger>>> + Send + Sync>;

/// A line longer than this is not examined (its report, if any, counts
/// as not delivered and is served again).
const MAX_LINE: usize = 64 << 20;

/// The parts of a JSON-RPC answer that say which report it carries.
#[derive(Deserialize)]
struct Message {
    result: Option<ToolResult>,
}

#[derive(Deserialize)]
struct ToolResult {
    #[serde(rename = "structuredContent")]
    structured: Option<Structured>,
}

#[derive(Deserialize)]
struct Structured {
    report_id: Option<String>,
}

/// The byte a JSON object starts with (an opening curly bracket), by
/// value: no bracket in the source to upset a line counter.
const OBJECT_START: u8 = 0x7B;

/// The report an answer line carries: a JSON-RPC result (bare, or as an
/// SSE `data:` line) whose structured content has a `report_id`.
pub fn report_in(line: &[u8]) -> Option<String> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let json = match line.strip_prefix(b"data:") {
        Some(data) => data.strip_prefix(b" ").unwrap_or(data),
        None => line,
    };
    // an object mentioning a report id, cheaply, before parsing it
    let object = json.first() == Some(&OBJECT_START);
    if !object || !json.windows(11).any(|w| w == b"\"report_id\"") {
        return None;
    }
    serde_json::from_slice::<Message>(json)
        .ok()?
        .result?
        .structured?
        .report_id
}

/// Cuts written bytes into lines and picks out the reports they carry.
#[derive(Default)]
pub struct Scanner {
    line: Vec<u8>,
    /// The current line grew past [`MAX_LINE`]: skipped to its end.
    skipping: bool,
}

impl Scanner {
    /// Takes the next bytes; returns the reports of the lines they ended.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Vec<String> {
        let mut found = Vec::new();
        while !bytes.is_empty() {
            let (part, ended) = match bytes.iter().position(|b| *b == b'\n') {
                Some(nl) => (&bytes[..nl], true),
                None => (bytes, false),
            };
            bytes = &bytes[(part.len() + usize::from(ended)).min(bytes.len())..];
            // a whole line in one write (the usual SSE frame): read in place
            if ended && self.line.is_empty() && !self.skipping {
                found.extend(report_in(part));
                continue;
            }
            if !self.skipping {
                if self.line.len() + part.len() > MAX_LINE {
                    self.skipping = true;
                    self.line = Vec::new();
                } else {
                    self.line.extend_from_slice(part);
                }
            }
            if ended {
                if !self.skipping {
                    found.extend(report_in(&self.line));
                }
                self.line.clear();
                self.skipping = false;
            }
        }
        found
    }
}

/// Answers handed to a transport and not yet known to have held.
struct Handed {
    ledger: LedgerOf,
    scanner: Scanner,
    waiting: Vec<(String, u64)>,
}

impl Handed {
    fn new(ledger: LedgerOf) -> Handed {
        Handed {
            ledger,
            scanner: Scanner::default(),
            waiting: Vec::new(),
        }
    }

    /// Bytes handed to the transport: each report among them takes a tick.
    fn hand(&mut self, bytes: &[u8]) {
        let reports = self.scanner.feed(bytes);
        if reports.is_empty() {
            return;
        }
        let Some(ledger) = (self.ledger)() else {
            return;
        };
        let mut ledger = ledger.lock();
        for report in reports {
            let at = ledger.tick();
            self.waiting.push((report, at));
        }
    }

    /// The writes handed so far held.
    fn held(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        let Some(ledger) = (self.ledger)() else {
            self.waiting.clear();
            return;
        };
        let mut ledger = ledger.lock();
        for (report, at) in self.waiting.drain(..) {
            ledger.delivered(&report, at);
        }
    }

    /// The writes handed so far failed: nothing of them was delivered.
    fn failed(&mut self) {
        self.waiting.clear();
    }
}

/// An HTTP session's SSE response body, telling the session which reports
/// reached its client (see the module doc).
pub struct TrackedBody<S> {
    inner: S,
    handed: Handed,
    ended: bool,
}

impl<S> TrackedBody<S> {
    /// Wraps `inner`, reporting its report frames to the session `ledger`
    /// finds.
    pub fn new(inner: S, ledger: LedgerOf) -> Self {
        TrackedBody {
            inner,
            handed: Handed::new(ledger),
            ended: false,
        }
    }
}

impl<S, E> Stream for TrackedBody<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    type Item = Result<Bytes, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        // hyper came back for more: what it took before is written (or in
        // its buffer, on a connection it had not found closed)
        this.handed.held();
        let next = Pin::new(&mut this.inner).poll_next(cx);
        match &next {
            Poll::Ready(Some(Ok(bytes))) => this.handed.hand(bytes),
            Poll::Ready(Some(Err(_))) | Poll::Ready(None) => this.ended = true,
            Poll::Pending => {}
        }
        next
    }
}

/// stdout of `opkernel mcp`, telling the session which reports reached the
/// host (see the module doc).
pub struct TrackedWriter<W> {
    inner: W,
    handed: Handed,
}

impl<W> TrackedWriter<W> {
    /// Wraps `inner`, reporting its report lines to the session `ledger`
    /// finds.
    pub fn new(inner: W, ledger: LedgerOf) -> Self {
        TrackedWriter {
            inner,
            handed: Handed::new(ledger),
        }
    }
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for TrackedWriter<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        match &written {
            Poll::Ready(Ok(n)) => this.handed.hand(&buf[..*n]),
            Poll::Ready(Err(_)) => this.handed.failed(),
            Poll::Pending => {}
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let flushed = Pin::new(&mut this.inner).poll_flush(cx);
        match &flushed {
            Poll::Ready(Ok(())) => this.handed.held(),
            Poll::Ready(Err(_)) => this.handed.failed(),
            Poll::Pending => {}
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[path = "delivery_tests.rs"]
mod tests;
