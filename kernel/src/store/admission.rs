//! Admission: whether a run may admit a new op or child run now, read
//! inside the admitting transaction. The run and every ancestor must be
//! active; no budget on the way up may be reached (each counted over its
//! owner's whole subtree, from the ledger); no envelope limit on the chain
//! may be passed (live ops, unfinished children, each over the subtree).

use super::db::Tx;
use super::journal::usage_over_subtree;
use super::{StoreError, StoreResult};
use crate::lifecycle::live_sql;
use crate::runs::{Budget, Envelope, LimitUse, RunState};
use crate::vals;

/// Live-op limits checked in the insert's own transaction, so concurrent
/// starts cannot pass them together.
#[derive(Debug, Clone, Copy)]
pub struct Admission {
    /// The live ops a run and its descendants may have together when the
    /// run has the kernel's default envelope (a run with its own envelope
    /// uses its `max_live_ops`).
    pub max_live_per_run: u64,
    /// Every live op of the kernel.
    pub max_live: u64,
    /// The unfinished descendant runs a run may have when it has the
    /// kernel's default envelope (else its envelope's `max_children`).
    pub max_children: u64,
    /// A run not recorded yet may be created (as a top-level run with the
    /// kernel's defaults): the operator's implicit run, never a run
    /// token's (its run is gone: purged, it must not come back unbounded).
    pub implicit_run: bool,
}

impl Admission {
    /// No limit (tests, drills and tools that write rows directly).
    pub const UNLIMITED: Admission = Admission {
        max_live_per_run: u64::MAX,
        max_live: u64::MAX,
        max_children: u64::MAX,
        implicit_run: true,
    };
}

/// Why a run may not admit a new op or child run now.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// A live-op limit is reached (429).
    Limit(String),
    /// The run or an ancestor is paused, completed or cancelled (409).
    State {
        /// The run whose state refuses (the run itself or an ancestor).
        run_id: String,
        /// Its state.
        state: RunState,
    },
    /// A budget limit of the run or an ancestor is reached (409).
    Budget(LimitUse),
    /// The run is not recorded (purged) and may not be created here (404).
    NoRun(String),
    /// No cluster node can take the run's tree: none is active with a
    /// live lease (503).
    NoNode(String),
    /// The request is over the run's envelope or a kernel ceiling (e.g. a
    /// schedule's `timeout_sec` above a ceiling lowered since it was made):
    /// a standing refusal (403 `envelope_exceeded`).
    Ceiling(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Limit(m) | Refusal::Ceiling(m) => f.write_str(m),
            Refusal::State { run_id, state } => write!(
                f,
                "run {run_id} is {}: nothing new is admitted{}",
                state.as_str(),
                if *state == RunState::Paused {
                    " until it is resumed"
                } else {
                    ""
                }
            ),
            Refusal::Budget(e) => e.fmt(f),
            Refusal::NoNode(run) => write!(
                f,
                "no active cluster node can take run {run}: every node is draining, dead or without a lease"
            ),
            Refusal::NoRun(run) => write!(
                f,
                "run {run} does not exist (a finished run tree is purged after OPKERNEL_RETENTION)"
            ),
        }
    }
}

/// A run's ancestors' rows, itself first (each admission reads them, by
/// the index of ancestry by run).
const ANCESTORS: &str = "FROM run_ancestry a JOIN runs r ON r.run_id = a.ancestor_id \
     WHERE a.run_id = ?1 ORDER BY a.distance";

/// The run and its ancestors (nearest first), as admission reads them.
fn lineage(tx: &mut dyn Tx, run_id: &str) -> StoreResult<Vec<(String, RunState, Budget)>> {
    let rows = tx.query(
        &format!("SELECT r.run_id AS run_id, r.state AS state, r.budget AS budget {ANCESTORS}"),
        vals![run_id],
    )?;
    rows.iter()
        .map(|row| {
            let id: String = row.get("run_id")?;
            let state: String = row.get("state")?;
            let budget: String = row.get("budget")?;
            let state = RunState::parse(&state)
                .ok_or_else(|| StoreError::Corrupt(format!("run {id} state {state}")))?;
            let budget: Budget = serde_json::from_str(&budget)
                .map_err(|e| StoreError::Corrupt(format!("run {id} budget: {e}")))?;
            Ok((id, state, budget))
        })
        .collect()
}

/// Whether the run may admit something new: it and every ancestor are
/// active, and no budget on the way up is reached (each budget counts the
/// ledger over its run's whole subtree, derived now).
pub(super) fn run_refusal(tx: &mut dyn Tx, run_id: &str) -> StoreResult<Option<Refusal>> {
    let lineage = lineage(tx, run_id)?;
    for (id, state, _) in &lineage {
        if *state != RunState::Active {
            return Ok(Some(Refusal::State {
                run_id: id.clone(),
                state: *state,
            }));
        }
    }
    for (id, _, budget) in &lineage {
        if budget.is_empty() {
            continue;
        }
        if let Some(mut e) = usage_over_subtree(tx, id)?.exhausted(budget) {
            e.run_id = id.clone();
            return Ok(Some(Refusal::Budget(e)));
        }
    }
    Ok(None)
}

/// What a run tree's envelope limits count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Live ops of a run and its descendants (`max_live_ops`).
    Ops,
    /// Unfinished descendant runs (`max_children`).
    Children,
}

/// The envelopes of a run and its ancestors (nearest first); `None` is
/// the kernel's default envelope.
fn lineage_envelopes(
    tx: &mut dyn Tx,
    run_id: &str,
) -> StoreResult<Vec<(String, Option<Envelope>)>> {
    let rows = tx.query(
        &format!("SELECT r.run_id AS run_id, r.envelope AS envelope {ANCESTORS}"),
        vals![run_id],
    )?;
    rows.iter()
        .map(|row| {
            let id: String = row.get("run_id")?;
            let envelope: String = row.get("envelope")?;
            if envelope == "{}" {
                return Ok((id, None));
            }
            let envelope = serde_json::from_str(&envelope)
                .map_err(|e| StoreError::Corrupt(format!("run {id} envelope: {e}")))?;
            Ok((id, Some(envelope)))
        })
        .collect()
}

/// How many of `counted` the subtree of `run_id` holds now.
fn count_in_subtree(tx: &mut dyn Tx, run_id: &str, counted: Counted) -> StoreResult<u64> {
    match counted {
        Counted::Ops => live_in_subtree(tx, run_id),
        Counted::Children => {
            let n: i64 = tx.scalar(
                "SELECT COUNT(*) FROM run_ancestry a JOIN runs r ON r.run_id = a.run_id \
                 WHERE a.ancestor_id = ?1 AND a.distance > 0 \
                 AND r.state IN ('active', 'paused')",
                vals![run_id],
            )?;
            Ok(n as u64)
        }
    }
}

/// Whether a new op of `run_id` (or a new child of it) would take its run
/// tree past an envelope limit: the run's own and every ancestor's, each
/// counted over its whole subtree (a parent's `max_live_ops` bounds its
/// children's ops too). A run not recorded yet counts as a top-level run
/// with the kernel's defaults.
pub(super) fn tree_limit_refusal(
    tx: &mut dyn Tx,
    run_id: &str,
    counted: Counted,
    limits: Admission,
) -> StoreResult<Option<String>> {
    let mut lineage = lineage_envelopes(tx, run_id)?;
    if lineage.is_empty() {
        lineage.push((run_id.to_owned(), None));
    }
    for (id, envelope) in lineage {
        let (limit, name) = match (counted, &envelope) {
            (Counted::Ops, Some(e)) => (e.max_live_ops, "max_live_ops"),
            (Counted::Ops, None) => (limits.max_live_per_run, "max_live_ops"),
            (Counted::Children, Some(e)) => (e.max_children, "max_children"),
            (Counted::Children, None) => (limits.max_children, "max_children"),
        };
        if limit == u64::MAX {
            continue;
        }
        let n = count_in_subtree(tx, &id, counted)?;
        if n >= limit {
            let what = match counted {
                Counted::Ops => "live operations",
                Counted::Children => "unfinished child runs",
            };
            return Ok(Some(format!(
                "run {id} and its descendants already have {n} {what} (limit {limit}, envelope {name} of run {id})"
            )));
        }
    }
    Ok(None)
}

/// The tightest limit of each kind on the run's chain (its own budget
/// included): what a child's budget may not exceed.
pub(super) fn tightest_budget(tx: &mut dyn Tx, run_id: &str) -> StoreResult<Budget> {
    Ok(lineage(tx, run_id)?
        .iter()
        .fold(Budget::default(), |acc, (_, _, b)| acc.tightest(b)))
}

/// Per limit kind set anywhere on the run's chain, the one with the least
/// left (the run's own or an ancestor's, over that run's subtree): what
/// the run can still spend. Empty when no budget applies.
pub(super) fn budget_status(tx: &mut dyn Tx, run_id: &str) -> StoreResult<Vec<LimitUse>> {
    let mut best: Vec<LimitUse> = Vec::new();
    for (id, _, budget) in lineage(tx, run_id)? {
        if budget.is_empty() {
            continue;
        }
        let used = usage_over_subtree(tx, &id)?;
        for (limit, used, max) in used.amounts(&budget) {
            let left = max as f64 - used;
            match best.iter_mut().find(|b| b.limit == limit) {
                Some(b) if b.max as f64 - b.used <= left => {}
                Some(b) => {
                    *b = LimitUse {
                        limit,
                        used,
                        max,
                        run_id: id.clone(),
                    };
                }
                None => best.push(LimitUse {
                    limit,
                    used,
                    max,
                    run_id: id.clone(),
                }),
            }
        }
    }
    best.sort_by_key(|b| crate::runs::LIMITS.iter().position(|l| *l == b.limit));
    Ok(best)
}

/// Live ops of a run and its descendants.
pub(super) fn live_in_subtree(tx: &mut dyn Tx, run_id: &str) -> StoreResult<u64> {
    let n: i64 = tx.scalar(
        &format!(
            "SELECT COUNT(*) FROM ops WHERE status IN ({}) AND run_id IN \
             (SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1)",
            live_sql()
        ),
        vals![run_id],
    )?;
    Ok(n as u64)
}

#[cfg(test)]
mod tests {
    /// A run's lineage is read by the run, not by scanning every run's
    /// ancestry.
    #[tokio::test]
    async fn a_lineage_is_read_by_its_run() {
        let sql = format!("SELECT r.run_id {}", super::ANCESTORS);
        let plan = crate::store::sqlite_query_plan(&sql).await;
        assert!(
            plan[0].contains("run_ancestry_by_run (run_id=?)"),
            "{plan:?}"
        );
        assert!(
            plan.iter().all(|step| !step.starts_with("SCAN")),
            "{plan:?}"
        );
    }
}
