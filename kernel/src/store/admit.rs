//! The admit transaction script: one start of an op, in one IMMEDIATE
//! transaction, in this order: the run tree's lock (an advisory lock keyed
//! by its root on PostgreSQL), the idempotency key (a retry finds its op), the run's state
//! and budgets on its chain, the run's existence (a run token never
//! recreates a purged run), the envelope limits over each subtree and the
//! kernel-wide limit, then the row (`starting`, or `awaiting_approval`
//! under an approval hold) with its `tool.started` (and
//! `approval.requested`) events. Writes nothing unless it admits.

use super::admission::{Admission, Counted};
use super::db::Tx;
use super::hints::HintKind;
use super::journal::append_event;
use super::nodes::Placed;
use super::ops::{get, op_from_row, NewOp, Op, StartRequest, COLUMNS};
use super::{now_ms, Store, StoreError, StoreResult};
use crate::event_kind::{ApprovalRequested, EventKind, ToolStarted};
use crate::lifecycle::{live_sql, Status};
use crate::vals;

/// The op's run as admission found it (in the same statement as the
/// kernel-wide count): whether it is recorded, and whether it finished.
struct RunRow {
    recorded: bool,
    finished: bool,
}

/// Whether a new op of `run_id` would pass an envelope limit of its tree
/// (`Err` with the reason) or the kernel-wide limit; else the run's row.
fn admission_refusal(
    tx: &mut dyn Tx,
    run_id: &str,
    limits: Admission,
) -> StoreResult<Result<RunRow, String>> {
    if let Some(refusal) = super::admission::tree_limit_refusal(tx, run_id, Counted::Ops, limits)? {
        return Ok(Err(refusal));
    }
    // an index-only count through the partial index of live statuses, and
    // the run's row, in one statement
    let sql = format!(
        "SELECT (SELECT COUNT(*) FROM ops WHERE status IN ({})) AS live, \
         (SELECT COUNT(*) FROM runs WHERE run_id = ?1) AS recorded, \
         (SELECT COUNT(*) FROM runs WHERE run_id = ?1 AND finished_at IS NOT NULL) AS finished",
        live_sql()
    );
    let row = tx.query_one(&sql, vals![run_id])?;
    let total = row.get::<i64>("live")? as u64;
    // a cluster's limit is per node, counted once the op is placed
    if total >= limits.max_live && !tx.cluster() {
        return Ok(Err(format!(
            "the kernel already has {total} live operations (limit {})",
            limits.max_live
        )));
    }
    Ok(Ok(RunRow {
        recorded: row.get::<i64>("recorded")? > 0,
        finished: row.get::<i64>("finished")? > 0,
    }))
}

/// In a cluster, `OPKERNEL_MAX_OPS` bounds the live ops of the node the op
/// is placed on (SPEC §24), counted in the admitting transaction through
/// the index of ops by node and status.
fn node_limit_refusal(
    tx: &mut dyn Tx,
    node: Option<&str>,
    limits: Admission,
) -> StoreResult<Option<String>> {
    let Some(node) = node else {
        return Ok(None);
    };
    let sql = format!(
        "SELECT COUNT(*) FROM ops WHERE node = ?1 AND status IN ({})",
        live_sql()
    );
    let live = tx.scalar::<i64>(&sql, vals![node])? as u64;
    Ok((live >= limits.max_live).then(|| {
        format!(
            "node {node} already has {live} live operations (limit {}, per node)",
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
    // locks the tree of the op's run (keyed by its root): the admissions,
    // settlements, cancels and drains of one tree are serialized
    let root = super::tree::lock_tree_of(tx, &req.run_id)?;
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
    let run = match admission_refusal(tx, &req.run_id, limits)? {
        Err(refusal) => return Ok(NewOp::Refused(super::Refusal::Limit(refusal))),
        Ok(run) => run,
    };
    // in a cluster the tree lives on one node, placed at its first use;
    // none can take it: refused before anything is written
    let node = match tx.cluster() {
        false => None,
        true => match super::nodes::place(tx, &root, limits.max_live)? {
            Placed::On(node) => Some(node),
            Placed::Full => {
                let full = format!(
                    "every active node already has {} live operations (OPKERNEL_MAX_OPS, per node)",
                    limits.max_live
                );
                return Ok(NewOp::Refused(super::Refusal::Limit(full)));
            }
            Placed::NoNode => {
                return Ok(NewOp::Refused(super::Refusal::NoNode(req.run_id.clone())))
            }
        },
    };
    if let Some(refusal) = node_limit_refusal(tx, node.as_deref(), limits)? {
        return Ok(NewOp::Refused(super::Refusal::Limit(refusal)));
    }
    if !run.recorded {
        super::runs::ensure_top_level(tx, &req.run_id, now, Some(&req.origin))?;
        if let Some(node) = &node {
            super::nodes::record_placement(tx, &root, node)?;
        }
    }
    // a new op reopens a finished run: its container is needed again
    if run.finished {
        tx.execute(
            "UPDATE runs SET finished_at = NULL WHERE run_id = ?1 AND finished_at IS NOT NULL",
            vals![&req.run_id],
        )?;
    }
    let op = insert_row(tx, req, (&request_sha, node.as_deref()), now)?;
    started_events(tx, &op.id, req)?;
    if op.status == Status::Starting {
        super::hints::notify_in(tx, node.as_deref(), HintKind::Start, &op.id)?;
    }
    Ok(NewOp::Created(op))
}

/// The row of an admitted start, as inserted (`RETURNING` it: no second
/// read).
fn insert_row(
    tx: &mut dyn Tx,
    req: &StartRequest,
    (request_sha, node): (&str, Option<&str>),
    now: i64,
) -> StoreResult<Op> {
    let id = uuid::Uuid::new_v4().to_string();
    let status = match req.approval {
        Some(_) => Status::AwaitingApproval,
        None => Status::Starting,
    };
    let hold = req.approval.as_ref();
    let command =
        serde_json::to_string(&req.command).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let sql = format!(
        "INSERT INTO ops (id, run_id, command, background, timeout_sec, status, scratch_key, \
         created_at, idempotency_key, request_sha256, approval_rule, approval_timeout_sec, \
         approval_on_timeout, schedule_id, node, io, origin_surface, origin_channel, \
         origin_principal, origin_route) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
         ?18, ?19, ?20) \
         RETURNING {COLUMNS}"
    );
    let row = tx.query_one(
        &sql,
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
            node,
            super::ops::io_column(req.io),
            req.origin.surface.as_str(),
            &req.origin.channel,
            &req.origin.principal,
            &req.origin.route,
        ],
    )?;
    tx.note_fact(super::db::Fact::Admitted);
    op_from_row(&row)
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
        origin: Some(req.origin.clone()),
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
