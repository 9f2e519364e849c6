//! One write at a time per op to its stdin (SPEC §25).

use std::collections::HashMap;
use std::sync::Arc;

use crate::base::sync::Lock;

/// One write at a time per op: the frames of two writes never interleave.
#[derive(Default)]
pub struct OpInputs {
    map: Lock<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl OpInputs {
    /// Waits for the op's turn to write; held until the guard drops.
    pub async fn turn(&self, op_id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut map = self.map.lock();
            // ops no write holds are forgotten
            map.retain(|_, l| Arc::strong_count(l) > 1);
            map.entry(op_id.to_owned()).or_default().clone()
        };
        lock.lock_owned().await
    }
}
