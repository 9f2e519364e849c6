//! File-event dispatch: one inotify watch per run's `.ops` directory; an
//! event on `<id>.code` or `<id>.pid` wakes that op's observer at once.
//! Polling remains only as the observers' safety net.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use notify::{RecursiveMode, Watcher};
use tokio::sync::Notify;

type Wakers = Arc<Mutex<HashMap<String, Arc<Notify>>>>;

pub struct OpsWatcher {
    watcher: Mutex<Option<notify::RecommendedWatcher>>,
    watched: Mutex<HashSet<PathBuf>>,
    wakers: Wakers,
}

impl OpsWatcher {
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
            watcher: Mutex::new(watcher),
            watched: Mutex::default(),
            wakers,
        }
    }

    /// Watches a run's `.ops` directory (idempotent).
    pub fn watch(&self, dir: &Path) {
        let Ok(mut watched) = self.watched.lock() else {
            return;
        };
        if watched.contains(dir) {
            return;
        }
        let Ok(mut guard) = self.watcher.lock() else {
            return;
        };
        if let Some(w) = guard.as_mut() {
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
        if let (Ok(mut watched), Ok(mut guard)) = (self.watched.lock(), self.watcher.lock()) {
            if watched.remove(dir) {
                if let Some(w) = guard.as_mut() {
                    let _ = w.unwatch(dir);
                }
            }
        }
    }

    /// Registers the waker of an op; file events for it call `notify_one`.
    pub fn register(&self, op_id: &str, waker: Arc<Notify>) {
        if let Ok(mut map) = self.wakers.lock() {
            map.insert(op_id.to_owned(), waker);
        }
    }

    pub fn unregister(&self, op_id: &str) {
        if let Ok(mut map) = self.wakers.lock() {
            map.remove(op_id);
        }
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
    if let Ok(map) = wakers.lock() {
        let known = map.get(op_id).map(|waker| waker.notify_one()).is_some();
        tracing::debug!(file = name, known, "ops file event");
    }
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
            let waker = Arc::new(Notify::new());
            watcher.register(&id, waker.clone());
            // the wrapper's pattern: a pid file, then code via temp file + rename
            std::fs::write(dir.join(format!("{id}.pid")), "1 2 h\n").unwrap();
            tokio::time::timeout(Duration::from_secs(2), waker.notified())
                .await
                .unwrap();
            std::fs::write(dir.join(format!("{id}.code.tmp")), "0\n").unwrap();
            std::fs::rename(
                dir.join(format!("{id}.code.tmp")),
                dir.join(format!("{id}.code")),
            )
            .unwrap();
            let began = std::time::Instant::now();
            if tokio::time::timeout(Duration::from_secs(2), waker.notified())
                .await
                .is_err()
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
