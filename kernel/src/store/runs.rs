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
