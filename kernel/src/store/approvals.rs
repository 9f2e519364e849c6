//! Approval gates (SPEC §16): an op held `awaiting_approval` is approved
//! (→ `starting`, then an ordinary launch) or denied (→ `denied`, nothing
//! ran), each by compare-and-set with its events; the approval timeout
//! escalates once or denies. Nothing here ever approves on its own.

use super::db::Tx;
use super::hints::HintKind;
use super::journal::append_event;
use super::ops::{get, ops_of, run_of, COLUMNS};
use super::tree::lock_tree_of;
use super::{now_ms, Op, Store, StoreError, StoreResult};
use crate::event_kind::{
    ApprovalDenied, ApprovalEscalated, ApprovalGranted, EventKind, ToolFailed,
};
use crate::lifecycle::Status;
use crate::vals;

/// Who denied an op: the operator (`POST .../deny`).
pub const BY_OPERATOR: &str = "operator";
/// Who denied an op: the approval timeout, with `on_timeout: "deny"`.
pub const BY_TIMEOUT: &str = "timeout";
/// Who denied an op: a `kill_operation` before approval.
pub const BY_KILL: &str = "kill";

/// Denies a waiting op inside the caller's transaction: `denied` with the
/// reason, `approval.denied` and `tool.failed` events. False when the op
/// was not waiting (approved, denied or never held).
pub(super) fn deny_in(tx: &mut dyn Tx, id: &str, reason: &str, by: &str) -> StoreResult<bool> {
    let now = now_ms();
    let n = tx.execute(
        "UPDATE ops SET status = 'denied', error = ?2, finished_at = ?3, \
         approval_decided_by = ?4, approval_decided_at = ?3 \
         WHERE id = ?1 AND status = 'awaiting_approval'",
        vals![id, reason, now, by],
    )?;
    if n != 1 {
        return Ok(false);
    }
    tx.note_fact(super::db::Fact::Settled(Status::Denied));
    let op = get(tx, id)?.ok_or_else(|| StoreError::Corrupt(id.to_owned()))?;
    let denied = ApprovalDenied {
        reason: reason.to_owned(),
        by: by.to_owned(),
    };
    append_event(tx, &op.run_id, Some(id), EventKind::ApprovalDenied(denied))?;
    let failed = ToolFailed {
        background: op.background,
        status: Status::Denied.as_str().to_owned(),
        effect: None,
        exit_code: None,
        killed: false,
        error: Some(reason.to_owned()),
        op_seconds: None,
    };
    append_event(tx, &op.run_id, Some(id), EventKind::ToolFailed(failed))?;
    super::schedules::finalize_in(tx, &op)?;
    Ok(true)
}

/// Denies every waiting op of a run and its descendants (a cancel).
pub(super) fn deny_waiting_in_subtree(tx: &mut dyn Tx, run_id: &str) -> StoreResult<Vec<String>> {
    let ids: Vec<String> = tx
        .query(
            "SELECT id FROM ops WHERE status = 'awaiting_approval' AND run_id IN \
             (SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1) ORDER BY created_at",
            vals![run_id],
        )?
        .iter()
        .map(|r| r.get("id"))
        .collect::<StoreResult<_>>()?;
    let mut denied = Vec::new();
    for id in ids {
        if deny_in(tx, &id, "cancelled before approval", BY_KILL)? {
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

/// The approve transaction script (see [`Store::approve_op`]).
fn approve_in(tx: &mut dyn Tx, id: &str) -> StoreResult<Result<Option<Op>, super::Refusal>> {
    let Some(run_id) = run_of(tx, id)? else {
        return Ok(Ok(None));
    };
    // locks the tree of the op's run: an approval starts the op, so its
    // run (and every ancestor) must still admit it, as at its admission,
    // serialized with the tree's admissions and cancels; read after the lock
    let root = lock_tree_of(tx, &run_id)?;
    let now = now_ms();
    if let Some(op) = get(tx, id)?.filter(|op| op.status == Status::AwaitingApproval) {
        if let Some(refusal) = super::admission::run_refusal(tx, &op.run_id)? {
            return Ok(Err(refusal));
        }
    }
    // in a cluster it runs on its tree's node now (placed again if that
    // node died while it waited)
    let node = match tx.cluster() {
        false => None,
        true => match super::nodes::place(tx, &root, u64::MAX)? {
            super::nodes::Placed::On(node) => Some(node),
            _ => return Ok(Err(super::Refusal::NoNode(run_id))),
        },
    };
    let n = tx.execute(
        "UPDATE ops SET status = 'starting', approval_decided_by = 'operator', \
         approval_decided_at = ?2, node = COALESCE(?3, node) \
         WHERE id = ?1 AND status = 'awaiting_approval'",
        vals![id, now, node],
    )?;
    if n != 1 {
        return Ok(Ok(None));
    }
    let op = get(tx, id)?.ok_or_else(|| StoreError::Corrupt(id.to_owned()))?;
    super::hints::notify_in(tx, op.node.as_deref(), HintKind::Start, id)?;
    let granted = ApprovalGranted {
        by: BY_OPERATOR.to_owned(),
        waited_sec: (now - op.created_at).max(0) / 1000,
    };
    append_event(
        tx,
        &op.run_id,
        Some(id),
        EventKind::ApprovalGranted(granted),
    )?;
    Ok(Ok(Some(op)))
}

/// The approval-timeout transaction script (see
/// [`Store::approval_timeouts`]).
fn timeouts_in(tx: &mut dyn Tx) -> StoreResult<Vec<TimeoutAction>> {
    let now = now_ms();
    let due = tx.query(
        "SELECT id, run_id, approval_on_timeout, approval_timeout_sec FROM ops \
         WHERE status = 'awaiting_approval' AND approval_timeout_sec IS NOT NULL \
         AND created_at + approval_timeout_sec * 1000 <= ?1 \
         AND (approval_on_timeout = 'deny' OR approval_escalated_at IS NULL) \
         ORDER BY created_at LIMIT 1000",
        vals![now],
    )?;
    // locks the tree of every due op's run, each once and in one order
    // (so two such passes cannot deadlock); each write below is a
    // compare-and-set on the op's status, re-checked under the locks
    let runs = due
        .iter()
        .map(|row| row.get::<String>("run_id"))
        .collect::<StoreResult<Vec<_>>>()?;
    super::tree::lock_trees_of(tx, runs)?;
    let mut done = Vec::new();
    for row in due {
        let (op_id, run_id): (String, String) = (row.get("id")?, row.get("run_id")?);
        let on_timeout: String = row.get("approval_on_timeout")?;
        if on_timeout == "deny" {
            if deny_in(tx, &op_id, "approval timed out", BY_TIMEOUT)? {
                done.push(TimeoutAction::Denied { op_id, run_id });
            }
            continue;
        }
        let escalated = tx.execute(
            "UPDATE ops SET approval_escalated_at = ?2 WHERE id = ?1 \
             AND status = 'awaiting_approval' AND approval_escalated_at IS NULL",
            vals![&op_id, now],
        )?;
        if escalated != 1 {
            continue;
        }
        let escalated = ApprovalEscalated {
            waited_sec: row.get("approval_timeout_sec")?,
            still_waiting: true,
        };
        let event = EventKind::ApprovalEscalated(escalated);
        append_event(tx, &run_id, Some(&op_id), event)?;
        done.push(TimeoutAction::Escalated { op_id, run_id });
    }
    Ok(done)
}

impl Store {
    /// `awaiting_approval` → `starting` (by the operator), with
    /// `approval.granted`. The op as it is now, or `None` when it was not
    /// waiting. Its timeout counts from its start, like any op's.
    pub async fn approve_op(&self, id: &str) -> StoreResult<Result<Option<Op>, super::Refusal>> {
        let id = id.to_owned();
        self.write(move |tx| approve_in(tx, &id)).await
    }

    /// Denies a waiting op; false when it was not waiting.
    pub async fn deny_op(&self, id: &str, reason: &str, by: &str) -> StoreResult<bool> {
        let (id, reason, by) = (id.to_owned(), reason.to_owned(), by.to_owned());
        self.write(move |tx| {
            let Some(run_id) = run_of(tx, &id)? else {
                return Ok(false);
            };
            // locks the tree of the op's run: a denial ends the op, as a
            // settlement does
            lock_tree_of(tx, &run_id)?;
            deny_in(tx, &id, &reason, &by)
        })
        .await
    }

    /// Waiting ops, oldest first: every run's, or a run's and its
    /// descendants'.
    pub async fn waiting_ops(&self, root: Option<String>) -> StoreResult<Vec<Op>> {
        self.read(move |tx| {
            let sql = format!(
                "SELECT {COLUMNS} FROM ops WHERE status = 'awaiting_approval' AND \
                 (CAST(?1 AS TEXT) IS NULL \
                 OR run_id IN (SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1)) \
                 ORDER BY created_at"
            );
            ops_of(tx, &sql, vals![root])
        })
        .await
    }

    /// Applies the approval timeout to every waiting op past it, in one
    /// transaction: `deny` ends it `denied` ("approval timed out");
    /// `escalate` records `approval.escalated` once and it keeps waiting.
    pub async fn approval_timeouts(&self) -> StoreResult<Vec<TimeoutAction>> {
        self.write(timeouts_in).await
    }
}
