//! Named snapshots of run workspaces (SPEC §26): one row per kept copy,
//! its size counted against the `disk_bytes` of every envelope on the
//! run's chain (over that run's subtree), gone with its tree's purge.
//! The copies themselves are files on the tree's node.

use super::db::{Row, Tx};
use super::runs::get_run;
use super::{now_ms, Store, StoreResult};
use crate::vals;

/// A kept snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The run whose workspace it copies.
    pub run_id: String,
    /// Its name (`[A-Za-z0-9_.-]{1,64}`), unique in the run.
    pub name: String,
    /// Bytes it holds.
    pub bytes: u64,
    /// When it was made (unix ms).
    pub created_at: i64,
}

/// The outcome of recording a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotRecorded {
    /// Recorded, with `snapshot.made` in the run's journal.
    Made,
    /// The run already has a snapshot of that name: nothing changed.
    Exists,
    /// It would take the subtree of `run_id` past its `disk_bytes`.
    DiskExceeded {
        /// The run whose envelope sets the limit.
        run_id: String,
        /// Its `disk_bytes`.
        limit: u64,
        /// What its subtree's snapshots hold now.
        used: u64,
    },
    /// No such run.
    NoRun,
}

fn snapshot_from_row(row: &Row) -> StoreResult<Snapshot> {
    Ok(Snapshot {
        run_id: row.get("run_id")?,
        name: row.get("name")?,
        bytes: row.get::<i64>("bytes")?.max(0) as u64,
        created_at: row.get("created_at")?,
    })
}

/// Bytes the snapshots of `run_id` and its descendants hold.
pub(super) fn subtree_snapshot_bytes(tx: &mut dyn Tx, run_id: &str) -> StoreResult<u64> {
    let sql = "SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT) AS n FROM snapshots WHERE run_id IN \
               (SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1)";
    Ok(tx.scalar::<i64>(sql, vals![run_id])?.max(0) as u64)
}

/// Each `disk_bytes` on the chain of `run` (its own envelope first), with
/// the run whose envelope sets it.
fn disk_limits(tx: &mut dyn Tx, run: &super::RunRecord) -> StoreResult<Vec<(String, u64)>> {
    let mut lineage = vec![(run.run_id.clone(), run.envelope.clone())];
    for ancestor in run.chain.iter().rev() {
        let envelope = get_run(tx, ancestor)?.and_then(|r| r.envelope);
        lineage.push((ancestor.clone(), envelope));
    }
    Ok(lineage
        .into_iter()
        .filter_map(|(id, e)| Some((id, e?.disk_bytes?)))
        .collect())
}

/// The record-a-snapshot script: the tree's lock, the run, the name, then
/// each `disk_bytes` on the chain (the run's own envelope first), then the
/// row and its event.
fn record_in(tx: &mut dyn Tx, snap: &Snapshot) -> StoreResult<SnapshotRecorded> {
    super::tree::lock_tree_of(tx, &snap.run_id)?;
    let Some(run) = get_run(tx, &snap.run_id)? else {
        return Ok(SnapshotRecorded::NoRun);
    };
    let taken = "SELECT COUNT(*) FROM snapshots WHERE run_id = ?1 AND name = ?2";
    if tx.scalar::<i64>(taken, vals![&snap.run_id, &snap.name])? > 0 {
        return Ok(SnapshotRecorded::Exists);
    }
    for (id, limit) in disk_limits(tx, &run)? {
        let used = subtree_snapshot_bytes(tx, &id)?;
        if used.saturating_add(snap.bytes) > limit {
            return Ok(SnapshotRecorded::DiskExceeded {
                run_id: id,
                limit,
                used,
            });
        }
    }
    tx.execute(
        "INSERT INTO snapshots (run_id, name, bytes, created_at) VALUES (?1, ?2, ?3, ?4)",
        vals![
            &snap.run_id,
            &snap.name,
            i64::try_from(snap.bytes).unwrap_or(i64::MAX),
            snap.created_at
        ],
    )?;
    let made = crate::event_kind::SnapshotMade {
        name: snap.name.clone(),
        bytes: snap.bytes,
    };
    super::journal::append_event(
        tx,
        &snap.run_id,
        None,
        crate::event_kind::EventKind::SnapshotMade(made),
    )?;
    Ok(SnapshotRecorded::Made)
}

impl Store {
    /// Records a snapshot of `run_id` holding `bytes`, within every
    /// `disk_bytes` on its chain (see [`SnapshotRecorded`]).
    pub async fn record_snapshot(
        &self,
        run_id: &str,
        name: &str,
        bytes: u64,
    ) -> StoreResult<SnapshotRecorded> {
        let snap = Snapshot {
            run_id: run_id.to_owned(),
            name: name.to_owned(),
            bytes,
            created_at: now_ms(),
        };
        self.write(move |tx| record_in(tx, &snap)).await
    }

    /// The bytes a new snapshot of `run_id` may hold now: the least room
    /// any `disk_bytes` on its chain leaves (`None`: no limit; a copy is
    /// bounded by it while it is made, the record checks again).
    pub async fn snapshot_room(&self, run_id: &str) -> StoreResult<Option<u64>> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            let Some(run) = get_run(tx, &run_id)? else {
                return Ok(Some(0));
            };
            let mut room: Option<u64> = None;
            for (id, limit) in disk_limits(tx, &run)? {
                let left = limit.saturating_sub(subtree_snapshot_bytes(tx, &id)?);
                room = Some(room.map_or(left, |r| r.min(left)));
            }
            Ok(room)
        })
        .await
    }

    /// A run's snapshots, oldest first.
    pub async fn snapshots(&self, run_id: &str) -> StoreResult<Vec<Snapshot>> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            let sql = "SELECT run_id, name, bytes, created_at FROM snapshots WHERE run_id = ?1 \
                       ORDER BY created_at, name";
            tx.query(sql, vals![run_id])?
                .iter()
                .map(snapshot_from_row)
                .collect()
        })
        .await
    }

    /// One snapshot of a run.
    pub async fn snapshot(&self, run_id: &str, name: &str) -> StoreResult<Option<Snapshot>> {
        let (run_id, name) = (run_id.to_owned(), name.to_owned());
        self.read(move |tx| {
            let sql = "SELECT run_id, name, bytes, created_at FROM snapshots \
                       WHERE run_id = ?1 AND name = ?2";
            tx.query_opt(sql, vals![run_id, name])?
                .as_ref()
                .map(snapshot_from_row)
                .transpose()
        })
        .await
    }

    /// Forgets a snapshot (its files go first); whether it was there.
    pub async fn delete_snapshot(&self, run_id: &str, name: &str) -> StoreResult<bool> {
        let (run_id, name) = (run_id.to_owned(), name.to_owned());
        self.write(move |tx| {
            super::tree::lock_tree_of(tx, &run_id)?;
            let sql = "DELETE FROM snapshots WHERE run_id = ?1 AND name = ?2";
            Ok(tx.execute(sql, vals![&run_id, &name])? > 0)
        })
        .await
    }
}
