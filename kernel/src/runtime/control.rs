//! The control layer: every change by the API or the scheduler that an
//! op's observer must act on goes through here. Each function does the
//! store transaction, then starts (or wakes) the op's supervised observer
//! and wakes the run's report waiters, so no caller can leave an op in
//! `starting` without an observer. The API, the scheduler and (through the
//! API) MCP call only this; observers are spawned from nowhere else but
//! recovery and the watchdog (`limits_tests`' check names the allowed
//! places); a cluster node's hand-off comes here too. Results that need no observer (settlements, notes, acks, an
//! approval's timeout) wake their waiters where they are written.

use std::sync::Arc;

use crate::lifecycle::KillReason;
use crate::runs::RunAction;
use crate::runtime::kernel::Kernel;
use crate::store::{
    Admission, ApprovalHold, Fire, NewOp, Op, Refusal, RunChange, StartRequest, StoreError,
    StoreResult,
};

/// Hands an op the store just inserted (`fresh`: its launch is ours) or
/// found again to its supervised observer; a held or terminal op has none.
/// An op placed on another cluster node has its observer there (the
/// store's transaction hinted it to that node).
fn observe(k: &Arc<Kernel>, op: &Op, fresh: bool) {
    if !k.runs_here(op.node.as_deref()) {
        return;
    }
    match (op.status.is_observed(), fresh) {
        (false, _) => {}
        (true, true) => crate::runtime::observer::spawn_fresh(k, op.clone()),
        (true, false) => crate::runtime::observer::spawn(k, op.id.clone()),
    }
}

/// Admits a start (one transaction: idempotency, run state, budgets,
/// limits, the row and its events) and hands an observed op to its
/// supervised observer: a fresh one launches it, a retry's finds the one
/// already running (or attaches). A held op waits for an approval.
pub async fn start_op(k: &Arc<Kernel>, req: StartRequest, limits: Admission) -> StoreResult<NewOp> {
    let new = k.store.insert_op(req, limits).await?;
    match &new {
        NewOp::Created(op) => observe(k, op, true),
        NewOp::Existing(op) => observe(k, op, false),
        _ => {}
    }
    Ok(new)
}

/// Records a durable kill request and wakes the op's observer (starting
/// one if this kernel has none): TERM, grace, KILL, identity-checked.
/// `None` when the op is unknown.
/// When the store went away mid-write (the answer is 503), the request may
/// have been recorded all the same: the observer is woken anyway, and
/// re-reads the row (or, the store still away, its next attempt does).
pub async fn kill(k: &Arc<Kernel>, op_id: &str, reason: KillReason) -> StoreResult<Option<Op>> {
    let op = k.store.request_kill(op_id, reason).await.inspect_err(|e| {
        if matches!(e, StoreError::Unavailable(_)) {
            k.poke_kill(op_id)
        }
    })?;
    crate::runtime::observer::spawn(k, op_id.to_owned());
    k.poke_kill(op_id);
    Ok(op)
}

/// A run's state change (compare-and-set with its events; a cancel's
/// cascade included), then the kills it requested are carried out by the
/// ops' observers and the changed runs' waiters are woken. When the store
/// went away mid-write, a cancel may have been recorded all the same:
/// every observer here is woken to re-read its row (a wake is a hint; one
/// with no kill recorded does nothing), so a recorded cancel is carried
/// out without waiting for the client's retry.
pub async fn change_run(
    k: &Arc<Kernel>,
    run_id: &str,
    action: RunAction,
    by: &str,
    summary: Option<String>,
) -> StoreResult<RunChange> {
    let change = k
        .store
        .change_run(run_id, action, by, summary)
        .await
        .inspect_err(|e| {
            if matches!(e, StoreError::Unavailable(_)) {
                k.handles.post_all(crate::runtime::inbox::Wake::Kill)
            }
        })?;
    if let RunChange::Done { changed, kills, .. } = &change {
        for id in kills {
            crate::runtime::observer::spawn(k, id.clone());
            k.poke_kill(id);
        }
        // a denied op is a result for its run's next report: its run is
        // among those changed (a waiting op is denied when its run is
        // cancelled)
        for id in changed {
            k.bump_run(id);
        }
        // a cancel reaches what lost ops of those runs may still run
        if action == RunAction::Cancel {
            let (k, runs) = (k.clone(), changed.clone());
            tokio::spawn(async move { crate::runtime::stop::stop_lost_of_runs(&k, &runs).await });
        }
    }
    Ok(change)
}

/// Approves a waiting op (compare-and-set, the run re-checked): it starts
/// like a new one, through its own observer.
pub async fn approve(k: &Arc<Kernel>, op_id: &str) -> StoreResult<Result<Option<Op>, Refusal>> {
    let approved = k.store.approve_op(op_id).await?;
    if let Ok(Some(op)) = &approved {
        tracing::info!(op = %op.id, run = %op.run_id, "approved");
        observe(k, op, true);
    }
    Ok(approved)
}

/// Denies a waiting op (compare-and-set): it ends `denied`, a result for
/// its run's next report. False when it was not waiting.
pub async fn deny(k: &Arc<Kernel>, op: &Op, reason: &str, by: &str) -> StoreResult<bool> {
    let denied = k.store.deny_op(&op.id, reason, by).await?;
    if denied {
        k.bump_run(&op.run_id);
    }
    Ok(denied)
}

/// Fires one due time of a schedule (claim and admission in one
/// transaction) and hands its op to an observer.
pub async fn fire_schedule(
    k: &Arc<Kernel>,
    schedule_id: &str,
    due: i64,
    hold: Option<ApprovalHold>,
    limits: Admission,
) -> StoreResult<Fire> {
    let fire = k
        .store
        .fire_schedule(schedule_id, due, &k.id, hold, limits)
        .await?;
    match &fire {
        Fire::Fired(op) => observe(k, op, true),
        Fire::Adopted(op) => observe(k, op, false),
        _ => {}
    }
    Ok(fire)
}

/// An op placed on this node (by another node's hint or found by the
/// hand-off's scan) gets its observer here, unless one runs already or the
/// node is fenced (its claim would be refused; one already observing goes
/// on). The observer re-reads the row: an op not placed here is left alone.
pub fn take_placed(k: &Arc<Kernel>, op_id: &str) {
    if k.may_start() && !k.observes(op_id) {
        crate::runtime::observer::spawn(k, op_id.to_owned());
    }
}
