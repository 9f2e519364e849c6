//! Declared schedules (SPEC §28; seed 000: "configuration jobs reconciled
//! at start all carry an owner"): the operator's file, reconciled with the
//! control plane in one transaction at start. New entries are created,
//! changed ones updated in place (their id, claim and history kept),
//! entries gone from the file removed; schedules made through the API are
//! never touched.
//!
//! In a cluster every node may start with its own copy of the file. The
//! control plane records each file it followed, by content: a node whose
//! file is the one followed now does nothing; one whose file was followed
//! before (an older copy) does nothing and says so; only a file never
//! seen is applied, by the first node to start with it. So nodes never
//! take turns undoing each other, and a rolling restart with a new file
//! applies it once.

use super::db::Tx;
use super::schedules::{create_in, NewSchedule};
use super::{now_ms, Store, StoreResult};
use crate::timing::Timing;
use crate::vals;

/// One schedule of the file, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Declared {
    /// Its key in the file (its `name`, else its run and command).
    pub key: String,
    /// Its run, made as a top-level run when absent.
    pub run_id: String,
    /// The argv each fire runs.
    pub command: Vec<String>,
    /// Each fired op's timeout, seconds.
    pub timeout_sec: u64,
    /// When it fires.
    pub timing: Timing,
    /// An overdue schedule fires once at start.
    pub catch_up: bool,
}

/// The file as read: its path, content digest, entries.
#[derive(Debug, Clone)]
pub struct DeclaredFile {
    /// Where the operator keeps it.
    pub path: String,
    /// Hex sha256 of its bytes.
    pub sha256: String,
    /// Its schedules.
    pub schedules: Vec<Declared>,
}

/// What a reconciliation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled {
    /// The file is the one followed already: nothing to do.
    Unchanged,
    /// The file was followed before and a newer one since: not applied.
    Older,
    /// Applied: schedules created, updated, removed.
    Applied {
        /// Created.
        created: usize,
        /// Updated in place.
        updated: usize,
        /// Removed (declared before, gone from the file).
        removed: usize,
    },
    /// An entry could not be created (its run is over, or would hold too
    /// many schedules): nothing was written.
    Refused(String),
}

/// A hook run inside the reconciliation's transaction.
pub type Midway = Box<dyn FnOnce() + Send>;

/// The lock every reconciliation takes (not a run id: it has a space).
const LOCK: &str = "declared schedules";

/// Updates one declared schedule in place when its definition changed;
/// whether it did. A new timing starts from now; the claim and the
/// history stay.
fn update_in(tx: &mut dyn Tx, id: &str, d: &Declared, path: &str) -> StoreResult<bool> {
    let Some(s) = super::schedules::get_schedule(tx, id)? else {
        return Ok(false);
    };
    let same = s.run_id == d.run_id
        && s.command == d.command
        && s.timeout_sec == d.timeout_sec
        && s.timing == d.timing
        && s.catch_up == d.catch_up
        && s.declared_in.as_deref() == Some(path);
    if same {
        return Ok(false);
    }
    let command =
        serde_json::to_string(&d.command).map_err(|e| super::StoreError::Corrupt(e.to_string()))?;
    let next = match s.timing == d.timing {
        true => s.next_due_at,
        false => d.timing.first_due(now_ms()),
    };
    tx.execute(
        "UPDATE schedules SET command = ?2, timeout_sec = ?3, kind = ?4, spec = ?5, \
         catch_up = ?6, declared_in = ?7, next_due_at = ?8 WHERE id = ?1",
        vals![
            id,
            command,
            d.timeout_sec as i64,
            d.timing.kind(),
            d.timing.spec(),
            d.catch_up,
            path,
            next
        ],
    )?;
    Ok(true)
}

/// Why an entry to be created cannot be (checked before anything is
/// written, so a refusal leaves the control plane as it was): its run is
/// over, or would hold more schedules than a run may.
fn refusal(tx: &mut dyn Tx, new: &[&Declared]) -> StoreResult<Option<String>> {
    let mut per_run: std::collections::BTreeMap<&str, i64> = Default::default();
    for d in new {
        *per_run.entry(d.run_id.as_str()).or_default() += 1;
        if let Some(state) = super::runs::get_run(tx, &d.run_id)?.map(|r| r.state) {
            if state.is_final() {
                return Ok(Some(format!(
                    "schedule {:?}: run {} is {} and takes no schedules",
                    d.key,
                    d.run_id,
                    state.as_str()
                )));
            }
        }
    }
    for (run, adding) in per_run {
        let held: i64 = tx.scalar(
            "SELECT COUNT(*) FROM schedules WHERE run_id = ?1",
            vals![run],
        )?;
        if held + adding > super::schedules::MAX_SCHEDULES_PER_RUN {
            return Ok(Some(format!(
                "run {run} would hold {} schedules (at most {})",
                held + adding,
                super::schedules::MAX_SCHEDULES_PER_RUN
            )));
        }
    }
    Ok(None)
}

/// Creates one declared schedule, its run made when absent (checked by
/// [`refusal`] first).
fn create_declared(tx: &mut dyn Tx, d: &Declared, path: &str) -> StoreResult<()> {
    let origin = crate::origin::Origin::new(
        crate::origin::Surface::Schedule,
        &format!("declared in {path}"),
        "operator",
    )
    .with_route("declared schedules");
    super::runs::ensure_top_level(tx, &d.run_id, now_ms(), Some(&origin))?;
    let new = NewSchedule {
        run_id: d.run_id.clone(),
        command: d.command.clone(),
        timeout_sec: d.timeout_sec,
        timing: d.timing.clone(),
        catch_up: d.catch_up,
        delete_after_success: false,
    };
    let made = create_in(tx, &new)?.map_err(|why| {
        super::StoreError::Corrupt(format!("schedule {:?} after its check: {why}", d.key))
    })?;
    tx.execute(
        "UPDATE schedules SET declared_key = ?2, declared_in = ?3 WHERE id = ?1",
        vals![&made.id, &d.key, path],
    )?;
    Ok(())
}

/// Where the file stands among the files followed: the newest's digest,
/// and whether this one was followed ever.
fn standing(tx: &mut dyn Tx, sha256: &str) -> StoreResult<(Option<String>, bool)> {
    let newest = tx
        .query_opt(
            "SELECT sha256 FROM declared_files ORDER BY seq DESC LIMIT 1",
            vals![],
        )?
        .map(|r| r.get::<String>("sha256"))
        .transpose()?;
    let seen: i64 = tx.scalar(
        "SELECT COUNT(*) FROM declared_files WHERE sha256 = ?1",
        vals![sha256],
    )?;
    Ok((newest, seen > 0))
}

/// The reconciliation script (see the module comment).
fn reconcile_in(
    tx: &mut dyn Tx,
    file: &DeclaredFile,
    node: &str,
    midway: &mut Option<Midway>,
) -> StoreResult<Reconciled> {
    tx.lock_tree(LOCK)?;
    match standing(tx, &file.sha256)? {
        (Some(newest), _) if newest == file.sha256 => return Ok(Reconciled::Unchanged),
        (_, true) => return Ok(Reconciled::Older),
        _ => {}
    }
    let mut existing = Vec::new();
    for d in &file.schedules {
        let found = tx.query_opt(
            "SELECT id FROM schedules WHERE declared_key = ?1",
            vals![&d.key],
        )?;
        existing.push(found.map(|r| r.get::<String>("id")).transpose()?);
    }
    let new: Vec<&Declared> = file
        .schedules
        .iter()
        .zip(&existing)
        .filter_map(|(d, id)| id.is_none().then_some(d))
        .collect();
    if let Some(why) = refusal(tx, &new)? {
        return Ok(Reconciled::Refused(why));
    }
    let (mut created, mut updated) = (0, 0);
    for (d, id) in file.schedules.iter().zip(&existing) {
        match id {
            Some(id) => updated += usize::from(update_in(tx, id, d, &file.path)?),
            None => {
                create_declared(tx, d, &file.path)?;
                created += 1;
            }
        }
    }
    let keys: Vec<&str> = file.schedules.iter().map(|d| d.key.as_str()).collect();
    let declared = tx.query(
        "SELECT id, declared_key FROM schedules WHERE declared_key IS NOT NULL",
        vals![],
    )?;
    let mut removed = 0;
    for row in declared {
        let key: String = row.get("declared_key")?;
        if !keys.contains(&key.as_str()) {
            let id: String = row.get("id")?;
            // an op it fired goes on as an ordinary op
            removed += tx.execute("DELETE FROM schedules WHERE id = ?1", vals![id])? as usize;
        }
    }
    if let Some(hook) = midway.take() {
        hook();
    }
    let seq: i64 = tx.scalar(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM declared_files",
        vals![],
    )?;
    tx.execute(
        "INSERT INTO declared_files (sha256, path, applied_at, applied_by, seq) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
        vals![&file.sha256, &file.path, now_ms(), node, seq],
    )?;
    Ok(Reconciled::Applied {
        created,
        updated,
        removed,
    })
}

impl Store {
    /// Reconciles the control plane's declared schedules with `file`, in
    /// one transaction (a kernel killed midway leaves nothing half done:
    /// its next start does it again); `node` names who applied it;
    /// `midway` runs inside the transaction once its changes are written
    /// (a drill's crash point).
    pub async fn reconcile_declared(
        &self,
        file: DeclaredFile,
        node: &str,
        midway: Option<Midway>,
    ) -> StoreResult<Reconciled> {
        let node = node.to_owned();
        let mut midway = midway;
        self.write(move |tx| reconcile_in(tx, &file, &node, &mut midway))
            .await
    }
}
