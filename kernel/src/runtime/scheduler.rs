//! The scheduler loop (SPEC §15): at start it settles what a dead kernel
//! left (claims, overdue schedules by `catch_up`), then fires each due
//! schedule as its run: the run's approval rules and live-op limit apply,
//! and the op it fires is an ordinary background op of the run. A stop
//! lets the batch under way be recorded; each fire is one transaction, so
//! nothing is ever half done either way.

use std::sync::Arc;
use std::time::Duration;

use crate::base::sync::Stop;
use crate::runtime::kernel::Kernel;
use crate::store::{now_ms, Fire, Reconciled, Schedule};

/// Schedules fired per batch (the rest wait for the next one, at once).
const BATCH: u32 = 100;
/// Longest sleep between batches (a schedule made meanwhile is seen by it).
const MAX_NAP: Duration = Duration::from_millis(500);
/// Shortest sleep between batches.
const MIN_NAP: Duration = Duration::from_millis(20);

/// The start-up rules: what a dead kernel left (claims, overdue schedules
/// by `catch_up`) is settled before the loop starts.
pub async fn at_start(k: &Kernel) -> Result<(), crate::store::StoreError> {
    let report = k.store.schedules_at_start(&k.id).await?;
    tracing::info!(?report, "schedules at start");
    Ok(())
}

/// Fires due schedules until the housekeeping stops; a stop lets the
/// batch under way be recorded (it is never interrupted).
pub async fn run(k: Arc<Kernel>, mut stop: Stop) {
    loop {
        let fired = match k.store.due_schedules(now_ms(), BATCH).await {
            Ok(due) => {
                let n = due.len();
                for s in due {
                    fire_one(&k, s).await;
                }
                n
            }
            Err(e) => {
                tracing::warn!(%e, "cannot read due schedules");
                0
            }
        };
        let nap = if fired as u32 >= BATCH {
            Duration::ZERO
        } else {
            // at least MIN_NAP: a schedule that stays due (a row that
            // cannot fire) never spins the loop
            match k.store.next_schedule_due().await {
                Ok(Some(due)) => Duration::from_millis(
                    (due - now_ms()).clamp(MIN_NAP.as_millis() as i64, MAX_NAP.as_millis() as i64)
                        as u64,
                ),
                _ => MAX_NAP,
            }
        };
        if !stop.nap(nap).await {
            return;
        }
    }
}

/// Fires one due schedule as its run, and starts the op it fired.
async fn fire_one(k: &Arc<Kernel>, s: Schedule) {
    let Some(due) = s.next_due_at else { return };
    let meta = match k
        .run_meta_or_create(
            &s.run_id,
            Some(&crate::origin::Origin::schedule_fire(&s.id, &s.run_id)),
        )
        .await
    {
        Ok(meta) => meta,
        Err(e) => {
            tracing::warn!(schedule = %s.id, %e, "cannot read the schedule's run");
            return;
        }
    };
    let hold = k.approval_hold(&meta, &s.command);
    let limits = k.config.admission();
    // a timeout above the kernel's ceiling or the run's envelope (either
    // lowered since the schedule was made) is refused, never clamped
    let ceiling = k
        .config
        .ops
        .bg_max_sec
        .min(meta.envelope.max_timeout_sec.unwrap_or(u64::MAX));
    let fired = match s.timeout_sec > ceiling {
        true => {
            let why = crate::store::Refusal::Ceiling(format!(
                "the schedule's timeout_sec {} is over the ceiling {ceiling} \
                 (OPKERNEL_BG_MAX_TIMEOUT or the run's envelope max_timeout_sec)",
                s.timeout_sec
            ));
            k.store.refuse_fire(&s.id, due, &k.id, why).await
        }
        false => crate::runtime::control::fire_schedule(k, &s.id, due, hold, limits).await,
    };
    match fired {
        Ok(Fire::Fired(op)) => {
            tracing::info!(schedule = %s.id, op = %op.id, run = %s.run_id, due, "schedule fired");
        }
        Ok(Fire::Adopted(_)) => {}
        Ok(Fire::Skipped(reason)) => {
            tracing::info!(schedule = %s.id, %reason, "schedule skipped a due time");
        }
        Ok(Fire::NotDue) => {}
        Err(e) => tracing::warn!(schedule = %s.id, %e, "cannot fire schedule"),
    }
}

/// At start, before any schedule fires: the operator's declared schedules
/// (`OPKERNEL_SCHEDULES`) reconciled with the control plane (SPEC §28). An
/// entry that cannot be made stops the start, naming it.
pub async fn reconcile_declared(k: &Arc<Kernel>) -> anyhow::Result<()> {
    let Some(file) = k.config.declared.clone() else {
        return Ok(());
    };
    let path = file.path.clone();
    let node = k.store.node().map_or_else(|| k.id.clone(), str::to_owned);
    let hook = k.clone();
    let midway: crate::store::Midway = Box::new(move || hook.crash_point("declared.midway"));
    match k
        .store
        .reconcile_declared(file, &node, Some(midway))
        .await?
    {
        Reconciled::Unchanged => {
            tracing::info!(%path, "declared schedules: the file is the one followed already")
        }
        Reconciled::Older => tracing::warn!(
            %path,
            "declared schedules: this file was followed before and a newer one since: not applied \
             (a node with an older copy never undoes a newer one; change the file to apply it)"
        ),
        Reconciled::Applied {
            created,
            updated,
            removed,
        } => tracing::info!(%path, created, updated, removed, "declared schedules reconciled"),
        Reconciled::Refused(why) => anyhow::bail!("OPKERNEL_SCHEDULES {path}: {why}"),
    }
    Ok(())
}
