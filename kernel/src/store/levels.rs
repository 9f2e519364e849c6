//! The control plane's levels for the metrics: read at each scrape.

use super::{Store, StoreResult};
use crate::lifecycle::{live_sql, terminal_sql};

/// Live ops, and resolved background ops not yet delivered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreLevels {
    /// Ops not yet terminal.
    pub live_ops: i64,
    /// Resolved background ops waiting for a report.
    pub reports_pending: i64,
    /// Webhook posts not yet taken by the receiver.
    pub webhook_pending: i64,
}

impl Store {
    /// The levels the metrics show, read in one snapshot.
    pub async fn levels(&self) -> StoreResult<StoreLevels> {
        self.read(|tx| {
            let sql = format!(
                "SELECT (SELECT COUNT(*) FROM ops WHERE status IN ({})) AS live, \
                 (SELECT COUNT(*) FROM ops WHERE background = 1 AND status IN ({}) \
                  AND report_id IS NULL AND delivered_inline = 0) AS pending, \
                 (SELECT COUNT(*) FROM webhook_outbox) AS posts",
                live_sql(),
                terminal_sql()
            );
            let row = tx.query_one(&sql, &[])?;
            Ok(StoreLevels {
                live_ops: row.get("live")?,
                reports_pending: row.get("pending")?,
                webhook_pending: row.get("posts")?,
            })
        })
        .await
    }
}
