//! Registered runs and their tokens (stored as sha256, never in clear).

use rusqlite::{params, OptionalExtension};

use super::{now_ms, Store, StoreResult};

impl Store {
    /// Registers a run (or re-keys it) with the hash of its new token.
    pub async fn register_run(&self, run_id: &str, token_sha256: &str) -> StoreResult<()> {
        let (run_id, token) = (run_id.to_owned(), token_sha256.to_owned());
        self.call(move |conn| {
            conn.execute(
                "INSERT INTO runs (run_id, token_sha256, created_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (run_id) DO UPDATE SET token_sha256 = excluded.token_sha256",
                params![run_id, token, now_ms()],
            )?;
            Ok(())
        })
        .await
    }

    /// The run a token hash belongs to.
    pub async fn run_for_token(&self, token_sha256: &str) -> StoreResult<Option<String>> {
        let token = token_sha256.to_owned();
        self.call(move |conn| {
            Ok(conn
                .query_row(
                    "SELECT run_id FROM runs WHERE token_sha256 = ?1",
                    [token],
                    |r| r.get(0),
                )
                .optional()?)
        })
        .await
    }

    pub async fn mark_run_finished(&self, run_id: &str) -> StoreResult<()> {
        let run_id = run_id.to_owned();
        self.call(move |conn| {
            conn.execute(
                "UPDATE runs SET finished_at = COALESCE(finished_at, ?2) WHERE run_id = ?1",
                params![run_id, now_ms()],
            )?;
            Ok(())
        })
        .await
    }

    /// `Some(finished)` for a known run, `None` for an unknown one.
    pub async fn run_finished(&self, run_id: &str) -> StoreResult<Option<bool>> {
        let run_id = run_id.to_owned();
        self.call(move |conn| {
            Ok(conn
                .query_row(
                    "SELECT finished_at IS NOT NULL FROM runs WHERE run_id = ?1",
                    [run_id],
                    |r| r.get(0),
                )
                .optional()?)
        })
        .await
    }

    /// The run's live ops (none once every op is terminal).
    pub async fn run_ops_live(&self, run_id: &str) -> StoreResult<Vec<crate::store::Op>> {
        let run_id = run_id.to_owned();
        self.call(move |conn| {
            let sql = format!(
                "SELECT {} FROM ops WHERE run_id = ?1 AND status IN ({})",
                super::ops::COLUMNS,
                crate::lifecycle::live_sql()
            );
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query_map([run_id], super::ops::op_from_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Whether every op of the run is terminal and every background result
    /// and note went into a report (a foreground result goes to its caller):
    /// the run's files are no longer needed to deliver anything.
    pub async fn run_delivered(&self, run_id: &str) -> StoreResult<bool> {
        let run_id = run_id.to_owned();
        self.call(move |conn| {
            let sql = format!(
                "SELECT NOT EXISTS (SELECT 1 FROM ops WHERE run_id = ?1 AND (status IN ({live}) \
                     OR (background = 1 AND report_id IS NULL AND delivered_inline = 0))) \
                 AND NOT EXISTS (SELECT 1 FROM notes WHERE run_id = ?1 AND report_id IS NULL)",
                live = crate::lifecycle::live_sql()
            );
            Ok(conn.query_row(&sql, [run_id], |r| r.get(0))?)
        })
        .await
    }

    /// Latest activity (op creation or end) of a run, unix ms.
    pub async fn run_last_activity(&self, run_id: &str) -> StoreResult<Option<i64>> {
        let run_id = run_id.to_owned();
        self.call(move |conn| {
            Ok(conn.query_row(
                "SELECT MAX(COALESCE(finished_at, created_at)) FROM ops WHERE run_id = ?1",
                [run_id],
                |r| r.get(0),
            )?)
        })
        .await
    }
}
