//! Run trees as the serialization unit of the control plane (SPEC §19):
//! a tree's root, and the lock every transaction script that reads or
//! changes what the tree's runs may do takes first. On SQLite the lock is
//! the `IMMEDIATE` transaction itself; on PostgreSQL a transaction-scoped
//! advisory lock keyed by the root's id.

use super::db::{Dialect, Tx};
use super::{StoreError, StoreResult};
use crate::vals;

/// The root of the run tree `run_id` belongs to: the first of its chain,
/// or the run itself (a top-level run, or one not recorded yet). A
/// recorded run's chain never changes, so it may be read before the tree
/// is locked.
pub(super) fn tree_root(tx: &mut dyn Tx, run_id: &str) -> StoreResult<String> {
    Ok(recorded_root(tx, run_id)?.unwrap_or_else(|| run_id.to_owned()))
}

/// The root of a recorded run's tree; `None` when the run is not recorded.
fn recorded_root(tx: &mut dyn Tx, run_id: &str) -> StoreResult<Option<String>> {
    let Some(row) = tx.query_opt("SELECT chain FROM runs WHERE run_id = ?1", vals![run_id])? else {
        return Ok(None);
    };
    let chain: String = row.get("chain")?;
    let chain: Vec<String> = serde_json::from_str(&chain)
        .map_err(|e| StoreError::Corrupt(format!("run {run_id} chain: {e}")))?;
    Ok(Some(
        chain
            .into_iter()
            .next()
            .unwrap_or_else(|| run_id.to_owned()),
    ))
}

/// Locks the trees of several runs, each once and in one order (sorted
/// roots), so two transactions doing so cannot deadlock.
pub(super) fn lock_trees_of(
    tx: &mut dyn Tx,
    run_ids: impl IntoIterator<Item = String>,
) -> StoreResult<()> {
    let mut roots = std::collections::BTreeSet::new();
    for run_id in run_ids {
        roots.insert(tree_root(tx, &run_id)?);
    }
    for root in &roots {
        tx.lock_tree(root)?;
    }
    Ok(())
}

/// Serializes the transaction with every other one of the run tree
/// `run_id` belongs to ([`Tx::lock_tree`] on its root); returns the root.
/// A run not recorded when its root was read may have been recorded (as
/// another tree's child) before the lock was granted: on PostgreSQL it is
/// read again under the lock, and that tree locked too.
pub(super) fn lock_tree_of(tx: &mut dyn Tx, run_id: &str) -> StoreResult<String> {
    if let Some(root) = tx.locked_root(run_id) {
        return Ok(root);
    }
    let (mut root, recorded) = match tx.dialect() {
        Dialect::Postgres => pg_lock_root_of(tx, run_id)?,
        Dialect::Sqlite => {
            let recorded = recorded_root(tx, run_id)?;
            let root = recorded.clone().unwrap_or_else(|| run_id.to_owned());
            tx.lock_tree(&root)?;
            (root, recorded.is_some())
        }
    };
    if !recorded && tx.dialect() == Dialect::Postgres {
        if let Some(now) = recorded_root(tx, run_id)?.filter(|now| *now != root) {
            tx.lock_tree(&now)?;
            root = now;
        }
    }
    // a recorded run's root never changes: the next lookup in this
    // transaction may skip the read; one not recorded yet is read again
    if recorded || root != run_id {
        tx.note_locked(run_id, &root);
    }
    Ok(root)
}

/// PostgreSQL: the root of `run_id`'s tree read and its lock taken in one
/// statement (one round trip, where a read and a lock would be two), and
/// whether the run was recorded when the statement began. The lock is the
/// one [`Tx::lock_tree`] takes, noted so it is not taken again.
fn pg_lock_root_of(tx: &mut dyn Tx, run_id: &str) -> StoreResult<(String, bool)> {
    let row = tx.query_one(
        "SELECT t.root AS root, t.recorded AS recorded FROM \
         (SELECT COALESCE((SELECT CAST(chain AS json)->>0 FROM runs WHERE run_id = ?1), CAST(?1 AS TEXT)) AS root, \
          CAST(CASE WHEN EXISTS (SELECT 1 FROM runs WHERE run_id = ?1) THEN 1 ELSE 0 END AS BIGINT) AS recorded) AS t, \
         LATERAL (SELECT pg_advisory_xact_lock(hashtextextended(t.root, 0))) AS l",
        vals![run_id],
    )?;
    let root: String = row.get("root")?;
    let recorded: i64 = row.get("recorded")?;
    tx.note_tree_locked(&root);
    Ok((root, recorded == 1))
}
