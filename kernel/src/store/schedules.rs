//! Schedules (SPEC §15): a schedule belongs to its run and fires as it.
//!
//! - **Fire**: one transaction claims the schedule for its due time and
//!   inserts that due time's op (idempotency key `schedule:<id>:<due>`,
//!   admitted like any op of the run: state, budget, envelope, approval),
//!   so a due time fires at most once across any number of crashes. The
//!   claim is held while the op lives.
//! - **Finalize**: the op's settlement (or denial) transaction records the
//!   bounded last result, releases the claim and reschedules from the
//!   previous due time (slots that passed while the op ran are skipped with
//!   an event); a one-shot is deleted (`delete_after_success`, succeeded)
//!   or disabled.
//! - **Start**: claims whose op is over are finalized, claims of a dead
//!   kernel on a live op are taken over, and overdue schedules follow
//!   `catch_up` ([`crate::timing::startup`]).

use super::db::{Row, Tx, Value};
use super::journal::append_event;
use super::ops::{get, Op};
use super::{now_ms, Store, StoreError, StoreResult};
use crate::event_kind::{EventKind, ScheduleSkipped};
use crate::lifecycle::Status;
use crate::report_text::rfc3339;
use crate::timing::{after_op, startup, AfterOp, Startup, Timing};
use crate::vals;

/// Schedules one run may hold.
pub const MAX_SCHEDULES_PER_RUN: i64 = 64;
/// Bytes of the last output tail a schedule keeps.
pub const MAX_LAST_TAIL: usize = 4096;

/// A schedule as the control plane records it.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// The schedule's id (`schedule_id`).
    pub id: String,
    /// The run it belongs to and fires as.
    pub run_id: String,
    /// The argv each fire runs.
    pub command: Vec<String>,
    /// Each fired op's timeout, in seconds.
    pub timeout_sec: u64,
    /// When it fires: `cron`, `every_sec` or `at`.
    pub timing: Timing,
    /// An overdue schedule fires once at start (else it skips or advances).
    pub catch_up: bool,
    /// A one-shot that succeeded is deleted rather than disabled.
    pub delete_after_success: bool,
    /// `false` once it can fire no more: a finished or skipped one-shot, or
    /// a schedule of a run that is over.
    pub enabled: bool,
    /// Paused by `POST .../pause`: due times pass until it is resumed.
    pub paused: bool,
    /// Its next due time (unix ms); `None` when none is left.
    pub next_due_at: Option<i64>,
    /// When a kernel claimed it for a due time (unix ms), while the claim
    /// holds.
    pub claimed_at: Option<i64>,
    /// The kernel process holding the claim.
    pub claimed_by: Option<String>,
    /// The op the claim fired, while it is live.
    pub current_op_id: Option<String>,
    /// The due time the current op fired for (unix ms).
    pub current_due_at: Option<i64>,
    /// The due time of the last finished fire (unix ms).
    pub last_due_at: Option<i64>,
    /// The last finished fire's op.
    pub last_op_id: Option<String>,
    /// That op's terminal status, or `skipped`.
    pub last_status: Option<String>,
    /// That op's exit code, when it had one.
    pub last_exit_code: Option<i32>,
    /// That op's output tail, at most [`MAX_LAST_TAIL`] bytes.
    pub last_output_tail: Option<String>,
    /// When that op finished (unix ms).
    pub last_finished_at: Option<i64>,
    /// When the schedule was made (unix ms).
    pub created_at: i64,
    /// The operator's file that declares it (SPEC §28); `None`: made
    /// through the API.
    pub declared_in: Option<String>,
}

const COLUMNS: &str = "id, run_id, command, timeout_sec, kind, spec, catch_up, delete_after_success, \
    enabled, paused, next_due_at, claimed_at, claimed_by, current_op_id, current_due_at, last_due_at, \
    last_op_id, last_status, last_exit_code, last_output_tail, last_finished_at, created_at, declared_in";

fn from_row(row: &Row) -> StoreResult<Schedule> {
    let corrupt = |what: String| StoreError::Corrupt(format!("schedule: {what}"));
    let command: String = row.get("command")?;
    let kind: String = row.get("kind")?;
    let spec: String = row.get("spec")?;
    Ok(Schedule {
        id: row.get("id")?,
        run_id: row.get("run_id")?,
        command: serde_json::from_str(&command).map_err(|e| corrupt(e.to_string()))?,
        timeout_sec: row.get::<i64>("timeout_sec")? as u64,
        timing: Timing::parse(&kind, &spec).map_err(corrupt)?,
        catch_up: row.get("catch_up")?,
        delete_after_success: row.get("delete_after_success")?,
        enabled: row.get("enabled")?,
        paused: row.get("paused")?,
        next_due_at: row.get("next_due_at")?,
        claimed_at: row.get("claimed_at")?,
        claimed_by: row.get("claimed_by")?,
        current_op_id: row.get("current_op_id")?,
        current_due_at: row.get("current_due_at")?,
        last_due_at: row.get("last_due_at")?,
        last_op_id: row.get("last_op_id")?,
        last_status: row.get("last_status")?,
        last_exit_code: row.get("last_exit_code")?,
        last_output_tail: row.get("last_output_tail")?,
        last_finished_at: row.get("last_finished_at")?,
        created_at: row.get("created_at")?,
        declared_in: row.get("declared_in")?,
    })
}

/// The schedules a query with [`COLUMNS`] read, an unreadable one left out
/// (and logged): one corrupt schedule never stops the scheduler nor the
/// kernel's start-up.
fn readable(tx: &mut dyn Tx, sql: &str, params: &[Value]) -> StoreResult<Vec<Schedule>> {
    Ok(tx
        .query(sql, params)?
        .iter()
        .filter_map(|row| {
            from_row(row)
                .map_err(|e| tracing::error!(%e, "unreadable schedule row left out"))
                .ok()
        })
        .collect())
}

pub(super) fn get_schedule(tx: &mut dyn Tx, id: &str) -> StoreResult<Option<Schedule>> {
    tx.query_opt(
        &format!("SELECT {COLUMNS} FROM schedules WHERE id = ?1"),
        vals![id],
    )?
    .as_ref()
    .map(from_row)
    .transpose()
}

/// The last `MAX_LAST_TAIL` bytes of an output tail, on a char boundary.
fn bounded_tail(tail: Option<&str>) -> Option<String> {
    let tail = tail?;
    let mut start = tail.len().saturating_sub(MAX_LAST_TAIL);
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    Some(tail[start..].to_owned())
}

/// A schedule to create (validated by the caller).
#[derive(Debug, Clone)]
pub struct NewSchedule {
    /// The run it belongs to and fires as.
    pub run_id: String,
    /// The argv each fire runs.
    pub command: Vec<String>,
    /// Each fired op's timeout, in seconds (checked by the caller).
    pub timeout_sec: u64,
    /// When it fires.
    pub timing: Timing,
    /// Fire an overdue schedule once at start.
    pub catch_up: bool,
    /// Delete a one-shot that succeeded instead of disabling it.
    pub delete_after_success: bool,
}

/// The result of one fire attempt.
#[derive(Debug)]
pub enum Fire {
    /// The due time's op was inserted (it may wait for approval).
    Fired(Op),
    /// The due time's op existed and lives: the claim is held for it again.
    Adopted(Op),
    /// Not fired: the run refused it (paused, over budget, ...), recorded
    /// as a skip.
    Skipped(String),
    /// Not due, or claimed by another scheduler: nothing happened.
    NotDue,
}

/// What start-up did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StartupReport {
    /// Claims of a dead kernel on a live op, now this kernel's.
    pub adopted: usize,
    /// Claims without a live op, released (and finalized where the op ended).
    pub cleared: usize,
    /// Overdue one-shots disabled (`catch_up: false`).
    pub skipped: usize,
    /// Overdue recurring schedules moved to their next future slot.
    pub advanced: usize,
    /// Overdue schedules left due for one catch-up fire.
    pub catching_up: usize,
}

/// Finalizes the schedule that fired `op` (if any), inside the op's
/// terminal transaction: bounded last result, claim released, next due
/// time from the previous one (missed slots skipped with an event), a
/// finished one-shot deleted or disabled.
pub(super) fn finalize_in(tx: &mut dyn Tx, op: &Op) -> StoreResult<()> {
    let Some(row) = tx.query_opt(
        "SELECT id, kind, spec, next_due_at, delete_after_success FROM schedules \
         WHERE current_op_id = ?1",
        vals![&op.id],
    )?
    else {
        return Ok(());
    };
    let id: String = row.get("id")?;
    let (kind, spec): (String, String) = (row.get("kind")?, row.get("spec")?);
    let next_due: Option<i64> = row.get("next_due_at")?;
    let delete_after_success: bool = row.get("delete_after_success")?;
    let now = now_ms();
    // a row that no longer parses must not keep its op from ending: it is
    // released and disabled
    let Ok(timing) = Timing::parse(&kind, &spec) else {
        tracing::error!(schedule = %id, %kind, %spec, "unreadable schedule timing: disabled");
        return release_in(tx, &id, op, now, None, false);
    };
    let run_over = super::runs::get_run(tx, &op.run_id)?.is_some_and(|r| r.state.is_final());
    let succeeded = op.status == Status::Completed && op.exit_code == Some(0) && !op.killed;
    match after_op(
        &timing,
        delete_after_success,
        succeeded,
        run_over,
        next_due,
        now,
    ) {
        AfterOp::Delete => {
            tx.execute("DELETE FROM schedules WHERE id = ?1", vals![&id])?;
            Ok(())
        }
        AfterOp::Disable => release_in(tx, &id, op, now, None, false),
        AfterOp::Next { next_due, skipped } => {
            if let Some((due, slots)) = skipped {
                let reason = "previous still running";
                let skipped = ScheduleSkipped::slots(&id, reason, rfc3339(due), slots);
                append_event(tx, &op.run_id, None, EventKind::ScheduleSkipped(skipped))?;
            }
            release_in(tx, &id, op, now, next_due, true)
        }
    }
}

/// A finished fire's schedule: `op`'s bounded last result recorded, the
/// claim released, its next due time set (disabled unless `keep_enabled`).
fn release_in(
    tx: &mut dyn Tx,
    id: &str,
    op: &Op,
    now: i64,
    next: Option<i64>,
    keep_enabled: bool,
) -> StoreResult<()> {
    tx.execute(
        "UPDATE schedules SET last_due_at = current_due_at, last_op_id = ?2, last_status = ?3, \
         last_exit_code = ?4, last_output_tail = ?5, last_finished_at = ?6, claimed_at = NULL, \
         claimed_by = NULL, current_op_id = NULL, current_due_at = NULL, next_due_at = ?7, \
         enabled = CASE WHEN ?8 = 1 THEN enabled ELSE 0 END WHERE id = ?1",
        vals![
            id,
            &op.id,
            op.status.as_str(),
            op.exit_code,
            bounded_tail(op.output_tail.as_deref()),
            now,
            next,
            keep_enabled,
        ],
    )?;
    Ok(())
}

/// Moves a recurring schedule past `due` without a run, or disables a
/// one-shot; records `schedule.skipped` with the reason.
pub(super) fn skip_in(
    tx: &mut dyn Tx,
    s: &Schedule,
    due: i64,
    reason: &str,
    now: i64,
) -> StoreResult<()> {
    let (next, passed) = s.timing.next_after_now(due, now);
    let skipped = ScheduleSkipped::slots(&s.id, reason, rfc3339(due), passed + 1);
    append_event(tx, &s.run_id, None, EventKind::ScheduleSkipped(skipped))?;
    // a recurring schedule's last_* describe its last run; a one-shot that
    // will never run says so
    tx.execute(
        "UPDATE schedules SET claimed_at = NULL, claimed_by = NULL, next_due_at = ?2, \
         last_status = CASE WHEN ?3 = 1 THEN last_status ELSE 'skipped' END, \
         enabled = CASE WHEN ?3 = 1 THEN enabled ELSE 0 END WHERE id = ?1",
        vals![&s.id, next, s.timing.is_recurring()],
    )?;
    Ok(())
}

/// Ends a schedule whose run is over (completed or cancelled): disabled,
/// no next due time, with its reason in the run's trace.
pub(super) fn end_in(tx: &mut dyn Tx, s: &Schedule, reason: &str) -> StoreResult<()> {
    let ended = ScheduleSkipped::ended(&s.id, reason);
    append_event(tx, &s.run_id, None, EventKind::ScheduleSkipped(ended))?;
    tx.execute(
        "UPDATE schedules SET claimed_at = NULL, claimed_by = NULL, next_due_at = NULL, \
         enabled = 0 WHERE id = ?1",
        vals![&s.id],
    )?;
    Ok(())
}

/// How long a one-shot refused for a passing reason (its run paused, a
/// live-op limit) waits before it is tried again.
const ONE_SHOT_RETRY_MS: i64 = 5_000;

/// A one-shot refused for a passing reason: tried again later; the first
/// refusal of a kind is in the trace.
pub(super) fn postpone_in(
    tx: &mut dyn Tx,
    s: &Schedule,
    reason: &str,
    now: i64,
) -> StoreResult<()> {
    let status = format!("waiting: {reason}");
    if s.last_status.as_deref() != Some(status.as_str()) {
        let postponed = ScheduleSkipped::postponed(&s.id, reason, ONE_SHOT_RETRY_MS / 1000);
        append_event(tx, &s.run_id, None, EventKind::ScheduleSkipped(postponed))?;
    }
    tx.execute(
        "UPDATE schedules SET claimed_at = NULL, claimed_by = NULL, next_due_at = ?2, \
         last_status = ?3 WHERE id = ?1",
        vals![&s.id, now + ONE_SHOT_RETRY_MS, status],
    )?;
    Ok(())
}

/// Disables every schedule of a run (and, with `subtree`, of its
/// descendants) whose run is over; a schedule whose op still lives is
/// finalized when that op ends.
pub(super) fn end_schedules_of(tx: &mut dyn Tx, run_id: &str, subtree: bool) -> StoreResult<()> {
    let sql = if subtree {
        "UPDATE schedules SET enabled = 0, next_due_at = NULL WHERE claimed_at IS NULL AND enabled = 1 \
         AND run_id IN (SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1)"
    } else {
        "UPDATE schedules SET enabled = 0, next_due_at = NULL WHERE claimed_at IS NULL AND enabled = 1 \
         AND run_id = ?1"
    };
    tx.execute(sql, vals![run_id])?;
    Ok(())
}

/// Records a schedule with its first due time; `Err` message when the
/// run holds too many.
pub(super) fn create_in(
    tx: &mut dyn Tx,
    new: &NewSchedule,
) -> StoreResult<Result<Schedule, String>> {
    // the per-run limit holds against concurrent creates of the tree
    super::tree::lock_tree_of(tx, &new.run_id)?;
    let held: i64 = tx.scalar(
        "SELECT COUNT(*) FROM schedules WHERE run_id = ?1",
        vals![&new.run_id],
    )?;
    if held >= MAX_SCHEDULES_PER_RUN {
        return Ok(Err(format!(
            "run {} already holds {held} schedules (at most {MAX_SCHEDULES_PER_RUN})",
            new.run_id
        )));
    }
    let id = uuid::Uuid::new_v4().to_string();
    let now = now_ms();
    let command =
        serde_json::to_string(&new.command).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    tx.execute(
        "INSERT INTO schedules (id, run_id, command, timeout_sec, kind, spec, catch_up, \
         delete_after_success, next_due_at, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        vals![
            &id,
            &new.run_id,
            command,
            new.timeout_sec as i64,
            new.timing.kind(),
            new.timing.spec(),
            new.catch_up,
            new.delete_after_success,
            new.timing.first_due(now),
            now,
        ],
    )?;
    let s = get_schedule(tx, &id)?.ok_or_else(|| StoreError::Corrupt(id.clone()))?;
    Ok(Ok(s))
}

/// Locks the trees of every schedule start-up may change (claimed, or
/// due), in one order (sorted roots, so two passes cannot deadlock); the
/// passes below then read them under their locks.
fn lock_trees_at_start(tx: &mut dyn Tx, now: i64) -> StoreResult<()> {
    let runs = tx
        .query(
            "SELECT DISTINCT run_id FROM schedules WHERE claimed_at IS NOT NULL \
             OR (enabled = 1 AND paused = 0 AND next_due_at <= ?1)",
            vals![now],
        )?
        .iter()
        .map(|row| row.get::<String>("run_id"))
        .collect::<StoreResult<Vec<_>>>()?;
    super::tree::lock_trees_of(tx, runs)
}

/// Start-up's claims: a live op's claim is taken over by `kernel_id`, an
/// ended op's schedule is finalized, a claim without an op is released.
fn claims_at_start(
    tx: &mut dyn Tx,
    kernel_id: &str,
    report: &mut StartupReport,
) -> StoreResult<()> {
    let sql = format!("SELECT {COLUMNS} FROM schedules WHERE claimed_at IS NOT NULL");
    for s in readable(tx, &sql, &[])? {
        let op = match &s.current_op_id {
            Some(op_id) => get(tx, op_id)?,
            None => None,
        };
        match op {
            Some(op) if !op.status.is_terminal() => {
                tx.execute(
                    "UPDATE schedules SET claimed_by = ?2 WHERE id = ?1",
                    vals![&s.id, kernel_id],
                )?;
                report.adopted += 1;
            }
            Some(op) => {
                finalize_in(tx, &op)?;
                report.cleared += 1;
            }
            None => {
                tx.execute(
                    "UPDATE schedules SET claimed_at = NULL, claimed_by = NULL, \
                     current_op_id = NULL, current_due_at = NULL WHERE id = ?1",
                    vals![&s.id],
                )?;
                report.cleared += 1;
            }
        }
    }
    Ok(())
}

/// Start-up's overdue schedules, by `catch_up` ([`startup`]).
fn overdue_at_start(
    tx: &mut dyn Tx,
    now: i64,
    covered_since: Option<i64>,
    report: &mut StartupReport,
) -> StoreResult<()> {
    let sql = format!(
        "SELECT {COLUMNS} FROM schedules WHERE enabled = 1 AND paused = 0 \
         AND claimed_at IS NULL AND next_due_at <= ?1"
    );
    for s in readable(tx, &sql, vals![now])? {
        let Some(due) = s.next_due_at else { continue };
        if covered_since.is_some_and(|since| since <= due) {
            continue;
        }
        match startup(&s.timing, s.catch_up, due, now) {
            Startup::NotOverdue => {}
            Startup::FireOnce { .. } => report.catching_up += 1,
            Startup::SkipOneShot => {
                skip_in(tx, &s, due, "overdue at start (catch_up: false)", now)?;
                report.skipped += 1;
            }
            Startup::Advance { .. } => {
                let reason = "missed while the kernel was down (catch_up: false)";
                skip_in(tx, &s, due, reason, now)?;
                report.advanced += 1;
            }
        }
    }
    Ok(())
}

impl Store {
    /// Records a schedule with its first due time; `Err` message when the
    /// run holds too many.
    pub async fn create_schedule(&self, new: NewSchedule) -> StoreResult<Result<Schedule, String>> {
        self.write(move |tx| create_in(tx, &new)).await
    }

    /// The schedule by id; `None` when there is none.
    pub async fn get_schedule(&self, id: &str) -> StoreResult<Option<Schedule>> {
        let id = id.to_owned();
        self.read(move |tx| get_schedule(tx, &id)).await
    }

    /// Schedules of a run and its descendants (or every one), oldest first.
    pub async fn list_schedules(&self, root: Option<String>) -> StoreResult<Vec<Schedule>> {
        self.read(move |tx| {
            let sql = format!(
                "SELECT {COLUMNS} FROM schedules WHERE CAST(?1 AS TEXT) IS NULL OR run_id IN \
                 (SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1) ORDER BY created_at"
            );
            tx.query(&sql, vals![root])?.iter().map(from_row).collect()
        })
        .await
    }

    /// Deletes a schedule (an op it fired goes on as an ordinary op).
    pub async fn delete_schedule(&self, id: &str) -> StoreResult<bool> {
        let id = id.to_owned();
        self.write(move |tx| {
            Ok(tx.execute("DELETE FROM schedules WHERE id = ?1", vals![&id])? == 1)
        })
        .await
    }

    /// Pauses or resumes a schedule. A resumed recurring schedule whose
    /// due time passed meanwhile goes on from its next future slot.
    pub async fn pause_schedule(&self, id: &str, paused: bool) -> StoreResult<Option<Schedule>> {
        let id = id.to_owned();
        self.write(move |tx| {
            let Some(s) = get_schedule(tx, &id)? else {
                return Ok(None);
            };
            // serialized with the schedule's firing (a claim under the same
            // lock), then read again: the write below is from what is now
            super::tree::lock_tree_of(tx, &s.run_id)?;
            let Some(s) = get_schedule(tx, &id)? else {
                return Ok(None);
            };
            let now = now_ms();
            let next = match s.next_due_at {
                Some(due) if !paused && s.paused && due <= now && s.timing.is_recurring() => {
                    s.timing.next_after_now(due, now).0
                }
                other => other,
            };
            tx.execute(
                "UPDATE schedules SET paused = ?2, next_due_at = ?3 WHERE id = ?1",
                vals![&id, paused, next],
            )?;
            get_schedule(tx, &id)
        })
        .await
    }

    /// Due, enabled, unpaused and unclaimed schedules, most overdue first.
    pub async fn due_schedules(&self, now: i64, limit: u32) -> StoreResult<Vec<Schedule>> {
        self.read(move |tx| {
            let sql = format!(
                "SELECT {COLUMNS} FROM schedules WHERE enabled = 1 AND paused = 0 \
                 AND claimed_at IS NULL AND next_due_at <= ?1 ORDER BY next_due_at LIMIT ?2"
            );
            readable(tx, &sql, vals![now, limit])
        })
        .await
    }

    /// The earliest due time of any schedule that could fire.
    pub async fn next_schedule_due(&self) -> StoreResult<Option<i64>> {
        self.read(move |tx| {
            tx.scalar(
                "SELECT MIN(next_due_at) FROM schedules WHERE enabled = 1 AND paused = 0 \
                 AND claimed_at IS NULL",
                &[],
            )
        })
        .await
    }

    /// Start-up, before the scheduler's first batch (see the module
    /// comment). Idempotent: a second run changes nothing.
    pub async fn schedules_at_start(&self, kernel_id: &str) -> StoreResult<StartupReport> {
        let kernel_id = kernel_id.to_owned();
        let node = self.node().map(str::to_owned);
        self.write(move |tx| {
            let now = now_ms();
            let mut report = StartupReport::default();
            lock_trees_at_start(tx, now)?;
            claims_at_start(tx, &kernel_id, &mut report)?;
            // a node starting beside nodes up since before a due time
            // finds nothing missed there: their schedulers fire it
            let covered_since = match &node {
                Some(me) => super::lease::others_up_since(tx, me)?,
                None => None,
            };
            overdue_at_start(tx, now, covered_since, &mut report)?;
            Ok(report)
        })
        .await
    }
}

#[cfg(test)]
#[path = "schedules_tests.rs"]
mod tests;
