//! File-event dispatch: one inotify watch per run's `.ops` directory; an
//! event on `<id>.code` or `<id>.pid` wakes that op's observer at once.
//! Polling remains only as the observers' safety net.
//!
//! The watches ask only for what the shim's files announce: a file renamed
//! into place (`.pid` and `.code` are written to a temporary name first) or
//! closed after writing. Opens, reads and modifications of the directory's
//! other files (each log write, the kernel's own reads of `.pid`) are not
//! asked for: each was a wake-up of the reader and, for a `.pid` the
//! observer was reading, of the observer itself.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};

use crate::base::sync::Lock;
use crate::runtime::inbox::{Inbox, Wake};

type Wakers = Arc<Lock<HashMap<String, Arc<Inbox>>>>;

/// What a watch asks for (an overflow of the event queue comes anyway).
const MASK: WatchMask = WatchMask::MOVED_TO.union(WatchMask::CLOSE_WRITE);

/// The kernel's one inotify instance: `.ops` dirs watched, op ids mapped
/// to their observers' inboxes. Its events are read on the runtime, by a
/// task that ends when the watcher is dropped.
pub struct OpsWatcher {
    watches: Lock<Option<Watches>>,
    watched: Lock<HashMap<PathBuf, WatchDescriptor>>,
    wakers: Wakers,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl OpsWatcher {
    /// Starts the watcher (inside the runtime); without inotify it logs a
    /// warning and observers rely on polling.
    pub fn new() -> OpsWatcher {
        let wakers: Wakers = Arc::default();
        let started = Inotify::init().and_then(|inotify| {
            let events = inotify.into_event_stream([0u8; 4096])?;
            Ok((events.watches(), events))
        });
        let (watches, reader) = match started {
            Ok((watches, events)) => (
                Some(watches),
                Some(tokio::spawn(read(events, wakers.clone()))),
            ),
            Err(e) => {
                tracing::warn!(%e, "file events unavailable; observers fall back to polling");
                (None, None)
            }
        };
        OpsWatcher {
            watches: Lock::new(watches),
            watched: Lock::default(),
            wakers,
            reader,
        }
    }

    /// Watches a run's `.ops` directory (idempotent).
    pub fn watch(&self, dir: &Path) {
        let mut watched = self.watched.lock();
        if watched.contains_key(dir) {
            return;
        }
        if let Some(w) = self.watches.lock().as_mut() {
            match w.add(dir, MASK) {
                Ok(wd) => {
                    watched.insert(dir.to_owned(), wd);
                }
                Err(e) => tracing::warn!(%e, dir = %dir.display(), "cannot watch ops dir"),
            }
        }
    }

    /// Forgets a directory (after its scratch dir was removed).
    pub fn unwatch(&self, dir: &Path) {
        let mut watched = self.watched.lock();
        if let Some(wd) = watched.remove(dir) {
            if let Some(w) = self.watches.lock().as_mut() {
                // gone with its directory already, or removed now
                let _ = w.remove(wd);
            }
        }
    }

    /// Registers the inbox of an op; file events for it post [`Wake::File`].
    pub fn register(&self, op_id: &str, inbox: Arc<Inbox>) {
        self.wakers.lock().insert(op_id.to_owned(), inbox);
    }

    /// Stops routing file events to the op's inbox (its observer ended).
    pub fn unregister(&self, op_id: &str) {
        self.wakers.lock().remove(op_id);
    }
}

impl Default for OpsWatcher {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for OpsWatcher {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
    }
}

/// Reads the events until the stream fails; an overflow (events were
/// dropped) wakes every registered op, whose observers then read their
/// files.
async fn read(mut events: inotify::EventStream<[u8; 4096]>, wakers: Wakers) {
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                tracing::warn!(%e, "file events stopped; observers fall back to polling");
                return;
            }
        };
        if event.mask.contains(EventMask::Q_OVERFLOW) {
            tracing::warn!("file event queue overflowed: every observer looks at its files");
            let inboxes: Vec<Arc<Inbox>> = wakers.lock().values().cloned().collect();
            for inbox in inboxes {
                inbox.post(Wake::File);
            }
        } else if let Some(name) = &event.name {
            wake_for(&wakers, name);
        }
    }
}

fn wake_for(wakers: &Wakers, name: &OsStr) {
    let Some(name) = name.to_str() else {
        return;
    };
    let Some((op_id, ext)) = name.split_once('.') else {
        return;
    };
    if ext != "code" && ext != "pid" {
        return;
    }
    let known = wakers
        .lock()
        .get(op_id)
        .map(|inbox| inbox.post(Wake::File))
        .is_some();
    tracing::debug!(file = name, known, "ops file event");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A fresh directory, watched by a new watcher.
    fn watched_dir() -> (PathBuf, OpsWatcher) {
        let dir = std::env::temp_dir().join(format!("opk-watch-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let watcher = OpsWatcher::new();
        watcher.watch(&dir);
        (dir, watcher)
    }

    /// A new op id and the inbox its file events wake.
    fn registered(watcher: &OpsWatcher) -> (String, Arc<Inbox>) {
        let id = uuid::Uuid::new_v4().to_string();
        let inbox = Arc::new(Inbox::default());
        watcher.register(&id, inbox.clone());
        (id, inbox)
    }

    #[tokio::test]
    async fn a_renamed_code_file_wakes_its_op_every_time() {
        let (dir, watcher) = watched_dir();
        let mut slow = Vec::new();
        for i in 0..200 {
            let (id, inbox) = registered(&watcher);
            // the wrapper's pattern: a pid file, then code via temp file + rename
            std::fs::write(dir.join(format!("{id}.pid")), "1 2 h\n").unwrap();
            assert!(inbox.wait(Duration::from_secs(2)).await.has(Wake::File));
            // drain the pid file's further events, so only the rename can wake it below
            while inbox.wait(Duration::from_millis(5)).await != crate::runtime::inbox::Wakes::NONE {
            }
            std::fs::write(dir.join(format!("{id}.code.tmp")), "0\n").unwrap();
            std::fs::rename(
                dir.join(format!("{id}.code.tmp")),
                dir.join(format!("{id}.code")),
            )
            .unwrap();
            let began = std::time::Instant::now();
            if !inbox.wait(Duration::from_secs(2)).await.has(Wake::File)
                || began.elapsed() > Duration::from_millis(200)
            {
                slow.push((i, began.elapsed()));
            }
            watcher.unregister(&id);
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(slow.is_empty(), "missed or slow wake-ups: {slow:?}");
    }

    #[tokio::test]
    async fn reading_an_op_file_wakes_nobody() {
        let (dir, watcher) = watched_dir();
        let (id, inbox) = registered(&watcher);
        let pid = dir.join(format!("{id}.pid"));
        std::fs::write(&pid, "1 2 h\n").unwrap();
        assert!(inbox.wait(Duration::from_secs(2)).await.has(Wake::File));
        while inbox.wait(Duration::from_millis(20)).await != crate::runtime::inbox::Wakes::NONE {}
        // what an observer's every step does: read the pid file
        for _ in 0..5 {
            assert_eq!(std::fs::read_to_string(&pid).unwrap(), "1 2 h\n");
        }
        let woken = inbox.wait(Duration::from_millis(200)).await;
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            woken,
            crate::runtime::inbox::Wakes::NONE,
            "a read woke the op"
        );
    }
}
