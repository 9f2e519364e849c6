//! Waits of a call on an op's observer.

use std::time::Duration;

use super::{ApiError, ApiResult, AppState};
use crate::store::Op;

/// The op's row once its observer is done (it settled), or `budget` ran
/// out (it still lives): whichever comes first.
pub(super) async fn after_observer(k: &AppState, id: &str, budget: Duration) -> ApiResult<Op> {
    let deadline = tokio::time::Instant::now() + budget;
    let _ = tokio::time::timeout_at(deadline, k.wait_observer_done(id)).await;
    loop {
        let op = k
            .store
            .get_op(id)
            .await?
            .ok_or_else(|| ApiError::internal("operation vanished"))?;
        // another cluster node runs it, or this node's observer stopped
        // short (its lease not held: the hand-off starts another): its end
        // is read from the control plane
        if op.status.is_terminal() || tokio::time::Instant::now() >= deadline {
            return Ok(op);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The end of the op's output (at most 64 KiB) and its log's size, for a
/// foreground answer. Another node's op: its log is there, and the row
/// keeps its output's end once settled (`read_output` reaches a live one).
pub(super) fn output_so_far(k: &AppState, op: &Op) -> (String, u64) {
    if !k.runs_here(op.node.as_deref()) {
        return (op.output_tail.clone().unwrap_or_default(), 0);
    }
    k.backend
        .ops_dir(&op.scratch_key)
        .log_tail(&op.id, 64 * 1024)
        .map(|(bytes, size)| (String::from_utf8_lossy(&bytes).into_owned(), size))
        .unwrap_or_default()
}
