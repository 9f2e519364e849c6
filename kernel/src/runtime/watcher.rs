//! File-event dispatch: one inotify watch per run's `.ops` directory; an
//! event on `<id>.code` or `<id>.pid` wakes that op's observer at once.
//! Polling remains only as the observers' safety net.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use notify::{RecursiveMode, Watcher};

use crate::base::sync::Lock;
use crate::runtime::inbox::{Inbox, Wake};

type Wakers = Arc<Lock<HashMap<String, Arc<Inbox>>>>;

/// The kernel's one inotify watcher: `.ops` dirs watched, op ids mapped to
/// their observers' inboxes.
pub struct OpsWatcher {
    watcher: Lock<Option<notify::RecommendedWatcher>>,
    watched: Lock<HashSet<PathBuf>>,
    wakers: Wakers,
}

impl OpsWatcher {
    /// Starts the watcher; without inotify it logs a warning and observers rely
    /// on polling.
    pub fn new() -> OpsWatcher {
        let wakers: Wakers = Arc::default();
        let dispatch = wakers.clone();
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let Ok(event) = res else { return };
            tracing::trace!(?event, "inotify");
            for path in &event.paths {
                wake_for(&dispatch, path);
            }
        })
        .map_err(|e| tracing::warn!(%e, "file events unavailable; observers fall back to polling"))
        .ok();
        OpsWatcher {
            watcher: Lock::new(watcher),
            watched: Lock::default(),
            wakers,
        }
    }

    /// Watches a run's `.ops` directory (idempotent).
    pub fn watch(&self, dir: &Path) {
        let mut watched = self.watched.lock();
        if watched.contains(dir) {
            return;
        }
        if let Some(w) = self.watcher.lock().as_mut() {
            match w.watch(dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    watched.insert(dir.to_owned());
                }
                Err(e) => tracing::warn!(%e, dir = %dir.display(), "cannot watch ops dir"),
            }
        }
    }

    /// Forgets a directory (after its scratch dir was removed).
    pub fn unwatch(&self, dir: &Path) {
        let mut watched = self.watched.lock();
        if watched.remove(dir) {
            if let Some(w) = self.watcher.lock().as_mut() {
                let _ = w.unwatch(dir);
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

fn wake_for(wakers: &Wakers, path: &Path) {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
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

    #[tokio::test]
    async fn a_renamed_code_file_wakes_its_op_every_time() {
        let dir = std::env::temp_dir().join(format!("opk-watch-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let watcher = OpsWatcher::new();
        watcher.watch(&dir);
        let mut slow = Vec::new();
        for i in 0..200 {
            let id = uuid::Uuid::new_v4().to_string();
            let inbox = Arc::new(Inbox::default());
            watcher.register(&id, inbox.clone());
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
}
