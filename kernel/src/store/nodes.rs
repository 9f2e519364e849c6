//! The cluster's membership and placement (SPEC §20): a node is a lease
//! row renewed on the database's clock; any node's sweeper turns a lapsed
//! one `dead` with a new epoch and settles its ops in the same
//! transaction; a top-level run is placed on the active node with the
//! fewest live ops; the exec claim is fenced by the claiming node's epoch.

use super::db::{Dialect, Tx};
pub(super) use super::lease::db_now;
use super::ops::{ops_of, Op, Settlement, COLUMNS};
use super::{Store, StoreResult};
use crate::event_kind::{EventKind, ToolLateResult};
use crate::lifecycle::{live_sql, observed_sql, Outcome};
use crate::vals;

/// The node that sweeps: its name and epoch, and how long it must have
/// held its lease since its last join (its whole TTL).
#[derive(Debug, Clone)]
pub struct Judge {
    /// The sweeping node.
    pub node: String,
    /// Its current epoch.
    pub epoch: i64,
    /// The unbroken hold it needs, in ms.
    pub held_ms: i64,
}

/// A node as the control plane has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    /// Its name (`serve --node`).
    pub name: String,
    /// Where other nodes reach its API (`serve --advertise`).
    pub advertise_url: String,
    /// Its current epoch: bumped at each join and when it is declared dead.
    pub epoch: i64,
    /// `active`, `draining` or `dead`.
    pub state: String,
    /// Milliseconds since its last renewal, on the database's clock.
    pub lease_age_ms: i64,
    /// Its ops not yet terminal.
    pub live_ops: i64,
    /// Its managed containers, as it counted them at its last renewal.
    pub containers: i64,
}

/// A node declared dead by a sweep, with what became of its ops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swept {
    /// The node.
    pub name: String,
    /// Its ops settled (claimed → `lost`, unclaimed → `failed`), with their runs.
    pub settled: Vec<(String, String)>,
}

impl Store {
    /// Joins (or rejoins) the cluster as `name`: a new epoch, a fresh
    /// lease of `ttl_ms`, `active` (a draining node stays draining).
    /// Returns the epoch every claim of this node is fenced by.
    pub async fn join_node(&self, name: &str, url: &str, ttl_ms: i64) -> StoreResult<i64> {
        let (name, url) = (name.to_owned(), url.to_owned());
        self.lease_write(move |tx| {
            let now = db_now(tx);
            let sql = format!(
                "INSERT INTO nodes (name, advertise_url, epoch, lease_until, renewed_at, joined_at, state) \
                 VALUES (?1, ?2, 1, {now} + ?3, {now}, {now}, 'active') \
                 ON CONFLICT (name) DO UPDATE SET epoch = nodes.epoch + 1, \
                 advertise_url = excluded.advertise_url, lease_until = excluded.lease_until, \
                 renewed_at = excluded.renewed_at, joined_at = excluded.joined_at, \
                 state = CASE WHEN nodes.state = 'draining' THEN 'draining' ELSE 'active' END \
                 RETURNING epoch"
            );
            // a single kernel's live ops (the database turned into a
            // cluster's) are not taken here: only the node whose disk holds
            // their files takes them over (SPEC §24, `take_over_ops`); its
            // webhook claims go (a single kernel and nodes never share a
            // database: it is stopped)
            let epoch = tx.query_one(&sql, vals![&name, url, ttl_ms])?.get("epoch")?;
            tx.execute(
                "UPDATE webhook_outbox SET taken_by = NULL, taken_until = NULL \
                 WHERE taken_by = 'single-kernel'",
                vals![],
            )?;
            Ok(epoch)
        })
        .await
    }

    /// Renews the lease of `name` at `epoch`; false when it lapsed, the
    /// node was declared dead, or its epoch changed (then the node stops
    /// claiming and joins again). Records its container count.
    ///
    /// `(containers, pool_free)`: its managed containers and free warm-pool
    /// containers now (placement prefers a node with a free one).
    pub async fn renew_lease(
        &self,
        name: &str,
        epoch: i64,
        ttl_ms: i64,
        (containers, pool_free): (i64, i64),
    ) -> StoreResult<bool> {
        let name = name.to_owned();
        self.lease_write(move |tx| {
            let now = db_now(tx);
            let sql = format!(
                "UPDATE nodes SET lease_until = {now} + ?3, renewed_at = {now}, containers = ?4, \
                 pool_free = ?5 \
                 WHERE name = ?1 AND epoch = ?2 AND state <> 'dead' AND lease_until > {now}"
            );
            Ok(tx.execute(&sql, vals![name, epoch, ttl_ms, containers, pool_free])? == 1)
        })
        .await
    }

    /// Stops new placement on a node (its ops finish where they are);
    /// false when no such live node.
    pub async fn drain_node(&self, name: &str) -> StoreResult<bool> {
        let name = name.to_owned();
        self.write(move |tx| {
            let n = tx.execute(
                "UPDATE nodes SET state = 'draining' WHERE name = ?1 AND state = 'active'",
                vals![&name],
            )?;
            Ok(n == 1)
        })
        .await
    }

    /// Lets new runs be placed on a draining node again; false when no
    /// such draining node.
    pub async fn activate_node(&self, name: &str) -> StoreResult<bool> {
        let name = name.to_owned();
        self.write(move |tx| {
            let n = tx.execute(
                "UPDATE nodes SET state = 'active' WHERE name = ?1 AND state = 'draining'",
                vals![&name],
            )?;
            Ok(n == 1)
        })
        .await
    }

    /// Every node, by name.
    pub async fn nodes(&self) -> StoreResult<Vec<NodeRow>> {
        self.read(|tx| {
            let sql = format!(
                "SELECT n.name, n.advertise_url, n.epoch, n.state, {now} - n.renewed_at AS lease_age_ms, \
                 n.containers, (SELECT COUNT(*) FROM ops o WHERE o.node = n.name AND o.status IN ({live})) AS live_ops \
                 FROM nodes n ORDER BY n.name",
                now = db_now(tx),
                live = live_sql()
            );
            tx.query(&sql, vals![])?
                .iter()
                .map(|r| {
                    Ok(NodeRow {
                        name: r.get("name")?,
                        advertise_url: r.get("advertise_url")?,
                        epoch: r.get("epoch")?,
                        state: r.get("state")?,
                        lease_age_ms: r.get("lease_age_ms")?,
                        live_ops: r.get("live_ops")?,
                        containers: r.get("containers")?,
                    })
                })
                .collect()
        })
        .await
    }

    /// Declares every other node whose lease lapsed `dead`, each in one
    /// transaction with its ops' settlement (see `sweep_one`), judged by
    /// `judge` (this node, its epoch, and how long it must have held its
    /// lease since its last join). Safe on every node at once: the node's
    /// row is the compare-and-set.
    pub async fn sweep_nodes(&self, judge: Judge) -> StoreResult<Vec<Swept>> {
        let me = judge.node.clone();
        let lapsed: Vec<String> = self
            .read(move |tx| {
                let sql = format!(
                    "SELECT name FROM nodes WHERE state <> 'dead' AND name <> ?1 AND lease_until <= {}",
                    db_now(tx)
                );
                tx.query(&sql, vals![me])?
                    .iter()
                    .map(|r| r.get("name"))
                    .collect()
            })
            .await?;
        let mut swept = Vec::new();
        for name in lapsed {
            let judge = judge.clone();
            if let Some(s) = self.write(move |tx| sweep_one(tx, &name, &judge)).await? {
                swept.push(s);
            }
        }
        let leftover: Vec<String> = self
            .read(|tx| {
                let sql = format!(
                    "SELECT DISTINCT o.node FROM ops o JOIN nodes n ON n.name = o.node \
                     WHERE n.state = 'dead' AND o.status IN ({})",
                    crate::lifecycle::live_sql()
                );
                tx.query(&sql, vals![])?
                    .iter()
                    .map(|r| r.get("node"))
                    .collect()
            })
            .await?;
        for name in leftover {
            let n = name.clone();
            let settled = self.write(move |tx| settle_leftovers(tx, &n)).await?;
            if !settled.is_empty() {
                swept.push(Swept { name, settled });
            }
        }
        Ok(swept)
    }
}

/// One lapsed node, in one transaction: its row turns `dead` with a new
/// epoch (compare-and-set on the lapse: a renewal or another sweeper that
/// came first wins); its observed ops are settled ([`settle_orphans`]);
/// ops awaiting approval keep waiting, unplaced (the approval places them
/// again).
fn sweep_one(tx: &mut dyn Tx, name: &str, judge: &Judge) -> StoreResult<Option<Swept>> {
    let now = db_now(tx);
    // the judge's own lease is checked in the same statement, on the
    // database's clock: a statement queued while the judge was cut off
    // (a frozen server, a stalled connection) judges nobody when it runs
    let sql = format!(
        "UPDATE nodes SET epoch = epoch + 1, state = 'dead' \
         WHERE name = ?1 AND name <> ?2 AND state <> 'dead' AND lease_until <= {now} \
         AND EXISTS (SELECT 1 FROM nodes j WHERE j.name = ?2 AND j.epoch = ?3 \
         AND j.state <> 'dead' AND j.lease_until > {now} AND j.joined_at <= {now} - ?4)"
    );
    let params = vals![name, judge.node.as_str(), judge.epoch, judge.held_ms];
    if tx.execute(&sql, params)? != 1 {
        return Ok(None);
    }
    let settled = settle_orphans(tx, name)?;
    // its webhook claims go with it: any live node posts them now
    tx.execute(
        "UPDATE webhook_outbox SET taken_by = NULL, taken_until = NULL WHERE taken_by = ?1",
        vals![name],
    )?;
    Ok(Some(Swept {
        name: name.to_owned(),
        settled,
    }))
}

/// A dead node's observed ops, settled through the ordinary compare-and-
/// set: claimed → `lost` (the command may have run), never claimed →
/// `failed` (nothing ran). The trees are locked first, in order (as every
/// tree write takes them), then the rows (`FOR UPDATE`: a claim that
/// committed meanwhile is seen as such). Its waiting ops lose their node.
fn settle_orphans(tx: &mut dyn Tx, name: &str) -> StoreResult<Vec<(String, String)>> {
    let sql = format!(
        "SELECT DISTINCT run_id FROM ops WHERE node = ?1 AND status IN ({})",
        observed_sql()
    );
    let runs: Vec<String> = tx
        .query(&sql, vals![name])?
        .iter()
        .map(|r| r.get("run_id"))
        .collect::<StoreResult<_>>()?;
    super::tree::lock_trees_of(tx, runs)?;
    let lock = match tx.dialect() {
        Dialect::Postgres => " FOR UPDATE",
        Dialect::Sqlite => "",
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM ops WHERE node = ?1 AND status IN ({}) ORDER BY id{lock}",
        observed_sql()
    );
    let mut settled = Vec::new();
    for op in ops_of(tx, &sql, vals![name])? {
        let outcome = match op.exec_claimed_at {
            Some(_) => Outcome::Lost {
                reason: format!("node {name} lost"),
            },
            None => Outcome::Failed {
                error: "node lost before start".into(),
                killed: false,
            },
        };
        if super::settle::settle_in(tx, &op.id, &Settlement::of(outcome))? {
            settled.push((op.id, op.run_id));
        }
    }
    tx.execute(
        "UPDATE ops SET node = NULL WHERE node = ?1 AND status = 'awaiting_approval'",
        vals![name],
    )?;
    Ok(settled)
}

/// Ops placed on a node that is dead now (admitted or approved in the
/// moment its sweep ran), settled as its sweep would have; one
/// transaction per node, which must still be dead.
fn settle_leftovers(tx: &mut dyn Tx, name: &str) -> StoreResult<Vec<(String, String)>> {
    let lock = match tx.dialect() {
        Dialect::Postgres => " FOR UPDATE",
        Dialect::Sqlite => "",
    };
    let sql = format!("SELECT state FROM nodes WHERE name = ?1{lock}");
    let state: Option<String> = tx
        .query_opt(&sql, vals![name])?
        .map(|r| r.get("state"))
        .transpose()?;
    if state.as_deref() != Some("dead") {
        return Ok(Vec::new());
    }
    settle_orphans(tx, name)
}

/// The node of a run tree (placed on `root`), placing it when it has none
/// or its node was declared dead: the `active` node with a live lease and
/// fewer than `max_live` live ops, one with a free warm-pool container
/// first (SPEC §22), then the fewest live ops. When none can take it
/// (nothing written), why, read in the same statement: no node with a live
/// lease, or every one full. Called with the tree locked; the root's row
/// may not exist yet (then the admission records the placement again).
pub(super) fn place(tx: &mut dyn Tx, root: &str, max_live: u64) -> StoreResult<Placed> {
    let now = db_now(tx);
    // its node, while that node is not dead (SPEC §24): a lease that merely
    // lapsed (a store outage, a restart, a slow renewal) keeps the tree
    // where its workspace and live ops are; its new ops wait for their
    // node, and are settled by the sweep only if it is declared dead
    if let Some(row) = tx.query_opt(
        "SELECT r.node FROM runs r JOIN nodes n ON n.name = r.node \
         WHERE r.run_id = ?1 AND n.state <> 'dead'",
        vals![root],
    )? {
        return Ok(Placed::On(row.get("node")?));
    }
    // a node at its live-op limit takes no new tree (SPEC §24: the limit
    // is per node), whatever its free pool containers
    let sql = format!(
        "SELECT name, live FROM (SELECT n.name, n.pool_free, (SELECT COUNT(*) FROM ops o \
         WHERE o.node = n.name AND o.status IN ({live})) AS live FROM nodes n \
         WHERE n.state = 'active' AND n.lease_until > {now}) c \
         ORDER BY CASE WHEN live < ?1 THEN 0 ELSE 1 END, \
         CASE WHEN pool_free > 0 THEN 0 ELSE 1 END, live, name LIMIT 1",
        live = live_sql()
    );
    let room = i64::try_from(max_live).unwrap_or(i64::MAX);
    let Some(row) = tx.query_opt(&sql, vals![room])? else {
        return Ok(Placed::NoNode);
    };
    if row.get::<i64>("live")? >= room {
        return Ok(Placed::Full);
    }
    let node: String = row.get("name")?;
    record_placement(tx, root, &node)?;
    Ok(Placed::On(node))
}

/// Where [`place`] put a tree, or why nowhere.
pub(super) enum Placed {
    /// On this node.
    On(String),
    /// Every node with a live lease is at its live-op limit.
    Full,
    /// No active node holds a live lease.
    NoNode,
}

/// Records a tree's node on its root's row (again, once an admission
/// created that row).
pub(super) fn record_placement(tx: &mut dyn Tx, root: &str, node: &str) -> StoreResult<()> {
    tx.execute(
        "UPDATE runs SET node = ?2 WHERE run_id = ?1",
        vals![root, node],
    )?;
    Ok(())
}

/// The fence of a node's exec claim, as a condition on the claimed op row
/// (`?6` the node, `?7` its epoch): the op is the node's, and the node's
/// lease is live at that epoch, on the database's clock.
pub(super) fn claim_fence(tx: &dyn Tx) -> String {
    format!(
        " AND node = ?6 AND EXISTS (SELECT 1 FROM nodes WHERE name = ?6 AND epoch = ?7 \
         AND state <> 'dead' AND lease_until > {})",
        db_now(tx)
    )
}

impl Store {
    /// Places the new top-level run `run` on `node` before its first op,
    /// while that node is active or draining with a live lease: a
    /// foreground one-shot runs on the node that took the call, which then
    /// removes its container (SPEC §24: a draining node too, so it never
    /// leaves its container to another node's reaper; drain stops new
    /// runs, and a one-shot ends with its call).
    pub async fn pin_run(
        &self,
        run: &str,
        node: &str,
        origin: &crate::origin::Origin,
    ) -> StoreResult<()> {
        let (run, node, origin) = (run.to_owned(), node.to_owned(), origin.clone());
        self.write(move |tx| {
            super::runs::ensure_top_level(tx, &run, super::now_ms(), Some(&origin))?;
            let sql = format!(
                "UPDATE runs SET node = ?2 WHERE run_id = ?1 AND EXISTS (SELECT 1 FROM nodes \
                 WHERE name = ?2 AND state IN ('active', 'draining') AND lease_until > {})",
                db_now(tx)
            );
            tx.execute(&sql, vals![&run, &node])?;
            Ok(())
        })
        .await
    }

    /// The node holding the workspace of `run`'s tree (SPEC §26): its
    /// root's node while that is not dead; else the tree is placed now, as
    /// its first op's admission would place it (a file written before any
    /// command goes where the commands will run). `None`: no such run, or
    /// no node can take the tree.
    pub async fn workspace_node(&self, run: &str) -> StoreResult<Option<String>> {
        let asked = run.to_owned();
        let placed = self
            .read(move |tx| {
                let root = super::tree::tree_root(tx, &asked)?;
                tx.query_opt(
                    "SELECT r.node FROM runs r JOIN nodes n ON n.name = r.node \
                     WHERE r.run_id = ?1 AND n.state <> 'dead'",
                    vals![root],
                )?
                .map(|row| row.get::<String>("node"))
                .transpose()
            })
            .await?;
        if placed.is_some() {
            return Ok(placed);
        }
        let run = run.to_owned();
        self.write(move |tx| {
            let root = super::tree::lock_tree_of(tx, &run)?;
            if super::runs::get_run(tx, &run)?.is_none() {
                return Ok(None);
            }
            Ok(match place(tx, &root, u64::MAX)? {
                Placed::On(node) => Some(node),
                Placed::Full | Placed::NoNode => None,
            })
        })
        .await
    }

    /// Places the tree of a run forked on `node` there, unless it is placed
    /// on a live node already (a child's tree is its parent's); whether the
    /// tree is on `node` now (its workspace, just copied, is on that disk).
    pub async fn place_fork(&self, run: &str, node: &str) -> StoreResult<bool> {
        let (run, node) = (run.to_owned(), node.to_owned());
        self.write(move |tx| {
            let root = super::tree::lock_tree_of(tx, &run)?;
            let sql = format!(
                "UPDATE runs SET node = ?2 WHERE run_id = ?1 AND (node IS NULL OR node IN \
                 (SELECT name FROM nodes WHERE state = 'dead')) AND EXISTS (SELECT 1 FROM nodes \
                 WHERE name = ?2 AND state IN ('active', 'draining') AND lease_until > {})",
                db_now(tx)
            );
            tx.execute(&sql, vals![&root, &node])?;
            let now: Option<String> = tx
                .query_opt("SELECT node FROM runs WHERE run_id = ?1", vals![&root])?
                .map(|r| r.get("node"))
                .transpose()?
                .flatten();
            Ok(now.as_deref() == Some(node.as_str()))
        })
        .await
    }

    /// The observed ops a single kernel left unplaced (the database turned
    /// into a cluster's), with their runs: a node takes over those whose
    /// files its own disk holds ([`Store::take_over_op`]).
    pub async fn unplaced_ops(&self) -> StoreResult<Vec<Op>> {
        self.read(|tx| {
            let sql = format!(
                "SELECT {COLUMNS} FROM ops WHERE node IS NULL AND status IN ({})",
                observed_sql()
            );
            ops_of(tx, &sql, vals![])
        })
        .await
    }

    /// Takes over an unplaced observed op (and its tree, when unplaced)
    /// for this node: false when another node took it first or it ended.
    /// `fresh_only`: only while nothing of its run was ever claimed (it has
    /// no workspace anywhere: any node may take it, nothing ran).
    pub async fn take_over_op(&self, id: &str, fresh_only: bool) -> StoreResult<bool> {
        let (Some(node), id) = (self.node().map(str::to_owned), id.to_owned()) else {
            return Ok(false);
        };
        self.write(move |tx| {
            let Some(run_id) = super::ops::run_of(tx, &id)? else {
                return Ok(false);
            };
            let root = super::tree::lock_tree_of(tx, &run_id)?;
            // a tree placed on another node keeps its ops there; a fresh
            // take needs a tree that never ran anything (no workspace
            // anywhere) and this node active with a live lease
            let now = db_now(tx);
            let fresh = match fresh_only {
                true => format!(
                    " AND (EXISTS (SELECT 1 FROM runs r WHERE r.run_id = ?3 AND r.node = ?2) \
                      OR (NOT EXISTS (SELECT 1 FROM run_ancestry a JOIN ops p ON p.run_id = a.run_id \
                      WHERE a.ancestor_id = ?3 AND p.exec_claimed_at IS NOT NULL) \
                     AND EXISTS (SELECT 1 FROM nodes n WHERE n.name = ?2 AND n.state = 'active' \
                      AND n.lease_until > {now})))"
                ),
                false => {
                    " AND EXISTS (SELECT 1 FROM nodes n WHERE n.name = ?2 AND n.state <> 'dead')"
                        .to_owned()
                }
            };
            let sql = format!(
                "UPDATE ops SET node = ?2 WHERE id = ?1 AND node IS NULL AND status IN ({}){fresh} \
                 AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = ?3 AND r.node IS NOT NULL \
                  AND r.node <> ?2)",
                observed_sql()
            );
            if tx.execute(&sql, vals![&id, &node, &root])? == 0 {
                return Ok(false);
            }
            tx.execute(
                "UPDATE runs SET node = ?2 WHERE run_id = ?1 AND node IS NULL",
                vals![root, &node],
            )?;
            Ok(true)
        })
        .await
    }

    /// This node's ops settled `lost` by a sweep of it since `since_ms`
    /// (unix ms) with no `tool.late_result` yet: the ops whose real end it
    /// may still find on its disk.
    pub async fn lost_with_node(&self, node: &str, since_ms: i64) -> StoreResult<Vec<Op>> {
        self.read(lost_with(node, since_ms)).await
    }

    /// [`Store::lost_with_node`] on the lease's own connection: for a
    /// join, whose renewals wait for it, never behind the pool's load (a
    /// whole cluster joins again under load after a store outage).
    pub async fn lost_with_node_on_lease(&self, node: &str, since_ms: i64) -> StoreResult<Vec<Op>> {
        self.lease_read(lost_with(node, since_ms)).await
    }

    /// Records the real end of an op already settled `lost`: a
    /// `tool.late_result` event, once; the op itself does not change
    /// (terminal stays terminal). False when it was recorded before.
    pub async fn record_late_result(&self, id: &str, late: ToolLateResult) -> StoreResult<bool> {
        let id = id.to_owned();
        self.write(move |tx| {
            let Some(run_id) = super::ops::run_of(tx, &id)? else {
                return Ok(false);
            };
            super::tree::lock_tree_of(tx, &run_id)?;
            let seen = tx.query_opt(
                "SELECT 1 AS seen FROM events WHERE run_id = ?1 AND operation_id = ?2 \
                 AND kind = 'tool.late_result'",
                vals![&run_id, &id],
            )?;
            if seen.is_some() {
                return Ok(false);
            }
            super::journal::append_event(
                tx,
                &run_id,
                Some(&id),
                EventKind::ToolLateResult(late.clone()),
            )?;
            Ok(true)
        })
        .await
    }
}

/// The script of [`Store::lost_with_node`].
fn lost_with(node: &str, since_ms: i64) -> impl FnOnce(&mut dyn Tx) -> StoreResult<Vec<Op>> {
    let node = node.to_owned();
    move |tx| {
        let sql = format!(
            "SELECT {COLUMNS} FROM ops WHERE node = ?1 AND status = 'lost' AND error = ?2 \
             AND finished_at >= ?3 AND NOT EXISTS (SELECT 1 FROM events e \
             WHERE e.run_id = ops.run_id AND e.operation_id = ops.id AND e.kind = 'tool.late_result')"
        );
        ops_of(
            tx,
            &sql,
            vals![&node, format!("node {node} lost"), since_ms],
        )
    }
}
