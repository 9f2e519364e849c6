//! The run-change transaction script (SPEC §14): a run's state change by
//! compare-and-set with its event, in one IMMEDIATE transaction, in this
//! order: the transition rule with the pause of record
//! (`runs::transition_by`), a completion's check that nothing of the
//! subtree is live, the write, then the cascades: a cancel cancels the
//! subtree, requests every kill, denies every waiting op and ends the
//! subtree's schedules; a completion ends the run's schedules. It sits
//! above `runs`, `approvals` and `schedules`, which name none of it.

use super::admission::live_in_subtree;
use super::db::Tx;
use super::hints::HintKind;
use super::journal::append_event;
use super::runs::{get_run, run_states, RunChange, RunRecord};
use super::tree::lock_tree_of;
use super::{now_ms, Store, StoreError, StoreResult};
use crate::event_kind::{EventKind, RunChanged};
use crate::lifecycle::{observed_sql, KillReason};
use crate::runs::{pause_rank, transition, transition_by, RunAction, RunState, Transition};
use crate::vals;

impl Store {
    /// Applies `action` to a run by compare-and-set, with its event, in one
    /// transaction. `complete` is refused while ops of the run or its
    /// descendants are live. `cancel` also cancels every descendant that is
    /// not over and records a durable kill request for every live op of
    /// the run and its descendants (their observers act on them, now or
    /// after a restart).
    pub async fn change_run(
        &self,
        run_id: &str,
        action: RunAction,
        by: &str,
        summary: Option<String>,
    ) -> StoreResult<RunChange> {
        let (run_id, by) = (run_id.to_owned(), by.to_owned());
        self.write(move |tx| change_in(tx, &run_id, action, &by, summary.clone()))
            .await
    }
}

/// The run-change transaction script (see the module comment).
fn change_in(
    tx: &mut dyn Tx,
    run_id: &str,
    action: RunAction,
    by: &str,
    summary: Option<String>,
) -> StoreResult<RunChange> {
    // locks the run's tree (its root is the first of the run's chain): a
    // change, and a cancel's cascade over the subtree, is serialized with
    // the tree's admissions, settlements and drains
    lock_tree_of(tx, run_id)?;
    // read after the lock: the transition depends on the state it finds
    let Some(run) = get_run(tx, run_id)? else {
        return Ok(RunChange::NotFound);
    };
    let mut changed = Vec::new();
    let mut kills = Vec::new();
    let mut denied = Vec::new();
    let rank = |who: &str| pause_rank(who, &run.chain, &run.run_id);
    let pauser = run.paused_by.as_deref().map(rank);
    match transition_by(run.state, action, rank(by), pauser) {
        Transition::Refused(state) => return Ok(RunChange::Refused(state)),
        Transition::PausedAbove => {
            let pauser = run.paused_by.clone().unwrap_or_default();
            return Ok(RunChange::PausedAbove(pauser));
        }
        Transition::Already => {}
        Transition::TakeOver => {
            take_over_pause(tx, &run, by)?;
            changed.push(run_id.to_owned());
        }
        Transition::Change { from, to } => {
            if action == RunAction::Complete {
                let live = live_in_subtree(tx, run_id)?;
                if live > 0 {
                    return Ok(RunChange::LiveOps(live));
                }
            }
            let data = RunChanged {
                summary: summary.clone(),
                ..RunChanged::by(by)
            };
            let change = StateChange { from, to, action };
            set_state(tx, run_id, change, by, summary.as_deref(), data)?;
            changed.push(run_id.to_owned());
        }
    }
    if action == RunAction::Cancel {
        (kills, denied) = cancel_cascade(tx, run_id, by, &mut changed)?;
    }
    if action == RunAction::Complete && !changed.is_empty() {
        super::schedules::end_schedules_of(tx, run_id, false)?;
    }
    let run = get_run(tx, run_id)?.ok_or_else(|| StoreError::Corrupt(run_id.to_owned()))?;
    Ok(RunChange::Done {
        run: Box::new(run),
        changed,
        kills,
        denied,
    })
}

/// One compare-and-set move of a run's state, by `action`.
#[derive(Debug, Clone, Copy)]
struct StateChange {
    from: RunState,
    to: RunState,
    action: RunAction,
}

/// What a cancel does below and beside the run, in its transaction, in
/// order: every descendant not over is cancelled (a repeated cancel
/// re-checks the subtree: nothing may have been left out by an earlier
/// one), every observed op of the subtree gets a durable kill request,
/// every waiting op is denied, and the subtree's schedules end. Returns
/// the ops to kill and those denied; cancelled runs join `changed`.
fn cancel_cascade(
    tx: &mut dyn Tx,
    run_id: &str,
    by: &str,
    changed: &mut Vec<String>,
) -> StoreResult<(Vec<String>, Vec<String>)> {
    let action = RunAction::Cancel;
    for (id, state) in descendants(tx, run_id)? {
        if let Transition::Change { from, to } = transition(state, action) {
            let data = RunChanged {
                cancelled_with: Some(run_id.to_owned()),
                ..RunChanged::by(by)
            };
            set_state(tx, &id, StateChange { from, to, action }, by, None, data)?;
            changed.push(id);
        }
    }
    let kills = request_kills_in_subtree(tx, run_id)?;
    let denied = super::approvals::deny_waiting_in_subtree(tx, run_id)?;
    super::schedules::end_schedules_of(tx, run_id, true)?;
    Ok((kills, denied))
}

/// A pause from above the current pauser becomes the pause of record
/// (compare-and-set on the pauser it replaces), with its `run.paused` event.
fn take_over_pause(tx: &mut dyn Tx, run: &RunRecord, by: &str) -> StoreResult<()> {
    let n = tx.execute(
        "UPDATE runs SET paused_by = ?3 WHERE run_id = ?1 AND state = 'paused' \
         AND paused_by IS NOT DISTINCT FROM ?2",
        vals![&run.run_id, &run.paused_by, by],
    )?;
    if n != 1 {
        return Err(StoreError::Corrupt(format!(
            "run {} changed pauser inside its own transaction",
            run.run_id
        )));
    }
    let data = RunChanged {
        over: Some(run.paused_by.clone()),
        ..RunChanged::by(by)
    };
    append_event(tx, &run.run_id, None, run_event(RunAction::Pause, data))?;
    Ok(())
}

/// Descendants of a run (not the run itself), nearest first.
fn descendants(tx: &mut dyn Tx, run_id: &str) -> StoreResult<Vec<(String, RunState)>> {
    run_states(
        tx,
        "SELECT r.run_id AS run_id, r.state AS state FROM run_ancestry a \
         JOIN runs r ON r.run_id = a.run_id \
         WHERE a.ancestor_id = ?1 AND a.distance > 0 ORDER BY a.distance, r.created_at",
        run_id,
    )
}

/// The compare-and-set write of a run's state, with its event.
fn set_state(
    tx: &mut dyn Tx,
    run_id: &str,
    change: StateChange,
    by: &str,
    summary: Option<&str>,
    data: RunChanged,
) -> StoreResult<()> {
    let StateChange { from, to, action } = change;
    let decided = to.is_final();
    let n = tx.execute(
        "UPDATE runs SET state = ?3, state_changed_at = ?4, \
         summary = COALESCE(?5, summary), decided_by = CASE WHEN ?6 = 1 THEN ?7 ELSE decided_by END, \
         paused_by = CASE WHEN ?3 = 'paused' THEN ?7 ELSE NULL END \
         WHERE run_id = ?1 AND state = ?2",
        vals![
            run_id,
            from.as_str(),
            to.as_str(),
            now_ms(),
            summary,
            decided,
            by
        ],
    )?;
    if n != 1 {
        return Err(StoreError::Corrupt(format!(
            "run {run_id} left {} inside its own transaction",
            from.as_str()
        )));
    }
    append_event(tx, run_id, None, run_event(action, data))?;
    Ok(())
}

/// The event of a run's state change by `action`.
fn run_event(action: RunAction, data: RunChanged) -> EventKind {
    match action {
        RunAction::Pause => EventKind::RunPaused(data),
        RunAction::Resume => EventKind::RunResumed(data),
        RunAction::Complete => EventKind::RunCompleted(data),
        RunAction::Cancel => EventKind::RunCancelled(data),
    }
}

/// Records a kill request on every observed op (starting or running) of a
/// run and its descendants that has none yet; returns every such op (each
/// needs its observer to act). Waiting ops are denied instead.
fn request_kills_in_subtree(tx: &mut dyn Tx, run_id: &str) -> StoreResult<Vec<String>> {
    tx.execute(
        &format!(
            "UPDATE ops SET kill_requested_at = ?2, kill_reason = ?3 \
             WHERE kill_requested_at IS NULL AND status IN ({observed}) AND run_id IN \
             (SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1)",
            observed = observed_sql()
        ),
        vals![run_id, now_ms(), KillReason::Cancel.as_str()],
    )?;
    let sql = format!(
        "SELECT id, node FROM ops WHERE status IN ({observed}) AND run_id IN \
         (SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1) ORDER BY created_at",
        observed = observed_sql()
    );
    let mut ids = Vec::new();
    for row in tx.query(&sql, vals![run_id])? {
        let (id, node): (String, Option<String>) = (row.get("id")?, row.get("node")?);
        super::hints::notify_in(tx, node.as_deref(), HintKind::Kill, &id)?;
        ids.push(id);
    }
    Ok(ids)
}
