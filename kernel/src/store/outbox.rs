//! The webhook outbox (SPEC §23): a notified event's post is written in
//! the event's own transaction; the deliverer takes the due rows (a row is
//! due when every earlier row of its run is), deletes one when the receiver
//! took it, and otherwise pushes it back, with its run's later rows, with
//! the error. A run's rows go out in id order, which is their commit order
//! (a run's appends hold its tree's lock).

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
    // due at once (whatever the wall clock does), unless it waits behind
    // its run's failing post: then as late as that one
    tx.execute(
        "INSERT INTO webhook_outbox (delivery_id, run_id, kind, body, created_at, next_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, \
         COALESCE((SELECT MAX(next_at) FROM webhook_outbox WHERE run_id = ?2), 0))",
        vals![delivery_id, run_id, kind, body.to_string(), at],
    )?;
    Ok(())
}

/// A post leaves the outbox; the rows of its run that waited behind it
/// (never tried) are due at once.
fn leave(tx: &mut dyn Tx, id: i64, run_id: &str) -> StoreResult<()> {
    tx.execute("DELETE FROM webhook_outbox WHERE id = ?1", vals![id])?;
    tx.execute(
        "UPDATE webhook_outbox SET next_at = 0 WHERE run_id = ?1 AND attempts = 0 AND next_at > 0",
        vals![run_id],
    )?;
    Ok(())
}

/// What became of one post, as the deliverer records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostOutcome {
    /// The receiver took it: it leaves the outbox.
    Taken,
    /// The receiver refused this very body: it leaves, recorded in the
    /// kernel's journal (`webhook.dropped`) with the reason.
    Refused(String),
    /// Not taken: tried again at `next_at` (unix ms); its run's later
    /// posts wait as long (they go after it).
    Failed {
        /// Why, for the row's `last_error`.
        why: String,
        /// When to try again.
        next_at: i64,
    },
}

fn record_in(tx: &mut dyn Tx, post: &OutboxPost, outcome: &PostOutcome) -> StoreResult<()> {
    match outcome {
        PostOutcome::Taken => leave(tx, post.id, &post.run_id),
        PostOutcome::Refused(why) => {
            leave(tx, post.id, &post.run_id)?;
            let data = json!({
                "delivery_id": post.delivery_id,
                "run_id": post.run_id,
                "type": post.kind,
                "attempts": post.attempts + 1,
                "reason": why,
            });
            tx.execute(
                "INSERT INTO kernel_journal (at, kind, data) VALUES (?1, 'webhook.dropped', ?2)",
                vals![now_ms(), data.to_string()],
            )?;
            Ok(())
        }
        PostOutcome::Failed { why, next_at } => {
            let why: String = why.chars().take(500).collect();
            tx.execute(
                "UPDATE webhook_outbox SET attempts = attempts + 1, next_at = ?2, last_error = ?3 \
                 WHERE id = ?1",
                vals![post.id, *next_at, why],
            )?;
            tx.execute(
                "UPDATE webhook_outbox SET next_at = ?2 WHERE run_id = ?1 AND next_at < ?2",
                vals![&post.run_id, *next_at],
            )?;
            Ok(())
        }
    }
}

impl Store {
    /// The due posts, oldest first, at most `limit`: a row is due when it
    /// and every earlier row of its run are (a run's rows go in order).
    pub async fn due_posts(&self, limit: u32) -> StoreResult<Vec<OutboxPost>> {
        self.read(move |tx| {
            let rows = tx.query(
                "SELECT id, delivery_id, run_id, kind, body, attempts FROM webhook_outbox o \
                 WHERE next_at <= ?1 AND NOT EXISTS (SELECT 1 FROM webhook_outbox p \
                 WHERE p.run_id = o.run_id AND p.id < o.id AND p.next_at > ?1) \
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

    /// Records what became of posts, all in one transaction.
    pub async fn record_posts(&self, outcomes: Vec<(OutboxPost, PostOutcome)>) -> StoreResult<()> {
        if outcomes.is_empty() {
            return Ok(());
        }
        self.write(move |tx| {
            for (post, outcome) in &outcomes {
                record_in(tx, post, outcome)?;
            }
            Ok(())
        })
        .await
    }

    /// Drops every post older than `cutoff` (unix ms), recorded as one
    /// kernel journal entry: a receiver down that long, or a webhook no
    /// longer set. How many went.
    pub async fn drop_stale_posts(&self, cutoff: i64) -> StoreResult<u64> {
        self.write(move |tx| {
            let n = tx.execute(
                "DELETE FROM webhook_outbox WHERE created_at < ?1",
                vals![cutoff],
            )?;
            if n > 0 {
                let data = json!({"posts": n, "created_before": cutoff, "reason": "too old"});
                tx.execute(
                    "INSERT INTO kernel_journal (at, kind, data) VALUES (?1, 'webhook.dropped', ?2)",
                    vals![now_ms(), data.to_string()],
                )?;
            }
            Ok(n)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::PostOutcome;
    use crate::store::reports::tests::{finished_op, new_op, settle};
    use crate::store::{now_ms, test_store, OutboxPost, Store};

    async fn record(store: &Store, post: &OutboxPost, outcome: PostOutcome) {
        let outcomes = vec![(post.clone(), outcome)];
        store.record_posts(outcomes).await.unwrap();
    }

    fn failed(next_at: i64) -> PostOutcome {
        PostOutcome::Failed {
            why: "503".into(),
            next_at,
        }
    }

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
        let runs: Vec<&str> = due.iter().map(|p| p.run_id.as_str()).collect();
        assert_eq!(runs, ["rb", "rb", "rc"], "oldest first, a run's in order");
        assert!(
            due[0].body.contains(&b2),
            "rb's first post is b2's: {}",
            due[0].body
        );
        assert!(due[1].body.contains(&b1));
        // a failed head holds its run's later posts back (new ones too),
        // not other runs'
        record(&store, &due[0], failed(now_ms() + 60_000)).await;
        finished_op(&store, "rb", 4).await;
        let due2 = store.due_posts(10).await.unwrap();
        assert_eq!(due2.len(), 1);
        assert_eq!(due2[0].run_id, "rc");
        record(&store, &due2[0], PostOutcome::Taken).await;
        record(&store, &due[0], failed(0)).await;
        let again = store.due_posts(10).await.unwrap();
        assert_eq!((again[0].id, again[0].attempts), (due[0].id, 2));
        assert_eq!(again.len(), 1, "the rest waits behind its pushed-back head");
        // taken: the run's next posts are due at once
        record(&store, &again[0], PostOutcome::Taken).await;
        let next = store.due_posts(10).await.unwrap();
        assert!(next.len() == 2 && next[0].body.contains(&b1), "{next:?}");
        let body: serde_json::Value = serde_json::from_str(&next[0].body).unwrap();
        assert_eq!(body["id"], next[0].delivery_id.as_str());
        assert_eq!(body["data"]["exit_code"], 1);
        // a refused body and the too old are dropped, and recorded
        record(&store, &next[0], PostOutcome::Refused("422".into())).await;
        assert_eq!(store.drop_stale_posts(now_ms() + 1).await.unwrap(), 1);
        assert!(store.due_posts(10).await.unwrap().is_empty());
        let journal = store.kernel_journal(0, 10).await.unwrap();
        let kinds: Vec<&str> = journal.iter().map(|e| e.2.as_str()).collect();
        assert_eq!(kinds, ["webhook.dropped", "webhook.dropped"]);
    }
}
