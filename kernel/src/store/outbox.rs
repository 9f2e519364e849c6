//! The webhook outbox (SPEC §23): a notified event's post is written in
//! the event's own transaction; the deliverer takes each run's oldest row
//! once it is due, deletes it when the receiver took it, and otherwise
//! pushes it back with the error. A run's rows go out in id order, which
//! is their commit order (a run's appends hold its tree's lock).

use serde_json::{json, Value};

use super::db::Tx;
use super::{now_ms, Store, StoreResult};
use crate::vals;

/// One post waiting in the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxPost {
    /// Its row (the order within its run).
    pub id: i64,
    /// The id the receiver de-duplicates by (also in the body).
    pub delivery_id: String,
    /// The run whose event it carries.
    pub run_id: String,
    /// The event's kind (`approval.requested`, ...).
    pub kind: String,
    /// The JSON body, exactly as signed and posted.
    pub body: String,
    /// Posts tried so far.
    pub attempts: i64,
}

/// Puts the post of an event just appended (`seq` at `at`) in the outbox.
pub(super) fn enqueue(
    tx: &mut dyn Tx,
    run_id: &str,
    operation_id: Option<&str>,
    (seq, at): (i64, i64),
    kind: &str,
    data: Value,
) -> StoreResult<()> {
    let delivery_id = uuid::Uuid::new_v4().to_string();
    let body = json!({
        "id": delivery_id,
        "type": kind,
        "run_id": run_id,
        "operation_id": operation_id,
        "seq": seq,
        "at": crate::report_text::rfc3339(at),
        "data": data,
    });
    tx.execute(
        "INSERT INTO webhook_outbox (delivery_id, run_id, kind, body, created_at, next_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
        vals![delivery_id, run_id, kind, body.to_string(), at],
    )?;
    Ok(())
}

impl Store {
    /// Each run's oldest post, when it is due; oldest first, at most `limit`.
    pub async fn due_posts(&self, limit: u32) -> StoreResult<Vec<OutboxPost>> {
        self.read(move |tx| {
            let rows = tx.query(
                "SELECT id, delivery_id, run_id, kind, body, attempts FROM webhook_outbox o \
                 WHERE next_at <= ?1 AND NOT EXISTS \
                 (SELECT 1 FROM webhook_outbox p WHERE p.run_id = o.run_id AND p.id < o.id) \
                 ORDER BY id LIMIT ?2",
                vals![now_ms(), limit],
            )?;
            rows.iter()
                .map(|r| {
                    Ok(OutboxPost {
                        id: r.get("id")?,
                        delivery_id: r.get("delivery_id")?,
                        run_id: r.get("run_id")?,
                        kind: r.get("kind")?,
                        body: r.get("body")?,
                        attempts: r.get("attempts")?,
                    })
                })
                .collect()
        })
        .await
    }

    /// The receiver took the post: it leaves the outbox.
    pub async fn post_delivered(&self, id: i64) -> StoreResult<()> {
        self.write(move |tx| {
            tx.execute("DELETE FROM webhook_outbox WHERE id = ?1", vals![id])?;
            Ok(())
        })
        .await
    }

    /// The post failed with `error`: tried again at `next_at` (unix ms).
    pub async fn post_failed(&self, id: i64, error: &str, next_at: i64) -> StoreResult<()> {
        let error: String = error.chars().take(500).collect();
        self.write(move |tx| {
            tx.execute(
                "UPDATE webhook_outbox SET attempts = attempts + 1, next_at = ?2, last_error = ?3 \
                 WHERE id = ?1",
                vals![id, next_at, error],
            )?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use crate::store::reports::tests::{finished_op, new_op, settle};
    use crate::store::{now_ms, test_store};

    #[tokio::test]
    async fn posts_go_out_per_run_in_order_and_only_once_enabled() {
        let store = test_store().await;
        finished_op(&store, "quiet", 0).await;
        assert!(store.due_posts(10).await.unwrap().is_empty(), "off: none");
        store.enable_outbox();
        let (b1, b2) = (
            new_op(&store, "rb", true).await,
            new_op(&store, "rb", true).await,
        );
        settle(&store, &b2, 2).await;
        settle(&store, &b1, 1).await;
        finished_op(&store, "rc", 3).await;
        let due = store.due_posts(10).await.unwrap();
        let heads: Vec<(&str, &str)> = due
            .iter()
            .map(|p| (p.run_id.as_str(), p.kind.as_str()))
            .collect();
        assert_eq!(heads, [("rb", "tool.completed"), ("rc", "tool.completed")]);
        assert!(
            due[0].body.contains(&b2),
            "rb's first post is b2's: {}",
            due[0].body
        );
        // a failed head holds its run's later posts back, not other runs'
        store
            .post_failed(due[0].id, "503", now_ms() + 60_000)
            .await
            .unwrap();
        let due2 = store.due_posts(10).await.unwrap();
        assert_eq!(due2.len(), 1);
        assert_eq!(due2[0].run_id, "rc");
        store.post_delivered(due2[0].id).await.unwrap();
        store.post_failed(due[0].id, "503", 0).await.unwrap();
        let again = store.due_posts(10).await.unwrap();
        assert_eq!((again[0].id, again[0].attempts), (due[0].id, 2));
        store.post_delivered(again[0].id).await.unwrap();
        let last = store.due_posts(10).await.unwrap();
        assert!(last.len() == 1 && last[0].body.contains(&b1));
        let body: serde_json::Value = serde_json::from_str(&last[0].body).unwrap();
        assert_eq!(body["id"], last[0].delivery_id.as_str());
        assert_eq!(body["data"]["exit_code"], 1);
    }
}
