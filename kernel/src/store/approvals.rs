//! Approval gates (SPEC §16): an op held `awaiting_approval` is approved
//! (→ `starting`, then an ordinary launch) or denied (→ `denied`, nothing
//! ran), each by compare-and-set with its events; the approval timeout
//! escalates once or denies. Nothing here ever approves on its own.

use super::journal::append_event;
use super::ops::{get, op_from_row, COLUMNS};
use super::{now_ms, Op, Store, StoreError, StoreResult};
use crate::event_kind::{
    ApprovalDenied, ApprovalEscalated, ApprovalGranted, EventKind, ToolFailed,
};
use crate::lifecycle::Status;
use rusqlite::{params, Connection, TransactionBehavior};

/// Who denied an op: the operator (`POST .../deny`).
pub const BY_OPERATOR: &str = "operator";
/// Who denied an op: the approval timeout, with `on_timeout: "deny"`.
pub const BY_TIMEOUT: &str = "timeout";
/// Who denied an op: a `kill_operation` before approval.
pub const BY_KILL: &str = "kill";

/// Denies a waiting op inside the caller's transaction: `denied` with the
/// reason, `approval.denied` and `tool.failed` events. False when the op
/// was not waiting (approved, denied or never held).
pub(super) fn deny_in(conn: &Connection, id: &str, reason: &str, by: &str) -> StoreResult<bool> {
    let now = now_ms();
    let n = conn
        .prepare_cached(
            "UPDATE ops SET status = 'denied', error = ?2, finished_at = ?3, \
             approval_decided_by = ?4, approval_decided_at = ?3 \
             WHERE id = ?1 AND status = 'awaiting_approval'",
        )?
        .execute(params![id, reason, now, by])?;
    if n != 1 {
        return Ok(false);
    }
    let op = get(conn, id)?.ok_or_else(|| StoreError::Corrupt(id.to_owned()))?;
    let denied = ApprovalDenied {
        reason: reason.to_owned(),
        by: by.to_owned(),
    };
    append_event(
        conn,
        &op.run_id,
        Some(id),
        EventKind::ApprovalDenied(denied),
    )?;
    let failed = ToolFailed {
        background: op.background,
        status: Status::Denied.as_str().to_owned(),
        effect: None,
        exit_code: None,
        killed: false,
        error: Some(reason.to_owned()),
        op_seconds: None,
    };
    append_event(conn, &op.run_id, Some(id), EventKind::ToolFailed(failed))?;
    super::schedules::finalize_in(conn, &op)?;
    Ok(true)
}

/// Denies every waiting op of a run and its descendants (a cancel).
pub(super) fn deny_waiting_in_subtree(conn: &Connection, run_id: &str) -> StoreResult<Vec<String>> {
    let ids: Vec<String> = {
        let mut stmt = conn.prepare_cached(
            "SELECT id FROM ops WHERE status = 'awaiting_approval' AND run_id IN \
             (SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1) ORDER BY created_at",
        )?;
        let rows = stmt.query_map([run_id], |r| r.get(0))?;
        rows.collect::<Result<_, _>>()?
    };
    let mut denied = Vec::new();
    for id in ids {
        if deny_in(conn, &id, "cancelled before approval", BY_KILL)? {
            denied.push(id);
        }
    }
    Ok(denied)
}

/// What the approval timeout did to one waiting op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimeoutAction {
    /// `on_timeout: "deny"`: the op ended `denied` (`approval timed out`).
    Denied {
        /// The op.
        op_id: String,
        /// Its run.
        run_id: String,
    },
    /// `on_timeout: "escalate"`: `approval.escalated` was recorded and the
    /// op keeps waiting.
    Escalated {
        /// The op.
        op_id: String,
        /// Its run.
        run_id: String,
    },
}

impl Store {
    /// `awaiting_approval` → `starting` (by the operator), with
    /// `approval.granted`. The op as it is now, or `None` when it was not
    /// waiting. Its timeout counts from its start, like any op's.
    pub async fn approve_op(&self, id: &str) -> StoreResult<Result<Option<Op>, super::Refusal>> {
        let id = id.to_owned();
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            // an approval starts the op: its run (and every ancestor) must
            // still admit it, as at its admission
            if let Some(op) = get(&tx, &id)?.filter(|op| op.status == Status::AwaitingApproval) {
                if let Some(refusal) = super::admission::run_refusal(&tx, &op.run_id)? {
                    return Ok(Err(refusal));
                }
            }
            let n = tx
                .prepare_cached(
                    "UPDATE ops SET status = 'starting', approval_decided_by = 'operator', \
                     approval_decided_at = ?2 WHERE id = ?1 AND status = 'awaiting_approval'",
                )?
                .execute(params![id, now])?;
            if n != 1 {
                return Ok(Ok(None));
            }
            let op = get(&tx, &id)?.ok_or_else(|| StoreError::Corrupt(id.clone()))?;
            let granted = ApprovalGranted {
                by: BY_OPERATOR.to_owned(),
                waited_sec: (now - op.created_at).max(0) / 1000,
            };
            append_event(
                &tx,
                &op.run_id,
                Some(&id),
                EventKind::ApprovalGranted(granted),
            )?;
            tx.commit()?;
            Ok(Ok(Some(op)))
        })
        .await
    }

    /// Denies a waiting op; false when it was not waiting.
    pub async fn deny_op(&self, id: &str, reason: &str, by: &str) -> StoreResult<bool> {
        let (id, reason, by) = (id.to_owned(), reason.to_owned(), by.to_owned());
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let won = deny_in(&tx, &id, &reason, &by)?;
            tx.commit()?;
            Ok(won)
        })
        .await
    }

    /// Waiting ops, oldest first: every run's, or a run's and its
    /// descendants'.
    pub async fn waiting_ops(&self, root: Option<String>) -> StoreResult<Vec<Op>> {
        self.call(move |conn| {
            let sql = format!(
                "SELECT {COLUMNS} FROM ops WHERE status = 'awaiting_approval' AND \
                 (?1 IS NULL OR run_id IN (SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1)) \
                 ORDER BY created_at"
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map([root], op_from_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Applies the approval timeout to every waiting op past it, in one
    /// transaction: `deny` ends it `denied` ("approval timed out");
    /// `escalate` records `approval.escalated` once and it keeps waiting.
    pub async fn approval_timeouts(&self) -> StoreResult<Vec<TimeoutAction>> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            let due: Vec<(String, String, String, i64)> = {
                let mut stmt = tx.prepare_cached(
                    "SELECT id, run_id, approval_on_timeout, approval_timeout_sec FROM ops \
                     WHERE status = 'awaiting_approval' AND approval_timeout_sec IS NOT NULL \
                     AND created_at + approval_timeout_sec * 1000 <= ?1 \
                     AND (approval_on_timeout = 'deny' OR approval_escalated_at IS NULL) \
                     ORDER BY created_at LIMIT 1000",
                )?;
                let rows =
                    stmt.query_map([now], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
                rows.collect::<Result<_, _>>()?
            };
            let mut done = Vec::new();
            for (op_id, run_id, on_timeout, timeout_sec) in due {
                if on_timeout == "deny" {
                    if deny_in(&tx, &op_id, "approval timed out", BY_TIMEOUT)? {
                        done.push(TimeoutAction::Denied { op_id, run_id });
                    }
                    continue;
                }
                tx.prepare_cached(
                    "UPDATE ops SET approval_escalated_at = ?2 WHERE id = ?1 \
                     AND status = 'awaiting_approval' AND approval_escalated_at IS NULL",
                )?
                .execute(params![op_id, now])?;
                let escalated = ApprovalEscalated {
                    waited_sec: timeout_sec,
                    still_waiting: true,
                };
                let event = EventKind::ApprovalEscalated(escalated);
                append_event(&tx, &run_id, Some(&op_id), event)?;
                done.push(TimeoutAction::Escalated { op_id, run_id });
            }
            tx.commit()?;
            Ok(done)
        })
        .await
    }
}
