//! Bounded growth of the control plane (SPEC §21): which ops' files may
//! go (delivered, older than the files' retention), and the purge of
//! finished top-level run trees older than the control plane's retention,
//! whole and in one transaction, recorded in the kernel's own journal.

use serde_json::json;

use super::db::Tx;
use super::{now_ms, Store, StoreError, StoreResult};
use crate::lifecycle::{live_sql, terminal_sql};
use crate::vals;

/// An op whose files may be removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrunableOp {
    /// The op's id, naming its `.log`, `.pid` and `.code`.
    pub id: String,
    /// Its run's scratch key: whose `.ops` dir holds the files.
    pub scratch_key: String,
    /// Whether its files are on this node's disk (false: it ran on a node
    /// that is dead, or on none, and its files are that disk's business:
    /// only the record says they are out of reach, SPEC §24).
    pub local: bool,
}

/// One purged run tree, as the kernel journal records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgedTree {
    /// The top-level run the tree hangs from.
    pub root: String,
    /// Every run of the tree, the root included.
    pub runs: Vec<String>,
    /// Ops deleted with the tree.
    pub ops: usize,
    /// Events deleted with the tree.
    pub events: usize,
}

/// The tables a purge empties for a tree's runs, in order (rows of runs
/// and their ancestry last).
const PURGED_TABLES: [&str; 9] = [
    "events",
    "snapshots",
    "usage",
    "net_usage",
    "ops",
    "reports",
    "notes",
    "schedules",
    "webhook_outbox",
];

/// Top-level runs (all, or just `only`) whose whole tree is finished and
/// has been quiet since before `cutoff`: none of its runs has a live op,
/// an undelivered result, op files not yet pruned, a pending note, an
/// unacked report or a schedule that may still fire.
fn purgeable_roots(
    tx: &mut dyn Tx,
    cutoff: i64,
    limit: u32,
    only: Option<&str>,
) -> StoreResult<Vec<String>> {
    let sql = format!(
        "SELECT r.run_id AS run_id FROM runs r WHERE r.parent_run_id IS NULL AND r.created_at < ?1 \
         AND (CAST(?3 AS TEXT) IS NULL OR r.run_id = ?3) \
         AND NOT EXISTS (SELECT 1 FROM run_ancestry a JOIN runs d ON d.run_id = a.run_id \
             WHERE a.ancestor_id = r.run_id AND (d.created_at >= ?1 \
             OR COALESCE(d.state_changed_at, 0) >= ?1)) \
         AND NOT EXISTS (SELECT 1 FROM run_ancestry a JOIN ops o ON o.run_id = a.run_id \
             WHERE a.ancestor_id = r.run_id AND (o.status NOT IN ({terminal}) \
             OR o.finished_at >= ?1 OR o.files_pruned_at IS NULL \
             OR (o.background = 1 AND o.report_id IS NULL AND o.delivered_inline = 0))) \
         AND NOT EXISTS (SELECT 1 FROM run_ancestry a JOIN notes n ON n.run_id = a.run_id \
             WHERE a.ancestor_id = r.run_id AND (n.report_id IS NULL OR n.created_at >= ?1)) \
         AND NOT EXISTS (SELECT 1 FROM run_ancestry a JOIN reports p ON p.run_id = a.run_id \
             WHERE a.ancestor_id = r.run_id AND (p.acked_at IS NULL OR p.created_at >= ?1)) \
         AND NOT EXISTS (SELECT 1 FROM run_ancestry a JOIN schedules s ON s.run_id = a.run_id \
             JOIN runs sr ON sr.run_id = s.run_id WHERE a.ancestor_id = r.run_id \
             AND s.enabled = 1 AND s.next_due_at IS NOT NULL \
             AND sr.state IN ('active', 'paused')) \
         AND NOT EXISTS (SELECT 1 FROM run_ancestry a JOIN events e ON e.run_id = a.run_id \
             WHERE a.ancestor_id = r.run_id AND e.at >= ?1) \
         ORDER BY r.created_at LIMIT ?2",
        terminal = terminal_sql()
    );
    tx.query(&sql, vals![cutoff, limit, only])?
        .iter()
        .map(|r| r.get("run_id"))
        .collect()
}

/// The runs of a tree, the root included.
fn tree_runs(tx: &mut dyn Tx, root: &str) -> StoreResult<Vec<String>> {
    tx.query(
        "SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1 ORDER BY distance",
        vals![root],
    )?
    .iter()
    .map(|r| r.get("run_id"))
    .collect()
}

/// Purges one tree in the caller's transaction: marks its runs as being
/// purged (the append-only triggers let exactly those rows go), deletes
/// every row of theirs, unmarks them, and records the purge.
fn purge_tree(tx: &mut dyn Tx, root: &str, cutoff: i64) -> StoreResult<Option<PurgedTree>> {
    // locks the tree being purged (`root` is its top-level run): nothing of
    // it is admitted, settled or drained while it goes
    tx.lock_tree(root)?;
    // re-checked inside the purge's own transaction: nothing may have
    // arrived since the candidates were listed
    if purgeable_roots(tx, cutoff, 1, Some(root))?.is_empty() {
        return Ok(None);
    }
    let runs = tree_runs(tx, root)?;
    for run in &runs {
        tx.execute("INSERT INTO purging (run_id) VALUES (?1)", vals![run])?;
    }
    let mut counts = std::collections::BTreeMap::new();
    for table in PURGED_TABLES {
        let n = tx.execute(
            &format!("DELETE FROM {table} WHERE run_id IN (SELECT run_id FROM purging)"),
            &[],
        )?;
        counts.insert(table, n as usize);
    }
    tx.execute(
        "DELETE FROM run_ancestry WHERE run_id IN (SELECT run_id FROM purging)",
        &[],
    )?;
    let n_runs = tx.execute(
        "DELETE FROM runs WHERE run_id IN (SELECT run_id FROM purging)",
        &[],
    )? as usize;
    tx.execute("DELETE FROM purging", &[])?;
    if n_runs != runs.len() {
        return Err(StoreError::Corrupt(format!(
            "purge of run tree {root} removed {n_runs} of its {} runs",
            runs.len()
        )));
    }
    let data = json!({"root": root, "runs": runs, "rows": counts, "quiet_before": cutoff});
    tx.execute(
        "INSERT INTO kernel_journal (at, kind, data) VALUES (?1, ?2, ?3)",
        vals![now_ms(), "run_tree.purged", data.to_string()],
    )?;
    Ok(Some(PurgedTree {
        root: root.to_owned(),
        ops: counts["ops"],
        events: counts["events"],
        runs,
    }))
}

impl Store {
    /// Ops whose files may go: terminal, delivered (in a report, inline, or
    /// a foreground op's), ended before `cutoff`, files still there.
    /// On a cluster node, its own ops' (their files are on its disk), and
    /// those of ops that ran on a dead node or on none (not `local`: the
    /// files are out of reach, so a finished tree can still be purged).
    pub async fn prunable_ops(&self, cutoff: i64, limit: u32) -> StoreResult<Vec<PrunableOp>> {
        let node = self.node().map(str::to_owned);
        self.read(move |tx| {
            let sql = format!(
                "SELECT id, scratch_key, CAST(CASE WHEN CAST(?3 AS TEXT) IS NULL OR node = ?3 \
                 THEN 1 ELSE 0 END AS BIGINT) AS local FROM ops WHERE files_pruned_at IS NULL \
                 AND finished_at IS NOT NULL AND finished_at < ?1 AND status IN ({}) \
                 AND (background = 0 OR report_id IS NOT NULL OR delivered_inline = 1) \
                 AND (CAST(?3 AS TEXT) IS NULL OR node = ?3 OR node IS NULL \
                      OR node IN (SELECT name FROM nodes WHERE state = 'dead')) \
                 ORDER BY finished_at LIMIT ?2",
                terminal_sql()
            );
            tx.query(&sql, vals![cutoff, limit, node])?
                .iter()
                .map(|r| {
                    Ok(PrunableOp {
                        id: r.get("id")?,
                        scratch_key: r.get("scratch_key")?,
                        local: r.get::<i64>("local")? == 1,
                    })
                })
                .collect()
        })
        .await
    }

    /// Records that an op's files are gone (its log endpoint answers 410).
    pub async fn mark_files_pruned(&self, id: &str) -> StoreResult<()> {
        let id = id.to_owned();
        self.write(move |tx| {
            tx.execute(
                "UPDATE ops SET files_pruned_at = ?2 WHERE id = ?1 AND files_pruned_at IS NULL",
                vals![&id, now_ms()],
            )?;
            Ok(())
        })
        .await
    }

    /// When an op's files were pruned; `None` while they are kept (or for
    /// an unknown op).
    pub async fn files_pruned_at(&self, id: &str) -> StoreResult<Option<i64>> {
        let id = id.to_owned();
        self.read(move |tx| {
            let row = tx.query_opt("SELECT files_pruned_at FROM ops WHERE id = ?1", vals![id])?;
            Ok(row
                .map(|r| r.get::<Option<i64>>("files_pruned_at"))
                .transpose()?
                .flatten())
        })
        .await
    }

    /// Purges finished top-level run trees quiet since before `cutoff`, at
    /// most `limit` of them, each whole in its own transaction; forgets
    /// kernels as old that observe nothing (never `own_kernel`).
    pub async fn purge_finished_trees(
        &self,
        cutoff: i64,
        limit: u32,
        own_kernel: &str,
    ) -> StoreResult<Vec<PurgedTree>> {
        let own_kernel = own_kernel.to_owned();
        let roots = self
            .read(move |tx| purgeable_roots(tx, cutoff, limit, None))
            .await?;
        let mut purged = Vec::new();
        for root in roots {
            if let Some(tree) = self.write(move |tx| purge_tree(tx, &root, cutoff)).await? {
                purged.push(tree);
            }
        }
        // kernels that started long ago and observe nothing any more
        self.write(move |tx| {
            let sql = format!(
                "DELETE FROM kernels WHERE started_at < ?1 AND id != ?2 AND id NOT IN \
                 (SELECT kernel_id FROM ops WHERE kernel_id IS NOT NULL AND status IN ({}))",
                live_sql()
            );
            tx.execute(&sql, vals![cutoff, &own_kernel])?;
            Ok(())
        })
        .await?;
        Ok(purged)
    }

    /// Where live work is: the run and (once known) the container of every
    /// live op, without their commands (the retention pass's look).
    pub async fn live_work(&self) -> StoreResult<Vec<(String, Option<String>)>> {
        self.read(|tx| {
            let sql = format!(
                "SELECT run_id, container_id FROM ops WHERE status IN ({})",
                live_sql()
            );
            tx.query(&sql, &[])?
                .iter()
                .map(|r| Ok((r.get("run_id")?, r.get("container_id")?)))
                .collect()
        })
        .await
    }

    /// The kernel journal, oldest first: `(seq, at, kind, data)`.
    pub async fn kernel_journal(
        &self,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<(i64, i64, String, String)>> {
        self.read(move |tx| {
            tx.query(
                "SELECT seq, at, kind, data FROM kernel_journal WHERE seq > ?1 ORDER BY seq LIMIT ?2",
                vals![after, limit],
            )?
            .iter()
            .map(|r| Ok((r.get("seq")?, r.get("at")?, r.get("kind")?, r.get("data")?)))
            .collect()
        })
        .await
    }
}

#[cfg(test)]
#[path = "retention_tests.rs"]
mod tests;
