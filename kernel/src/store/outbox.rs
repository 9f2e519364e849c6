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

/// How long a node's claim on a due post lasts (database clock, ms):
/// longer than a whole round of the deliverer (256 posts of at most 10 s,
/// 16 runs at a time: 160 s, plus a run's turn of 16 posts: 160 s), so a
/// slow receiver alone never lets another node take a post meanwhile. A
/// node declared dead loses its claims at once (its sweep frees them), a
/// node restarted takes its own again.
pub const CLAIM_MS: i64 = 600_000;

/// The advisory lock key that serializes the takers of due posts (no run
/// id can be it: run ids have no `#`).
const OUTBOX_LOCK: &str = "#webhook-outbox";

/// The longest pause between two tries of one post.
const MAX_BACKOFF_MS: i64 = 60_000;

/// The pause before the next try of a post tried `attempts` times: 1 s,
/// doubling, at most a minute.
pub fn backoff_ms(attempts: i64) -> i64 {
    1000_i64
        .saturating_mul(1 << attempts.clamp(0, 16))
        .min(MAX_BACKOFF_MS)
}

/// What became of one post, as the deliverer records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostOutcome {
    /// The receiver took it: it leaves the outbox.
    Taken,
    /// The receiver refused this very body: it leaves, recorded in the
    /// kernel's journal (`webhook.dropped`) with the reason.
    Refused(String),
    /// Not taken (why): tried again after `backoff_ms` from when this is
    /// recorded; its run's later posts wait as long (they go after it).
    Failed(String),
}

/// Removes a post the receiver took or refused (a refusal recorded).
fn leave(tx: &mut dyn Tx, post: &OutboxPost, refused: Option<&str>) -> StoreResult<()> {
    tx.execute("DELETE FROM webhook_outbox WHERE id = ?1", vals![post.id])?;
    let Some(why) = refused else {
        return Ok(());
    };
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

/// Records one run's turn: its posts in order, each taken or refused but
/// perhaps the last, which may have failed. A failure pushes the post and
/// every later row of its run back; otherwise the run's rows that waited
/// behind an earlier failure (never tried) are due at once.
fn record_turn(tx: &mut dyn Tx, turn: &[(OutboxPost, PostOutcome)]) -> StoreResult<()> {
    let Some(run_id) = turn.first().map(|(p, _)| p.run_id.clone()) else {
        return Ok(());
    };
    for (post, outcome) in turn {
        match outcome {
            PostOutcome::Taken => leave(tx, post, None)?,
            PostOutcome::Refused(why) => leave(tx, post, Some(why))?,
            PostOutcome::Failed(why) => {
                let why: String = why.chars().take(500).collect();
                let next_at = now_ms() + backoff_ms(post.attempts);
                tx.execute(
                    "UPDATE webhook_outbox SET attempts = attempts + 1, next_at = ?2, \
                     last_error = ?3 WHERE id = ?1",
                    vals![post.id, next_at, why],
                )?;
                tx.execute(
                    "UPDATE webhook_outbox SET next_at = ?2 WHERE run_id = ?1 AND next_at < ?2",
                    vals![&run_id, next_at],
                )?;
                return Ok(());
            }
        }
    }
    tx.execute(
        "UPDATE webhook_outbox SET next_at = 0 WHERE run_id = ?1 AND next_at > 0 AND attempts = 0",
        vals![run_id],
    )?;
    Ok(())
}

impl Store {
    /// Takes the due posts for this node (SPEC §24: the outbox is the
    /// cluster's, and a post is taken by one node at a time), oldest
    /// first, at most `per_run` of one run and `limit` in all: a row is
    /// due when it and every earlier row of its run are, and no other node
    /// holds a live claim on a row of its run. The takers are serialized
    /// (an advisory lock on PostgreSQL, the one writer on SQLite); each
    /// claim lasts `CLAIM_MS` on the database's clock, and a node's own
    /// claims are its to take again (after a restart too).
    pub async fn due_posts(&self, per_run: u32, limit: u32) -> StoreResult<Vec<OutboxPost>> {
        let taker = self.outbox_taker();
        self.write(move |tx| {
            tx.lock_tree(OUTBOX_LOCK)?;
            let now = super::lease::db_now(tx);
            let sql = format!(
                "SELECT id, delivery_id, run_id, kind, body, attempts FROM \
                 (SELECT o.*, ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY id) AS turn \
                  FROM webhook_outbox o WHERE next_at <= ?1 AND NOT EXISTS \
                  (SELECT 1 FROM webhook_outbox p \
                   WHERE p.run_id = o.run_id AND p.next_at > ?1 AND p.id < o.id) \
                  AND NOT EXISTS (SELECT 1 FROM webhook_outbox q WHERE q.run_id = o.run_id \
                   AND q.taken_by <> ?4 AND q.taken_until > {now})) due \
                 WHERE turn <= ?2 ORDER BY id LIMIT ?3"
            );
            let rows = tx.query(&sql, vals![now_ms(), per_run, limit, &taker])?;
            let posts = rows
                .iter()
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
                .collect::<StoreResult<Vec<_>>>()?;
            let claim = format!(
                "UPDATE webhook_outbox SET taken_by = ?2, taken_until = {now} + ?3 WHERE id = ?1"
            );
            for p in &posts {
                tx.execute(&claim, vals![p.id, &taker, CLAIM_MS])?;
            }
            Ok(posts)
        })
        .await
    }

    /// Who takes outbox posts here: the cluster node, or the single kernel
    /// (whose restarts take their own claims again at once).
    fn outbox_taker(&self) -> String {
        self.node().unwrap_or("single-kernel").to_owned()
    }

    /// Records a round's turns, each run's as `record_turn` says, all in
    /// one transaction (one commit for the round).
    pub async fn record_turns(
        &self,
        turns: Vec<Vec<(OutboxPost, PostOutcome)>>,
    ) -> StoreResult<()> {
        if turns.iter().all(Vec::is_empty) {
            return Ok(());
        }
        let taker = self.outbox_taker();
        self.write(move |tx| {
            for turn in &turns {
                record_turn(tx, turn)?;
                // what this turn did not post (behind a failure) is free
                // again for any node once due
                if let Some((p, _)) = turn.first() {
                    tx.execute(
                        "UPDATE webhook_outbox SET taken_by = NULL, taken_until = NULL \
                         WHERE run_id = ?1 AND taken_by = ?2",
                        vals![&p.run_id, &taker],
                    )?;
                }
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
        let turn = vec![(post.clone(), outcome)];
        store.record_turns(vec![turn]).await.unwrap();
    }

    fn failed() -> PostOutcome {
        PostOutcome::Failed("503".into())
    }

    #[tokio::test]
    async fn posts_go_out_per_run_in_order_and_only_once_enabled() {
        let store = test_store().await;
        finished_op(&store, "quiet", 0).await;
        assert!(
            store.due_posts(16, 10).await.unwrap().is_empty(),
            "off: none"
        );
        let store = store
            .with_options(crate::store::StoreOptions {
                outbox: true,
                ..Default::default()
            })
            .await;
        let (b1, b2) = (
            new_op(&store, "rb", true).await,
            new_op(&store, "rb", true).await,
        );
        settle(&store, &b2, 2).await;
        settle(&store, &b1, 1).await;
        finished_op(&store, "rc", 3).await;
        let due = store.due_posts(16, 10).await.unwrap();
        let runs: Vec<&str> = due.iter().map(|p| p.run_id.as_str()).collect();
        assert_eq!(runs, ["rb", "rb", "rc"], "oldest first, a run's in order");
        assert!(
            due[0].body.contains(&b2),
            "rb's first post is b2's: {}",
            due[0].body
        );
        assert!(due[1].body.contains(&b1));
        // a mixed turn: b2 taken, b1 failed; the later rows wait behind b1
        // (a new one too), other runs' do not
        let turn = vec![
            (due[0].clone(), PostOutcome::Taken),
            (due[1].clone(), failed()),
        ];
        store.record_turns(vec![turn]).await.unwrap();
        finished_op(&store, "rb", 4).await;
        let due2 = store.due_posts(16, 10).await.unwrap();
        assert_eq!(due2.len(), 1);
        assert_eq!(due2[0].run_id, "rc");
        record(&store, &due2[0], PostOutcome::Taken).await;
        // once b1 is due again (its backoff, 1 s), it goes first, alone
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        let again = store.due_posts(16, 10).await.unwrap();
        assert_eq!((again[0].id, again[0].attempts), (due[1].id, 1));
        assert_eq!(again.len(), 2, "b1, then the post that waited behind it");
        record(&store, &again[0], PostOutcome::Taken).await;
        let next = store.due_posts(16, 10).await.unwrap();
        assert_eq!(next.len(), 1, "{next:?}");
        assert_eq!(next[0].id, again[1].id);
        let body: serde_json::Value = serde_json::from_str(&next[0].body).unwrap();
        assert_eq!(body["id"], next[0].delivery_id.as_str());
        assert_eq!(body["data"]["exit_code"], 4);
        // at most `per_run` of a run in one round
        for code in 5..8 {
            finished_op(&store, "rb", code).await;
        }
        assert_eq!(store.due_posts(2, 10).await.unwrap().len(), 2);
        // a refused body and the too old are dropped, and recorded
        record(&store, &next[0], PostOutcome::Refused("422".into())).await;
        assert_eq!(store.drop_stale_posts(now_ms() + 1).await.unwrap(), 3);
        assert!(store.due_posts(16, 10).await.unwrap().is_empty());
        let journal = store.kernel_journal(0, 10).await.unwrap();
        let kinds: Vec<&str> = journal.iter().map(|e| e.2.as_str()).collect();
        assert_eq!(kinds, ["webhook.dropped", "webhook.dropped"]);
    }
}

#[cfg(test)]
mod cluster_tests {
    use crate::store::reports::tests::finished_op;
    use crate::store::{test_store_pair, PostOutcome};

    /// SPEC §24: the outbox is the cluster's; each due post is taken by
    /// one node at a time (before, every node with the setting posted every
    /// row: one post per node), and what a node did not post is free again.
    #[tokio::test]
    async fn a_due_post_is_taken_by_one_node_at_a_time() {
        let (n1, n2) = test_store_pair().await;
        let options = |name: &str| crate::store::StoreOptions {
            outbox: true,
            node: Some(name.to_owned()),
        };
        let n1 = n1.with_options(options("n1")).await;
        let n2 = n2.with_options(options("n2")).await;
        for (store, name) in [(&n1, "n1"), (&n2, "n2")] {
            store
                .join_node(name, &format!("http://{name}:1"), 60_000)
                .await
                .unwrap();
        }
        finished_op(&n1, "ra", 1).await;
        finished_op(&n1, "ra", 2).await;
        let taken = n1.due_posts(16, 10).await.unwrap();
        assert_eq!(taken.len(), 2);
        assert!(
            n2.due_posts(16, 10).await.unwrap().is_empty(),
            "n1 holds the run's posts"
        );
        // a later row of the same run waits for n1's claim too (order)
        finished_op(&n2, "ra", 3).await;
        assert!(n2.due_posts(16, 10).await.unwrap().is_empty());
        // n1 takes its own claims again (after a restart, say)
        assert_eq!(n1.due_posts(16, 10).await.unwrap().len(), 3);
        // n1 posts the first, fails the second: the rest is free for any node
        let turn = vec![
            (taken[0].clone(), PostOutcome::Taken),
            (taken[1].clone(), PostOutcome::Failed("503".into())),
        ];
        n1.record_turns(vec![turn]).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        let retaken = n2.due_posts(16, 10).await.unwrap();
        assert_eq!(retaken.len(), 2, "{retaken:?}");
        assert_eq!(retaken[0].id, taken[1].id);
        assert!(n1.due_posts(16, 10).await.unwrap().is_empty());
    }
}

#[cfg(test)]
mod backoff_tests {
    #[test]
    fn backoff_doubles_to_a_minute() {
        use super::backoff_ms;
        assert_eq!(backoff_ms(0), 1000);
        assert_eq!(backoff_ms(1), 2000);
        assert_eq!(backoff_ms(5), 32_000);
        assert_eq!(backoff_ms(6), 60_000);
        assert_eq!(backoff_ms(1000), 60_000);
    }
}
