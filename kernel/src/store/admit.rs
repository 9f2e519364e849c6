//! The admit transaction script: one start of an op, in one IMMEDIATE
//! transaction, in this order: the run tree's lock (its root's row on
//! PostgreSQL), the idempotency key (a retry finds its op), the run's state
//! and budgets on its chain, the run's existence (a run token never
//! recreates a purged run), the envelope limits over each subtree and the
//! kernel-wide limit, then the row (`starting`, or `awaiting_approval`
//! under an approval hold) with its `tool.started` (and
//! `approval.requested`) events. Writes nothing unless it admits.

use super::admission::{Admission, Counted};
use super::db::Tx;
use super::journal::append_event;
use super::ops::{get, NewOp, StartRequest};
use super::{now_ms, Store, StoreError, StoreResult};
use crate::event_kind::{ApprovalRequested, EventKind, ToolStarted};
use crate::lifecycle::{live_sql, Status};
use crate::vals;

/// Why a new op of `run_id` may not be admitted now, if it may not: its
/// run tree's live-op limits (the run's and every ancestor's, each over
/// its subtree), then the kernel-wide one.
fn admission_refusal(
    tx: &mut dyn Tx,
    run_id: &str,
    limits: Admission,
) -> StoreResult<Option<String>> {
    if let Some(refusal) = super::admission::tree_limit_refusal(tx, run_id, Counted::Ops, limits)? {
        return Ok(Some(refusal));
    }
    // an index-only count through the partial index of live statuses
    let sql = format!("SELECT COUNT(*) FROM ops WHERE status IN ({})", live_sql());
    let total = tx.scalar::<i64>(&sql, &[])? as u64;
    Ok((total >= limits.max_live).then(|| {
        format!(
            "the kernel already has {total} live operations (limit {})",
            limits.max_live
        )
    }))
}

/// Inserts a start inside the caller's transaction: the run tree's lock,
/// the idempotency key (a retry finds its op), then admission (the run's
/// state and budgets, the live-op limits), then the row
/// (`awaiting_approval` when the request carries an approval hold, else
/// `starting`) with its events. Writes nothing unless it returns `Created`.
pub(super) fn insert_in(
    tx: &mut dyn Tx,
    req: &StartRequest,
    limits: Admission,
) -> StoreResult<NewOp> {
    // locks the tree of the op's run (its root's row): the admissions,
    // settlements, cancels and drains of one tree are serialized
    super::tree::lock_tree_of(tx, &req.run_id)?;
    let request_sha = req.fingerprint();
    if let Some(key) = &req.idempotency_key {
        let seen = tx.query_opt(
            "SELECT id, request_sha256 FROM ops WHERE run_id = ?1 AND idempotency_key = ?2",
            vals![&req.run_id, key],
        )?;
        if let Some(row) = seen {
            let (id, sha): (String, String) = (row.get("id")?, row.get("request_sha256")?);
            if sha != request_sha {
                return Ok(NewOp::KeyConflict(id));
            }
            let op = get(tx, &id)?.ok_or_else(|| StoreError::Corrupt(id.clone()))?;
            return Ok(NewOp::Existing(op));
        }
    }
    let now = now_ms();
    // the run's state and budgets are read in this transaction: a pause,
    // cancel or usage fact commits before or after it, whole
    if let Some(refusal) = super::admission::run_refusal(tx, &req.run_id)? {
        return Ok(NewOp::Refused(refusal));
    }
    if !limits.implicit_run && super::runs::get_run(tx, &req.run_id)?.is_none() {
        return Ok(NewOp::Refused(super::Refusal::NoRun(req.run_id.clone())));
    }
    if let Some(refusal) = admission_refusal(tx, &req.run_id, limits)? {
        return Ok(NewOp::Refused(super::Refusal::Limit(refusal)));
    }
    super::runs::ensure_top_level(tx, &req.run_id, now)?;
    // a new op reopens a finished run: its container is needed again
    tx.execute(
        "UPDATE runs SET finished_at = NULL WHERE run_id = ?1 AND finished_at IS NOT NULL",
        vals![&req.run_id],
    )?;
    let id = insert_row(tx, req, &request_sha, now)?;
    started_events(tx, &id, req)?;
    let op = get(tx, &id)?.ok_or_else(|| StoreError::Corrupt(id.clone()))?;
    Ok(NewOp::Created(op))
}

/// The row of an admitted start; its new id.
fn insert_row(
    tx: &mut dyn Tx,
    req: &StartRequest,
    request_sha: &str,
    now: i64,
) -> StoreResult<String> {
    let id = uuid::Uuid::new_v4().to_string();
    let status = match req.approval {
        Some(_) => Status::AwaitingApproval,
        None => Status::Starting,
    };
    let hold = req.approval.as_ref();
    let command =
        serde_json::to_string(&req.command).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    tx.execute(
        "INSERT INTO ops (id, run_id, command, background, timeout_sec, status, scratch_key, \
         created_at, idempotency_key, request_sha256, approval_rule, approval_timeout_sec, \
         approval_on_timeout, schedule_id) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
        vals![
            &id,
            &req.run_id,
            command,
            req.background,
            req.timeout_sec as i64,
            status.as_str(),
            &req.scratch_key,
            now,
            &req.idempotency_key,
            request_sha,
            hold.map(|h| h.rule.clone()),
            hold.and_then(|h| h.timeout_sec).map(|t| t as i64),
            hold.map(|h| h.on_timeout.as_str()),
            &req.schedule_id,
        ],
    )?;
    Ok(id)
}

/// The events of an admitted start: `tool.started`, and
/// `approval.requested` when an approval rule holds it.
fn started_events(tx: &mut dyn Tx, id: &str, req: &StartRequest) -> StoreResult<()> {
    let argv =
        crate::report_text::bounded_argv(&req.command, crate::report_text::MAX_VIEW_ARGV_BYTES).0;
    let started = ToolStarted {
        command: argv,
        background: req.background,
        timeout_sec: req.timeout_sec,
        schedule_id: req.schedule_id.clone(),
    };
    append_event(tx, &req.run_id, Some(id), EventKind::ToolStarted(started))?;
    if let Some(hold) = &req.approval {
        let requested = ApprovalRequested {
            rule: hold.rule.clone(),
            timeout_sec: hold.timeout_sec,
            on_timeout: hold.on_timeout,
        };
        append_event(
            tx,
            &req.run_id,
            Some(id),
            EventKind::ApprovalRequested(requested),
        )?;
    }
    Ok(())
}

impl Store {
    /// Admits a start in one transaction (idempotency key, admission, the
    /// row and its events); writes only when it returns `Created`.
    pub async fn insert_op(&self, req: StartRequest, limits: Admission) -> StoreResult<NewOp> {
        self.write(move |tx| insert_in(tx, &req, limits)).await
    }
}
