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

/// Since when (unix ms, on this kernel's clock) a node other than `me`
/// has held a live lease without a break (its last join), the earliest of
/// them; `None` when no other node holds one. A due time after it was seen
/// by that node's scheduler: the cluster missed nothing.
pub(super) fn others_up_since(tx: &mut dyn Tx, me: &str) -> StoreResult<Option<i64>> {
    let now = db_now(tx);
    let sql = format!(
        "SELECT MIN(joined_at) AS since, {now} AS db_now FROM nodes \
         WHERE name <> ?1 AND state <> 'dead' AND lease_until > {now}"
    );
    let Some(row) = tx.query_opt(&sql, vals![me])? else {
        return Ok(None);
    };
    let since: Option<i64> = row.get("since")?;
    let db_now: i64 = row.get("db_now")?;
    Ok(since.map(|s| s - db_now + super::now_ms()))
}
