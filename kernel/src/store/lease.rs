//! Leases judged on the database's clock (SPEC §20), below every row
//! module that needs them: the nodes' membership, and the schedules'
//! start-up rules (a node starting beside live ones missed nothing).

use super::db::{Dialect, Tx};
use super::StoreResult;
use crate::vals;

/// The database's clock in unix milliseconds, as SQL: leases are judged by
/// it alone, so the nodes' own clocks may drift.
pub(super) fn db_now(tx: &dyn Tx) -> &'static str {
    match tx.dialect() {
        Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
    }
}

/// Whether a node other than `me` holds a live lease (the cluster is up
/// without `me`).
pub(super) fn others_live(tx: &mut dyn Tx, me: &str) -> StoreResult<bool> {
    let sql = format!(
        "SELECT name FROM nodes WHERE name <> ?1 AND state <> 'dead' AND lease_until > {} LIMIT 1",
        db_now(tx)
    );
    Ok(tx.query_opt(&sql, vals![me])?.is_some())
}
