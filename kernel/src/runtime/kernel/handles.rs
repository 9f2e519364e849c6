//! Each live op's handle in this process: its observer's inbox and a
//! "done" signal. At most one handle per op: holding it is what makes an
//! observer the op's one observer here.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::watch;

use crate::base::sync::Lock;
use crate::runtime::inbox::{Inbox, Wake};

/// Per live op: its observer's inbox and a "done" signal.
pub struct OpHandle {
    /// Where every wake of the op is posted.
    pub inbox: Arc<Inbox>,
    done: watch::Sender<bool>,
}

/// The handles of the ops this kernel observes now.
#[derive(Default)]
pub struct OpHandles {
    map: Lock<HashMap<String, Arc<OpHandle>>>,
}

impl OpHandles {
    /// The op's handle, when it has an observer here.
    pub fn get(&self, op_id: &str) -> Option<Arc<OpHandle>> {
        self.map.lock().get(op_id).cloned()
    }

    /// A new handle for an op, or `None` when it already has one.
    pub fn claim(&self, op_id: &str) -> Option<Arc<OpHandle>> {
        let mut map = self.map.lock();
        if map.contains_key(op_id) {
            return None;
        }
        let handle = Arc::new(OpHandle {
            inbox: Arc::new(Inbox::default()),
            done: watch::channel(false).0,
        });
        map.insert(op_id.to_owned(), handle.clone());
        Some(handle)
    }

    /// Drops the op's handle and tells its waiters.
    pub fn release(&self, op_id: &str) {
        if let Some(h) = self.map.lock().remove(op_id) {
            let _ = h.done.send(true);
        }
    }

    /// Resolves once the op has no handle (it is terminal, or this kernel
    /// does not observe it).
    pub async fn wait_released(&self, op_id: &str) {
        let Some(handle) = self.get(op_id) else {
            return;
        };
        let mut rx = handle.done.subscribe();
        let _ = rx.wait_for(|done| *done).await;
    }

    /// Posts a wake to an op's observer; false when it has none here.
    pub fn post(&self, op_id: &str, wake: Wake) -> bool {
        self.get(op_id).map(|h| h.inbox.post(wake)).is_some()
    }

    /// Posts a wake to every observer here.
    pub fn post_all(&self, wake: Wake) {
        for handle in self.map.lock().values() {
            handle.inbox.post(wake);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_op_has_at_most_one_handle() {
        let handles = OpHandles::default();
        let first = handles.claim("op");
        assert!(first.is_some());
        assert!(
            handles.claim("op").is_none(),
            "a second observer was let in"
        );
        assert!(handles.post("op", Wake::Kill));
        assert!(!handles.post("other", Wake::Kill));
        handles.release("op");
        // released: waiters are told at once, and a new observer may come
        handles.wait_released("op").await;
        assert!(handles.claim("op").is_some());
    }
}
