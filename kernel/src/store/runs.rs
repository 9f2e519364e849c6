//! Runs as durable tasks: run records (parent, chain, principal, state,
//! envelope, budget), their tokens (stored as sha256, never in clear), the
//! ancestry that makes "a run and its descendants" one lookup, the
//! compare-and-set state transitions and the admission checks that read
//! them inside the admitting transaction.

use super::admission::Admission;
use super::admission::{run_refusal, tightest_budget, tree_limit_refusal, Counted, Refusal};
use super::db::{Row, Tx};
use super::journal::append_event;
use super::{now_ms, Store, StoreError, StoreResult};
use crate::event_kind::{ChildCreated, EventKind};
use crate::lifecycle::live_sql;
use crate::runs::{Budget, Envelope, RunState};
use crate::vals;

/// A run as the control plane records it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// The run's id (`[A-Za-z0-9_.-]{1,64}`; a child's is `<parent>.<name>`).
    pub run_id: String,
    /// The parent run; `None` for a top-level run.
    pub parent_run_id: Option<String>,
    /// Ancestor run ids, root first (empty for a top-level run).
    pub chain: Vec<String>,
    /// `operator`, or `run:<id>` of the run that created it.
    pub principal: String,
    /// Its state: `active`, `paused`, `completed` or `cancelled`.
    pub state: RunState,
    /// `None`: the kernel's default envelope (a run registered without one).
    pub envelope: Option<Envelope>,
    /// Its budget limits (any subset; empty: no limit of its own).
    pub budget: Budget,
    /// When it was registered (unix ms).
    pub created_at: i64,
    /// When its state last changed (unix ms).
    pub state_changed_at: Option<i64>,
    /// The `complete` call's summary.
    pub summary: Option<String>,
    /// Who completed or cancelled it (`operator` or `run:<id>`).
    pub decided_by: Option<String>,
    /// Who paused it (`operator` or `run:<id>`), while it is paused.
    pub paused_by: Option<String>,
    /// The `Idempotency-Key` a child was created under.
    pub idempotency_key: Option<String>,
    /// When `POST /v1/runs/{run}/finish` first returned for it (unix ms).
    pub finished_at: Option<i64>,
    /// The cluster node a top-level run's tree is placed on (SPEC §20);
    /// `None` for a child (its root's node holds) or without a cluster.
    pub node: Option<String>,
    /// The run's image, by the operator's name (SPEC §26); `None`: the
    /// kernel's default image.
    pub image: Option<String>,
    /// Where it was made from (SPEC §28); `None` for a run made before
    /// origins were recorded.
    pub origin: Option<crate::origin::Origin>,
}

impl RunRecord {
    /// How many ancestors it has (0 for a top-level run); bounded by
    /// `OPKERNEL_MAX_DEPTH`.
    pub fn depth(&self) -> usize {
        self.chain.len()
    }
}

const RUN_COLUMNS: &str = "run_id, parent_run_id, chain, principal, state, envelope, budget, \
    created_at, state_changed_at, summary, decided_by, paused_by, idempotency_key, finished_at, node, image, \
    origin_surface, origin_channel, origin_principal, origin_route";

fn run_from_row(row: &Row) -> StoreResult<RunRecord> {
    let corrupt = |what: String| StoreError::Corrupt(what);
    let chain: String = row.get("chain")?;
    let state: String = row.get("state")?;
    let envelope: String = row.get("envelope")?;
    let budget: String = row.get("budget")?;
    Ok(RunRecord {
        run_id: row.get("run_id")?,
        parent_run_id: row.get("parent_run_id")?,
        chain: serde_json::from_str(&chain).map_err(|e| corrupt(format!("chain: {e}")))?,
        principal: row.get("principal")?,
        state: RunState::parse(&state).ok_or_else(|| corrupt(format!("run state {state}")))?,
        envelope: if envelope == "{}" {
            None
        } else {
            Some(serde_json::from_str(&envelope).map_err(|e| corrupt(format!("envelope: {e}")))?)
        },
        budget: serde_json::from_str(&budget).map_err(|e| corrupt(format!("budget: {e}")))?,
        created_at: row.get("created_at")?,
        state_changed_at: row.get("state_changed_at")?,
        summary: row.get("summary")?,
        decided_by: row.get("decided_by")?,
        paused_by: row.get("paused_by")?,
        idempotency_key: row.get("idempotency_key")?,
        finished_at: row.get("finished_at")?,
        node: row.get("node")?,
        image: row.get("image")?,
        origin: super::ops::origin_from(row)?,
    })
}

pub(super) fn get_run(tx: &mut dyn Tx, run_id: &str) -> StoreResult<Option<RunRecord>> {
    tx.query_opt(
        &format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?1"),
        vals![run_id],
    )?
    .as_ref()
    .map(run_from_row)
    .transpose()
}

/// Records a top-level run with the kernel's default envelope unless the
/// run exists (a run the operator acts on before registering it).
pub(super) fn ensure_top_level(
    tx: &mut dyn Tx,
    run_id: &str,
    now: i64,
    origin: Option<&crate::origin::Origin>,
) -> StoreResult<()> {
    let made = tx.execute(
        "INSERT INTO runs (run_id, created_at, origin_surface, origin_channel, origin_principal, \
         origin_route) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
        vals![
            run_id,
            now,
            origin.map(|o| o.surface.as_str()),
            origin.map(|o| &o.channel),
            origin.map(|o| &o.principal),
            origin.map(|o| &o.route)
        ],
    )?;
    // a recorded run has its ancestry: every insert of a run writes both
    // in one transaction (migration 0005 gave the older ones theirs)
    if made == 0 {
        return Ok(());
    }
    tx.execute(
        "INSERT INTO run_ancestry (run_id, ancestor_id, distance) VALUES (?1, ?1, 0) \
         ON CONFLICT DO NOTHING",
        vals![run_id],
    )?;
    Ok(())
}

/// Runs and their states, read by `sql` (`run_id`, `state`) with one
/// parameter.
pub(super) fn run_states(
    tx: &mut dyn Tx,
    sql: &str,
    param: &str,
) -> StoreResult<Vec<(String, RunState)>> {
    tx.query(sql, vals![param])?
        .iter()
        .map(|row| {
            let id: String = row.get("run_id")?;
            let state: String = row.get("state")?;
            let state = RunState::parse(&state)
                .ok_or_else(|| StoreError::Corrupt(format!("run {id} state {state}")))?;
            Ok((id, state))
        })
        .collect()
}

fn to_json<T: serde::Serialize>(v: &T) -> StoreResult<String> {
    serde_json::to_string(v).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// A run to create.
#[derive(Debug, Clone)]
pub struct NewRun {
    /// The run's id (a child's already in its parent's namespace).
    pub run_id: String,
    /// The parent run, for a child created with a run token; `None` for a
    /// top-level run.
    pub parent: Option<String>,
    /// The envelope asked for, already resolved or narrowed; `None`: the
    /// kernel's default.
    pub envelope: Option<Envelope>,
    /// The budget asked for, already checked against the parent's chain.
    pub budget: Budget,
    /// Hex sha256 of the run's token (the token itself is never stored).
    pub token_sha256: String,
    /// The `Idempotency-Key` of a child's creation: a retry finds the same run.
    pub idempotency_key: Option<String>,
    /// The kernel's defaults for runs without an envelope of their own.
    pub limits: Admission,
    /// Its image by name (checked against the operator's list and the
    /// parent's envelope); `None`: the kernel's default.
    pub image: Option<String>,
    /// Where it is made from, from the call's context (SPEC §28).
    pub origin: crate::origin::Origin,
}

/// The result of creating a run.
#[derive(Debug)]
pub enum CreatedRun {
    /// The run was made, with its ancestry (and `run.child_created` for a
    /// child).
    Created(RunRecord),
    /// The run exists: nothing changed.
    Exists(RunRecord),
    /// The parent may not admit a child now.
    Refused(Refusal),
    /// The parent does not exist.
    NoParent,
}

/// The outcome of a state change.
#[derive(Debug)]
pub enum RunChange {
    /// Applied (or already so): the run as it is now, with the runs whose
    /// state changed and the ops whose kill was requested (a cancel).
    Done {
        /// The run as it is now.
        run: Box<RunRecord>,
        /// Runs whose state changed (the run, and its descendants for a
        /// cancel).
        changed: Vec<String>,
        /// Ops whose kill was requested (a cancel).
        kills: Vec<String>,
        /// Ops that waited for approval, denied by a cancel.
        denied: Vec<String>,
    },
    /// Not allowed from the run's state.
    Refused(RunState),
    /// `complete` while ops of the run or its descendants are live.
    LiveOps(u64),
    /// `resume` by someone below whoever paused it (named here).
    PausedAbove(String),
    /// No such run.
    NotFound,
}

/// The create-run transaction script (see [`Store::create_run`]): the
/// tree's lock, the run's existence, then for a child its parent's state,
/// budgets and envelope limits; then the row, its ancestry and, for a
/// child, `run.child_created` in the parent's journal.
fn create_in(tx: &mut dyn Tx, new: &NewRun) -> StoreResult<CreatedRun> {
    // locks the tree the run joins: its parent's (so a child's admission is
    // serialized with every op's and child's of that tree), or its own
    let root_of = new.parent.as_deref().unwrap_or(&new.run_id);
    // a child locks its own id first, as an implicit run's first op does
    // (then the tree it joins): the two cannot record the run at once
    if new.parent.is_some() {
        tx.lock_tree(&new.run_id)?;
    }
    super::tree::lock_tree_of(tx, root_of)?;
    if let Some(existing) = get_run(tx, &new.run_id)? {
        return Ok(CreatedRun::Exists(existing));
    }
    let (chain, principal) = match &new.parent {
        None => (Vec::new(), "operator".to_owned()),
        Some(parent) => {
            let Some(p) = get_run(tx, parent)? else {
                return Ok(CreatedRun::NoParent);
            };
            if let Some(refusal) = run_refusal(tx, parent)? {
                return Ok(CreatedRun::Refused(refusal));
            }
            if let Some(why) = tree_limit_refusal(tx, parent, Counted::Children, new.limits)? {
                return Ok(CreatedRun::Refused(Refusal::Limit(why)));
            }
            if let Some(why) = wider_network(&p, new) {
                return Ok(CreatedRun::Refused(Refusal::Limit(why)));
            }
            let mut chain = p.chain.clone();
            chain.push(parent.clone());
            (chain, format!("run:{parent}"))
        }
    };
    insert_run(tx, new, &chain, &principal)?;
    if let Some(parent) = &new.parent {
        let created = ChildCreated {
            child_run_id: new.run_id.clone(),
            envelope: new.envelope.clone(),
            budget: new.budget,
        };
        append_event(tx, parent, None, EventKind::RunChildCreated(created))?;
    }
    let run = get_run(tx, &new.run_id)?.ok_or_else(|| StoreError::Corrupt(new.run_id.clone()))?;
    Ok(CreatedRun::Created(run))
}

/// A child's allow list wider than its parent's as the tree's lock now
/// shows it (the parent narrowed meanwhile, SPEC §27): the refusal.
fn wider_network(parent: &RunRecord, new: &NewRun) -> Option<String> {
    let theirs = parent.envelope.as_ref()?.network.allow_list()?;
    let asked = new.envelope.as_ref()?.network.allow_list()?;
    let entry = theirs.wider_entry(&asked)?;
    Some(format!(
        "network: allow {entry} is wider than the parent's allow list now ({})",
        theirs.to_strings().join(", ")
    ))
}

/// The row of a new run and its ancestry (itself at 0, then its chain).
fn insert_run(tx: &mut dyn Tx, new: &NewRun, chain: &[String], principal: &str) -> StoreResult<()> {
    let envelope = match &new.envelope {
        Some(e) => to_json(e)?,
        None => "{}".to_owned(),
    };
    tx.execute(
        "INSERT INTO runs (run_id, token_sha256, created_at, parent_run_id, chain, principal, \
         envelope, budget, state_changed_at, idempotency_key, image, origin_surface, \
         origin_channel, origin_principal, origin_route) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?3, ?9, ?10, ?11, ?12, ?13, ?14)",
        vals![
            &new.run_id,
            &new.token_sha256,
            now_ms(),
            &new.parent,
            to_json(&chain)?,
            principal,
            envelope,
            to_json(&new.budget)?,
            &new.idempotency_key,
            &new.image,
            new.origin.surface.as_str(),
            &new.origin.channel,
            &new.origin.principal,
            &new.origin.route
        ],
    )?;
    let ancestry = "INSERT INTO run_ancestry (run_id, ancestor_id, distance) VALUES (?1, ?2, ?3)";
    tx.execute(ancestry, vals![&new.run_id, &new.run_id, 0i64])?;
    for (i, ancestor) in chain.iter().rev().enumerate() {
        tx.execute(ancestry, vals![&new.run_id, ancestor, i as i64 + 1])?;
    }
    Ok(())
}

impl Store {
    /// Creates a run: top-level (operator) or a child of `parent`, with its
    /// ancestry and, for a child, `run.child_created` in the parent's
    /// journal, all in one transaction. The parent must be active and
    /// within its budget. An existing run is left as it is.
    pub async fn create_run(&self, new: NewRun) -> StoreResult<CreatedRun> {
        self.write(move |tx| create_in(tx, &new)).await
    }

    /// Gives an existing run a new token (the old one stops working).
    pub async fn rekey_run(&self, run_id: &str, token_sha256: &str) -> StoreResult<bool> {
        let (run_id, token) = (run_id.to_owned(), token_sha256.to_owned());
        self.write(move |tx| {
            let sql = "UPDATE runs SET token_sha256 = ?2 WHERE run_id = ?1";
            Ok(tx.execute(sql, vals![&run_id, &token])? == 1)
        })
        .await
    }

    /// A run's record; `None` for an unknown run.
    pub async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        let run_id = run_id.to_owned();
        self.read(move |tx| get_run(tx, &run_id)).await
    }

    /// Records a top-level run with the kernel's defaults unless it exists
    /// (made from `origin`), and returns it.
    pub async fn ensure_run(
        &self,
        run_id: &str,
        origin: Option<&crate::origin::Origin>,
    ) -> StoreResult<RunRecord> {
        let (run_id, origin) = (run_id.to_owned(), origin.cloned());
        self.write(move |tx| {
            ensure_top_level(tx, &run_id, now_ms(), origin.as_ref())?;
            get_run(tx, &run_id)?.ok_or_else(|| StoreError::Corrupt(run_id.clone()))
        })
        .await
    }

    /// The direct children of a run with their states, oldest first.
    pub async fn children(&self, run_id: &str) -> StoreResult<Vec<(String, RunState)>> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            run_states(
                tx,
                "SELECT run_id, state FROM runs WHERE parent_run_id = ?1 ORDER BY created_at, run_id",
                &run_id,
            )
        })
        .await
    }

    /// Runs with their live-op counts, oldest first: every run, or a run
    /// and its descendants.
    pub async fn list_runs(
        &self,
        root: Option<String>,
        limit: u32,
    ) -> StoreResult<Vec<(RunRecord, u64)>> {
        self.read(move |tx| {
            let sql = format!(
                "SELECT {cols}, (SELECT COUNT(*) FROM ops o WHERE o.run_id = runs.run_id \
                 AND o.status IN ({live})) AS live FROM runs \
                 WHERE CAST(?1 AS TEXT) IS NULL \
                 OR run_id IN (SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1) \
                 ORDER BY created_at, run_id LIMIT ?2",
                cols = RUN_COLUMNS,
                live = live_sql()
            );
            tx.query(&sql, vals![root, limit])?
                .iter()
                .map(|r| Ok((run_from_row(r)?, r.get::<i64>("live")? as u64)))
                .collect()
        })
        .await
    }

    /// The tightest budget on a run's chain (see `tightest_budget`).
    pub async fn tightest_budget(&self, run_id: &str) -> StoreResult<Budget> {
        let run_id = run_id.to_owned();
        self.read(move |tx| tightest_budget(tx, &run_id)).await
    }

    /// The run a token hash belongs to.
    pub async fn run_for_token(&self, token_sha256: &str) -> StoreResult<Option<String>> {
        let token = token_sha256.to_owned();
        self.read(move |tx| {
            let sql = "SELECT run_id FROM runs WHERE token_sha256 = ?1";
            tx.query_opt(sql, vals![token])?
                .map(|r| r.get("run_id"))
                .transpose()
        })
        .await
    }

    /// Records that `finish` returned for the run (the first time only): the
    /// reaper may then remove its container without an idle wait.
    pub async fn mark_run_finished(&self, run_id: &str) -> StoreResult<()> {
        let run_id = run_id.to_owned();
        self.write(move |tx| {
            // serialized with the tree's admissions, which reopen it
            super::tree::lock_tree_of(tx, &run_id)?;
            tx.execute(
                "UPDATE runs SET finished_at = COALESCE(finished_at, ?2) WHERE run_id = ?1",
                vals![&run_id, now_ms()],
            )?;
            Ok(())
        })
        .await
    }

    /// `Some(finished)` for a known run, `None` for an unknown one.
    pub async fn run_finished(&self, run_id: &str) -> StoreResult<Option<bool>> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            let sql = "SELECT finished_at IS NOT NULL AS finished FROM runs WHERE run_id = ?1";
            tx.query_opt(sql, vals![run_id])?
                .map(|r| r.get("finished"))
                .transpose()
        })
        .await
    }

    /// The run's live ops (none once every op is terminal).
    pub async fn run_ops_live(&self, run_id: &str) -> StoreResult<Vec<crate::store::Op>> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            let sql = format!(
                "SELECT {} FROM ops WHERE run_id = ?1 AND status IN ({})",
                super::ops::COLUMNS,
                crate::lifecycle::live_sql()
            );
            super::ops::ops_of(tx, &sql, vals![run_id])
        })
        .await
    }

    /// Whether every op of the run is terminal and every background result
    /// and note went into a report (a foreground result goes to its caller):
    /// the run's files are no longer needed to deliver anything.
    pub async fn run_delivered(&self, run_id: &str) -> StoreResult<bool> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            let sql = format!(
                "SELECT NOT EXISTS (SELECT 1 FROM ops WHERE run_id = ?1 AND (status IN ({live}) \
                     OR (background = 1 AND report_id IS NULL AND delivered_inline = 0))) \
                 AND NOT EXISTS (SELECT 1 FROM notes WHERE run_id = ?1 AND report_id IS NULL)",
                live = crate::lifecycle::live_sql()
            );
            tx.scalar(&sql, vals![run_id])
        })
        .await
    }

    /// Latest activity (op creation or end) of a run, unix ms.
    pub async fn run_last_activity(&self, run_id: &str) -> StoreResult<Option<i64>> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            tx.scalar(
                "SELECT MAX(COALESCE(finished_at, created_at)) FROM ops WHERE run_id = ?1",
                vals![run_id],
            )
        })
        .await
    }
}

#[cfg(test)]
#[path = "runs_tests.rs"]
pub(super) mod tests;
