//! The settle transaction script: an op's compare-and-set terminal write
//! and, only when it wins, in the same transaction and in this order: the
//! op's usage fact in the ledger, its `tool.completed` or `tool.failed`
//! event, and the finalization of the schedule that fired it. Also the mark
//! of a foreground result handed to its caller.

use super::db::Tx;
use super::ops::{get, run_of, Op, Settlement};
use super::{now_ms, Store, StoreError, StoreResult};
use crate::event_kind::{EventKind, ToolCompleted, ToolFailed};
use crate::lifecycle::{observed_sql, terminal_sql, Outcome, Status, EFFECT_UNCERTAIN};
use crate::vals;

/// The event of an op's terminal write: `tool.completed` for a command
/// that ended with a code (killed or not), `tool.failed` for every other end.
fn settled_event(op: &Op) -> EventKind {
    let seconds = |ms: Option<i64>| ms.map(|ms| ms.max(0) as f64 / 1000.0);
    let op_seconds = seconds(op.started_at.zip(op.finished_at).map(|(s, f)| f - s));
    let cpu_seconds = seconds(op.usage.map(|u| u.cpu_ms as i64));
    match op.status {
        Status::Completed => EventKind::ToolCompleted(ToolCompleted {
            background: op.background,
            exit_code: op.exit_code,
            killed: op.killed,
            op_seconds,
            cpu_seconds,
        }),
        status => EventKind::ToolFailed(ToolFailed {
            background: op.background,
            status: status.as_str().to_owned(),
            effect: op.effect.clone(),
            exit_code: op.exit_code,
            killed: op.killed,
            error: op.error.clone(),
            op_seconds,
        }),
    }
}

/// The settle transaction script (see [`Store::settle`]).
pub(super) fn settle_in(tx: &mut dyn Tx, id: &str, s: &Settlement) -> StoreResult<bool> {
    let Some(run_id) = run_of(tx, id)? else {
        return Ok(false);
    };
    // locks the tree of the op's run: its settlement is serialized with the
    // tree's admissions (live-op limits, budgets), cancels and drains
    super::tree::lock_tree_of(tx, &run_id)?;
    let (exit_code, killed, effect, error) = match &s.outcome {
        Outcome::Completed { exit_code, killed } => (Some(*exit_code), *killed, None, None),
        Outcome::TimedOut { exit_code, killed } => {
            (*exit_code, *killed, Some(EFFECT_UNCERTAIN), None)
        }
        Outcome::Lost { reason } => (None, false, Some(EFFECT_UNCERTAIN), Some(reason.clone())),
        Outcome::Failed { error, killed } => (None, *killed, None, Some(error.clone())),
    };
    let now = now_ms();
    let sql = format!(
        "UPDATE ops SET status = ?2, exit_code = ?3, killed = ?4, effect = ?5, error = ?6, \
         output_tail = ?7, log_sha256 = ?8, log_size = ?9, finished_at = ?10, \
         cpu_ms = ?11, max_rss_kb = ?12, leftovers = ?13 \
         WHERE id = ?1 AND status IN ({})",
        observed_sql()
    );
    let n = tx.execute(
        &sql,
        vals![
            id,
            s.outcome.status().as_str(),
            exit_code,
            killed,
            effect,
            error,
            &s.output_tail,
            s.log.as_ref().map(|l| &l.sha256),
            s.log.as_ref().map(|l| l.size as i64),
            now,
            s.usage.map(|u| u.cpu_ms as i64),
            s.usage.map(|u| u.max_rss_kb as i64),
            s.leftovers as i64,
        ],
    )?;
    if n != 1 {
        return Ok(false);
    }
    tx.note_fact(super::db::Fact::Settled(s.outcome.status()));
    let op = get(tx, id)?.ok_or_else(|| StoreError::Corrupt(id.to_owned()))?;
    let wall = op.started_at.map(|start| match s.ended_at {
        Some(end) => end.min(now) - start,
        None => (now - start).min(s.charge_cap_ms.unwrap_or(i64::MAX)),
    });
    let cpu = op.usage.map(|u| u.cpu_ms as i64);
    super::journal::record_op_usage(tx, &op.run_id, id, wall, cpu)?;
    super::journal::append_event(tx, &op.run_id, Some(id), settled_event(&op))?;
    super::schedules::finalize_in(tx, &op)?;
    Ok(true)
}

impl Store {
    /// The compare-and-set terminal write: only a non-terminal row changes.
    /// Returns whether this writer won.
    /// A won write also appends the op's usage fact to the ledger and its
    /// `tool.completed` or `tool.failed` event, in the same transaction.
    pub async fn settle(&self, id: &str, s: Settlement) -> StoreResult<bool> {
        let id = id.to_owned();
        self.write(move |tx| settle_in(tx, &id, &s)).await
    }

    /// A foreground call gave up waiting (its `yield_ms`, SPEC §25): the op
    /// becomes a background op, its result to come in a report. Serialized
    /// with its settlement and the run's drains (the tree's lock): `None`
    /// when it has settled already (its caller answers with the result,
    /// and it is delivered inline), so the result goes one way only. The
    /// row as the flip left it (never a result settled after it).
    pub async fn yield_to_background(&self, id: &str) -> StoreResult<Option<Op>> {
        let id = id.to_owned();
        self.write(move |tx| {
            let Some(run_id) = run_of(tx, &id)? else {
                return Ok(None);
            };
            super::tree::lock_tree_of(tx, &run_id)?;
            let sql = format!(
                "UPDATE ops SET background = 1 WHERE id = ?1 AND background = 0 \
                 AND delivered_inline = 0 AND status NOT IN ({}) RETURNING {}",
                terminal_sql(),
                super::ops::COLUMNS
            );
            tx.query(&sql, vals![&id])?
                .first()
                .map(super::ops::op_from_row)
                .transpose()
        })
        .await
    }

    /// Marks a foreground op's result as handed to its caller directly;
    /// whether it was (a yielded op, now a background one, or one a
    /// report took, is not). Serialized with the run's drains.
    pub async fn mark_delivered_inline(&self, id: &str) -> StoreResult<bool> {
        let id = id.to_owned();
        self.write(move |tx| {
            let Some(run_id) = run_of(tx, &id)? else {
                return Ok(false);
            };
            super::tree::lock_tree_of(tx, &run_id)?;
            let sql = format!(
                "UPDATE ops SET delivered_inline = 1 WHERE id = ?1 AND report_id IS NULL \
                 AND background = 0 AND status IN ({})",
                terminal_sql()
            );
            Ok(tx.execute(&sql, vals![&id])? == 1)
        })
        .await
    }
}
