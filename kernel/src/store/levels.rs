//! The control plane's levels for the metrics (all but the containers,
//! which Docker has): read at each scrape.

use super::{Store, StoreResult};
use crate::base::metrics::Levels;
use crate::lifecycle::{live_sql, terminal_sql};

impl Store {
    /// The levels the metrics show, read in one snapshot.
    pub async fn levels(&self) -> StoreResult<Levels> {
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
            Ok(Levels {
                live_ops: row.get("live")?,
                reports_pending: row.get("pending")?,
                webhook_pending: row.get("posts")?,
                ..Levels::default()
            })
        })
        .await
    }
}
