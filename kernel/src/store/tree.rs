//! Run trees as the serialization unit of the control plane (SPEC §19):
//! a tree's root, and the lock every transaction script that reads or
//! changes what the tree's runs may do takes first. On SQLite the lock is
//! the `IMMEDIATE` transaction itself; on PostgreSQL the root's row.

use super::db::Tx;
use super::{StoreError, StoreResult};
use crate::vals;

/// The root of the run tree `run_id` belongs to: the first of its chain,
/// or the run itself (a top-level run, or one not recorded yet). A run's
/// chain never changes, so it may be read before the tree is locked.
pub(super) fn tree_root(tx: &mut dyn Tx, run_id: &str) -> StoreResult<String> {
    let chain: Option<String> = tx
        .query_opt("SELECT chain FROM runs WHERE run_id = ?1", vals![run_id])?
        .map(|row| row.get("chain"))
        .transpose()?;
    let chain: Vec<String> = match chain {
        Some(chain) => serde_json::from_str(&chain)
            .map_err(|e| StoreError::Corrupt(format!("run {run_id} chain: {e}")))?,
        None => Vec::new(),
    };
    Ok(chain
        .into_iter()
        .next()
        .unwrap_or_else(|| run_id.to_owned()))
}

/// Serializes the transaction with every other one of the run tree
/// `run_id` belongs to ([`Tx::lock_tree`] on its root); returns the root.
pub(super) fn lock_tree_of(tx: &mut dyn Tx, run_id: &str) -> StoreResult<String> {
    let root = tree_root(tx, run_id)?;
    tx.lock_tree(&root)?;
    Ok(root)
}
