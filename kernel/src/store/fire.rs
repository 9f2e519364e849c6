//! The fire transaction script (SPEC §15): one due time of one schedule,
//! in one IMMEDIATE transaction, in this order: the lock of the schedule's
//! run tree, the claim (compare-and-set on the schedule's due time), the
//! admission of its op under the key `schedule:<id>:<due>` (so a due time
//! fires at most once), then either the schedule moves on with
//! `schedule.fired`, adopts the due time's op already there, or ends,
//! postpones or skips by the pure refusal rule.

use super::admit::insert_in;
use super::db::Tx;
use super::journal::append_event;
use super::ops::{Admission, ApprovalHold, NewOp, Op, StartRequest};
use super::schedules::{end_in, finalize_in, get_schedule, postpone_in, skip_in, Fire, Schedule};
use super::{now_ms, Refusal, Store, StoreError, StoreResult};
use crate::event_kind::{EventKind, ScheduleFired};
use crate::vals;

/// A due time's op was admitted: the schedule holds it as current, moves
/// on to its next due time, and records `schedule.fired`.
fn fired_in(tx: &mut dyn Tx, s: &Schedule, op: Op, due: i64, now: i64) -> StoreResult<Fire> {
    let (next, passed) = s.timing.next_after_now(due, now);
    tx.execute(
        "UPDATE schedules SET current_op_id = ?2, current_due_at = ?3, next_due_at = ?4 \
         WHERE id = ?1",
        vals![&s.id, &op.id, due, next],
    )?;
    let fired = ScheduleFired {
        schedule_id: s.id.clone(),
        due_at: crate::report_text::rfc3339(due),
        missed_slots: passed,
    };
    append_event(tx, &s.run_id, Some(&op.id), EventKind::ScheduleFired(fired))?;
    Ok(Fire::Fired(op))
}

/// A due time's op was refused: the schedule ends, postpones or skips, by
/// the pure rule [`crate::timing::after_refusal`].
fn refused_in(
    tx: &mut dyn Tx,
    s: &Schedule,
    due: i64,
    why: &Refusal,
    now: i64,
) -> StoreResult<Fire> {
    use crate::timing::{after_refusal, AfterRefusal, FireRefusal};
    let reason = why.to_string();
    let kind = match why {
        Refusal::State { state, .. } if state.is_final() => FireRefusal::RunOver,
        Refusal::NoRun(_) => FireRefusal::RunGone,
        Refusal::State { .. } | Refusal::Limit(_) | Refusal::NoNode(_) => FireRefusal::Passing,
        Refusal::Budget(_) => FireRefusal::Budget,
        Refusal::Ceiling(_) => FireRefusal::Ceiling,
    };
    match after_refusal(kind, s.timing.is_recurring()) {
        AfterRefusal::End => end_in(tx, s, &reason)?,
        AfterRefusal::Postpone => postpone_in(tx, s, &reason, now)?,
        AfterRefusal::Skip => skip_in(tx, s, due, &reason, now)?,
    }
    Ok(Fire::Skipped(reason))
}

/// The fire transaction script (see the module comment).
fn fire_in(
    tx: &mut dyn Tx,
    id: &str,
    due: i64,
    kernel_id: &str,
    hold: Option<ApprovalHold>,
    limits: Admission,
) -> StoreResult<Fire> {
    let Some((s, now)) = claim_due(tx, id, due, kernel_id)? else {
        return Ok(Fire::NotDue);
    };
    let req = StartRequest {
        run_id: s.run_id.clone(),
        scratch_key: sandbox::profile::scratch_key(&s.run_id),
        command: s.command.clone(),
        background: true,
        timeout_sec: s.timeout_sec,
        io: sandbox::Io::Null,
        idempotency_key: Some(format!("schedule:{}:{}", s.id, due)),
        approval: hold,
        schedule_id: Some(s.id.clone()),
        // the kernel's own scheduler fires it, as its run
        origin: crate::origin::Origin::schedule_fire(&s.id, &s.run_id),
    };
    let current = "UPDATE schedules SET current_op_id = ?2, current_due_at = ?3 WHERE id = ?1";
    Ok(match insert_in(tx, &req, limits)? {
        NewOp::Created(op) => fired_in(tx, &s, op, due, now)?,
        NewOp::Existing(op) if !op.status.is_terminal() => {
            tx.execute(current, vals![&s.id, &op.id, due])?;
            Fire::Adopted(op)
        }
        NewOp::Existing(op) => {
            // the due time's op ended without finalizing its schedule:
            // finalize now (never a second op for the same due time)
            tx.execute(current, vals![&s.id, &op.id, due])?;
            finalize_in(tx, &op)?;
            Fire::NotDue
        }
        NewOp::KeyConflict(other) => {
            let reason = format!("due time already used by operation {other}");
            skip_in(tx, &s, due, &reason, now)?;
            Fire::Skipped(reason)
        }
        NewOp::Refused(why) => refused_in(tx, &s, due, &why, now)?,
    })
}

/// Claims a due time as [`fire_in`] does and records it refused, nothing
/// admitted: the kernel found the schedule over a ceiling (its timeout).
fn refuse_in(
    tx: &mut dyn Tx,
    id: &str,
    due: i64,
    kernel_id: &str,
    why: &Refusal,
) -> StoreResult<Fire> {
    match claim_due(tx, id, due, kernel_id)? {
        Some((s, now)) => refused_in(tx, &s, due, why, now),
        None => Ok(Fire::NotDue),
    }
}

/// Claims a schedule's due time `due` for `kernel_id` (compare-and-set:
/// enabled, not paused, unclaimed, that due time, now due) after locking
/// its run's tree (a schedule never changes run: the claim and the op's
/// admission are serialized with the tree's other admissions, settlements
/// and cancels); the schedule and the claim's time, or `None`.
fn claim_due(
    tx: &mut dyn Tx,
    id: &str,
    due: i64,
    kernel_id: &str,
) -> StoreResult<Option<(Schedule, i64)>> {
    let Some(run_id) = tx
        .query_opt("SELECT run_id FROM schedules WHERE id = ?1", vals![id])?
        .map(|row| row.get::<String>("run_id"))
        .transpose()?
    else {
        return Ok(None);
    };
    super::tree::lock_tree_of(tx, &run_id)?;
    let now = now_ms();
    let claimed = tx.execute(
        "UPDATE schedules SET claimed_at = ?3, claimed_by = ?4 WHERE id = ?1 \
         AND enabled = 1 AND paused = 0 AND claimed_at IS NULL \
         AND next_due_at = ?2 AND next_due_at <= ?3",
        vals![id, due, now, kernel_id],
    )?;
    if claimed != 1 {
        return Ok(None);
    }
    let s = get_schedule(tx, id)?.ok_or_else(|| StoreError::Corrupt(id.to_owned()))?;
    Ok(Some((s, now)))
}

impl Store {
    /// Records a due time refused by the kernel before any admission (a
    /// ceiling the schedule is over), as a refused fire: the slot is
    /// skipped, once, whichever kernel records it.
    pub async fn refuse_fire(
        &self,
        id: &str,
        due: i64,
        kernel_id: &str,
        why: Refusal,
    ) -> StoreResult<Fire> {
        let (id, kernel_id) = (id.to_owned(), kernel_id.to_owned());
        self.write(move |tx| refuse_in(tx, &id, due, &kernel_id, &why))
            .await
    }

    /// Fires a schedule for its due time `due`: the claim and the op's
    /// insert in one transaction (see the module comment). `hold` is the
    /// approval hold the kernel found for the command; `limits` the run's.
    pub async fn fire_schedule(
        &self,
        id: &str,
        due: i64,
        kernel_id: &str,
        hold: Option<ApprovalHold>,
        limits: Admission,
    ) -> StoreResult<Fire> {
        let (id, kernel_id) = (id.to_owned(), kernel_id.to_owned());
        self.write(move |tx| fire_in(tx, &id, due, &kernel_id, hold.clone(), limits))
            .await
    }
}
