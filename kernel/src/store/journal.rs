//! The two append-only records of a run: the events journal (its trace)
//! and the usage ledger (what budgets are derived from). Both are written
//! only inside the transaction of the change they record, so an event never
//! describes a change that did not commit and no committed change lacks it.

use sha2::{Digest, Sha256};

use super::db::{Row, Tx};
use super::{now_ms, Store, StoreError, StoreResult};
use crate::event_kind::EventKind;
pub use crate::event_kind::{Event, ModelUsage};
use crate::runs::Used;
use crate::vals;

/// One event row (`seq, at, kind, operation_id, data`): its data is
/// checked JSON of the kind's payload.
fn event_from_row(r: &Row) -> StoreResult<Event> {
    let seq: i64 = r.get("seq")?;
    let kind: String = r.get("kind")?;
    let data: String = r.get("data")?;
    let kind = serde_json::from_str(&data)
        .and_then(|data| EventKind::from_parts(&kind, data))
        .map_err(|e| StoreError::Corrupt(format!("event {seq}: {e}")))?;
    Ok(Event {
        seq,
        at: r.get("at")?,
        operation_id: r.get("operation_id")?,
        kind,
    })
}

/// Appends an event to a run's journal (inside the caller's transaction);
/// its sequence number.
pub(super) fn append_event(
    tx: &mut dyn Tx,
    run_id: &str,
    operation_id: Option<&str>,
    event: EventKind,
) -> StoreResult<i64> {
    // a run's events are numbered in commit order: on PostgreSQL a
    // sequence number is taken at insert, so an append holds its tree's
    // lock to its commit (most scripts hold it already: then this is free
    // but for the root's read), and a reader paging by `seq` never passes
    // one that commits later
    if tx.dialect() == super::db::Dialect::Postgres {
        super::tree::lock_tree_of(tx, run_id)?;
    }
    let data = event
        .data()
        .map_err(|e| StoreError::Corrupt(format!("{} event: {e}", event.name())))?;
    let at = now_ms();
    let seq = tx.scalar(
        "INSERT INTO events (run_id, at, kind, operation_id, data) VALUES (?1, ?2, ?3, ?4, ?5) \
         RETURNING seq",
        vals![run_id, at, event.name(), operation_id, data.to_string()],
    )?;
    if tx.outbox() && event.notifies() {
        super::outbox::enqueue(tx, run_id, operation_id, (seq, at), event.name(), data)?;
    }
    Ok(seq)
}

/// The ledger's totals over a run and all its descendants.
pub(super) fn usage_over_subtree(tx: &mut dyn Tx, run_id: &str) -> StoreResult<Used> {
    // summed as floats: no input can make it fail with an integer overflow
    // (an integer SUM would, and then every admission under the run too)
    let row = tx.query_one(
        "SELECT COALESCE(SUM(CAST(op_ms AS DOUBLE PRECISION)), 0) AS op, \
         COALESCE(SUM(CAST(cpu_ms AS DOUBLE PRECISION)), 0) AS cpu, \
         COALESCE(SUM(CAST(input_tokens AS DOUBLE PRECISION)), 0) \
         + COALESCE(SUM(CAST(output_tokens AS DOUBLE PRECISION)), 0) AS tokens, \
         COALESCE(SUM(CAST(cost_micros AS DOUBLE PRECISION)), 0) AS cost \
         FROM usage WHERE run_id IN (SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1)",
        vals![run_id],
    )?;
    let (op, cpu, tokens, cost): (f64, f64, f64, f64) = (
        row.get("op")?,
        row.get("cpu")?,
        row.get("tokens")?,
        row.get("cost")?,
    );
    let net = tx.query_one(
        "SELECT COALESCE(SUM(CAST(connections AS DOUBLE PRECISION)), 0) AS c, \
         COALESCE(SUM(CAST(bytes_in AS DOUBLE PRECISION)), 0) AS i, \
         COALESCE(SUM(CAST(bytes_out AS DOUBLE PRECISION)), 0) AS o \
         FROM net_usage WHERE run_id IN (SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1)",
        vals![run_id],
    )?;
    let (c, i, o): (f64, f64, f64) = (net.get("c")?, net.get("i")?, net.get("o")?);
    // `as` saturates: a total past u64 reads as u64::MAX, past any limit
    Ok(Used {
        op_ms: op.max(0.0) as u64,
        cpu_ms: cpu.max(0.0) as u64,
        tokens: tokens.max(0.0) as u64,
        cost_micros: cost.max(0.0) as u64,
        net_connections: c.max(0.0) as u64,
        net_bytes_in: i.max(0.0) as u64,
        net_bytes_out: o.max(0.0) as u64,
    })
}

/// One fact of the egress proxy's counts for `run_id` (nothing for a run
/// the control plane no longer has).
pub(super) fn record_net_usage(
    tx: &mut dyn Tx,
    run_id: &str,
    (connections, bytes_in, bytes_out): (u64, u64, u64),
) -> StoreResult<()> {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    tx.execute(
        "INSERT INTO net_usage (run_id, at, connections, bytes_in, bytes_out) \
         SELECT ?1, ?2, ?3, ?4, ?5 WHERE EXISTS (SELECT 1 FROM runs WHERE run_id = ?1)",
        vals![run_id, now_ms(), n(connections), n(bytes_in), n(bytes_out)],
    )?;
    Ok(())
}

/// The ledger fact of a settled op: its wall time from its recorded start
/// to its end, and its CPU time when the shim measured it (never made up).
/// Nothing for an op that never started. At most one per op.
pub(super) fn record_op_usage(
    tx: &mut dyn Tx,
    run_id: &str,
    op_id: &str,
    wall_ms: Option<i64>,
    cpu_ms: Option<i64>,
) -> StoreResult<()> {
    let Some(wall) = wall_ms else {
        return Ok(());
    };
    tx.execute(
        "INSERT INTO usage (run_id, at, source, operation_id, op_ms, cpu_ms) \
         VALUES (?1, ?2, 'op', ?3, ?4, ?5)",
        vals![run_id, now_ms(), op_id, wall.max(0), cpu_ms],
    )?;
    Ok(())
}

/// The result of recording model usage.
#[derive(Debug, PartialEq, Eq)]
pub enum UsageRecorded {
    /// A new fact, with its ledger sequence number.
    Recorded(i64),
    /// A retry under the same idempotency key: the fact it recorded.
    Existing(i64),
    /// The idempotency key was used for a different fact.
    KeyConflict,
}

/// The usage transaction script: a retry under the same idempotency key
/// finds its fact; else the fact and its `usage.recorded` event.
fn record_model_usage_in(
    tx: &mut dyn Tx,
    run_id: &str,
    usage: ModelUsage,
    idempotency_key: Option<String>,
) -> StoreResult<UsageRecorded> {
    // locks the run's tree: a usage fact and the admissions its budgets
    // refuse are serialized, and a key's retries with them
    super::tree::lock_tree_of(tx, run_id)?;
    let sha = hex::encode(Sha256::digest(
        serde_json::to_vec(&usage).map_err(|e| StoreError::Corrupt(e.to_string()))?,
    ));
    if let Some(key) = &idempotency_key {
        let seen = tx.query_opt(
            "SELECT seq, request_sha256 FROM usage WHERE run_id = ?1 AND idempotency_key = ?2",
            vals![run_id, key],
        )?;
        if let Some(row) = seen {
            let seen_sha: Option<String> = row.get("request_sha256")?;
            return Ok(if seen_sha.as_deref() == Some(sha.as_str()) {
                UsageRecorded::Existing(row.get("seq")?)
            } else {
                UsageRecorded::KeyConflict
            });
        }
    }
    let seq: i64 = tx.scalar(
        "INSERT INTO usage (run_id, at, source, model, input_tokens, output_tokens, cost_micros, \
         idempotency_key, request_sha256) VALUES (?1, ?2, 'model', ?3, ?4, ?5, ?6, ?7, ?8) \
         RETURNING seq",
        vals![
            run_id,
            now_ms(),
            &usage.model,
            usage.input_tokens as i64,
            usage.output_tokens as i64,
            usage.cost_micros as i64,
            idempotency_key,
            sha
        ],
    )?;
    append_event(tx, run_id, None, EventKind::UsageRecorded(usage))?;
    Ok(UsageRecorded::Recorded(seq))
}

impl Store {
    /// Appends a model-usage fact and its `usage.recorded` event.
    pub async fn record_model_usage(
        &self,
        run_id: &str,
        usage: ModelUsage,
        idempotency_key: Option<String>,
    ) -> StoreResult<UsageRecorded> {
        let run_id = run_id.to_owned();
        self.write(move |tx| {
            record_model_usage_in(tx, &run_id, usage.clone(), idempotency_key.clone())
        })
        .await
    }

    /// Records what the egress proxy counted for a run (SPEC §27):
    /// connections, bytes in, bytes out.
    pub async fn record_net_usage(
        &self,
        run_id: &str,
        connections: u64,
        bytes_in: u64,
        bytes_out: u64,
    ) -> StoreResult<()> {
        let run_id = run_id.to_owned();
        let counts = (connections, bytes_in, bytes_out);
        self.write(move |tx| record_net_usage(tx, &run_id, counts))
            .await
    }

    /// Appends a run's own event (no op: a fork, a file written).
    pub async fn record_run_event(&self, run_id: &str, kind: EventKind) -> StoreResult<()> {
        let run_id = run_id.to_owned();
        self.write(move |tx| append_event(tx, &run_id, None, kind.clone()).map(drop))
            .await
    }

    /// Appends one event about an op of the run: what the kernel records
    /// outside another transaction (its stdin written, a nudge, a signal).
    pub async fn record_event(
        &self,
        run_id: &str,
        op_id: &str,
        kind: EventKind,
    ) -> StoreResult<()> {
        let (run_id, op_id) = (run_id.to_owned(), op_id.to_owned());
        self.write(move |tx| append_event(tx, &run_id, Some(&op_id), kind.clone()).map(drop))
            .await
    }

    /// The ledger's totals over a run and its descendants, derived now.
    pub async fn usage_over_subtree(&self, run_id: &str) -> StoreResult<Used> {
        let run_id = run_id.to_owned();
        self.read(move |tx| usage_over_subtree(tx, &run_id)).await
    }

    /// The run's latest event sequence number (0 without events).
    pub async fn last_event_seq(&self, run_id: &str) -> StoreResult<i64> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            tx.scalar(
                "SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?1",
                vals![run_id],
            )
        })
        .await
    }

    /// The run's last `n` events up to `upto`, oldest first.
    pub async fn events_tail(&self, run_id: &str, n: u32, upto: i64) -> StoreResult<Vec<Event>> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            tx.query(
                "SELECT seq, at, kind, operation_id, data FROM (SELECT seq, at, kind, operation_id, data \
                 FROM events WHERE run_id = ?1 AND seq <= ?3 ORDER BY seq DESC LIMIT ?2) AS tail \
                 ORDER BY seq",
                vals![run_id, n, upto],
            )?
            .iter()
            .map(event_from_row)
            .collect()
        })
        .await
    }

    /// Events of a run after `after`, oldest first, at most `limit`.
    pub async fn events_after(
        &self,
        run_id: &str,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<Event>> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            tx.query(
                "SELECT seq, at, kind, operation_id, data FROM events \
                 WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
                vals![run_id, after, limit],
            )?
            .iter()
            .map(event_from_row)
            .collect()
        })
        .await
    }
}
