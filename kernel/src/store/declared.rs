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
    /// `timeout_sec` was in the file (else the default, lowered to fit
    /// the run's envelope as the API lowers it).
    pub timeout_given: bool,
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
    /// Its `version`, when it has one: files with versions are followed in
    /// their order (a lower one is older, whatever starts first).
    pub version: Option<i64>,
    /// Its schedules.
    pub schedules: Vec<Declared>,
}

/// What a reconciliation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled {
    /// The file is the one followed already: nothing to do.
    Unchanged,
    /// The file was followed before and a newer one since, or has a
    /// lower version than the one followed: not applied.
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
    // a new timing starts from now, and a finished one-shot given a new
    // time is enabled again (a held claim keeps it: its op's end reads
    // the new due time)
    let over = super::runs::get_run(tx, &s.run_id)?.is_some_and(|r| r.state.is_final());
    let (next, enabled) = match s.timing == d.timing {
        true => (s.next_due_at, s.enabled),
        false => (d.timing.first_due(now_ms()), !over),
    };
    tx.execute(
        "UPDATE schedules SET command = ?2, timeout_sec = ?3, kind = ?4, spec = ?5, \
         catch_up = ?6, declared_in = ?7, next_due_at = ?8, enabled = ?9 WHERE id = ?1",
        vals![
            id,
            command,
            d.timeout_sec as i64,
            d.timing.kind(),
            d.timing.spec(),
            d.catch_up,
            path,
            next,
            enabled
        ],
    )?;
    Ok(true)
}

/// Why the file cannot be applied (checked before anything is written,
/// so a refusal leaves the control plane as it was): an entry's timeout
/// over its run's envelope, a new entry on a run that is over, a dotted
/// (child) run id that does not exist, a run that would hold more
/// schedules than a run may (counting those this pass removes).
fn refusal(
    tx: &mut dyn Tx,
    file: &mut DeclaredFile,
    existing: &[Option<String>],
    keys_gone: &[String],
) -> StoreResult<Option<String>> {
    let mut adding: std::collections::BTreeMap<String, i64> = Default::default();
    for (d, id) in file.schedules.iter_mut().zip(existing) {
        let run = super::runs::get_run(tx, &d.run_id)?;
        let ceiling = run
            .as_ref()
            .and_then(|r| r.envelope.as_ref()?.max_timeout_sec);
        match (ceiling, d.timeout_given) {
            (Some(c), true) if d.timeout_sec > c => {
                return Ok(Some(format!(
                    "schedule {:?}: timeout_sec {} is over run {}'s envelope (max_timeout_sec {c})",
                    d.key, d.timeout_sec, d.run_id
                )))
            }
            (Some(c), false) => d.timeout_sec = d.timeout_sec.min(c),
            _ => {}
        }
        if id.is_some() {
            continue;
        }
        match run.map(|r| r.state) {
            Some(state) if state.is_final() => {
                return Ok(Some(format!(
                    "schedule {:?}: run {} is {} and takes no schedules",
                    d.key,
                    d.run_id,
                    state.as_str()
                )))
            }
            None if d.run_id.contains('.') => {
                return Ok(Some(format!(
                    "schedule {:?}: run {} names a child run, which a file cannot make \
                     (its parent makes it)",
                    d.key, d.run_id
                )))
            }
            _ => {}
        }
        *adding.entry(d.run_id.clone()).or_default() += 1;
    }
    for (run, added) in adding {
        let held: i64 = tx.scalar(
            "SELECT COUNT(*) FROM schedules WHERE run_id = ?1",
            vals![&run],
        )?;
        let gone = keys_gone
            .iter()
            .filter(|k| k.starts_with(&format!("{run}/")))
            .count() as i64;
        let total = held - gone + added;
        if total > super::schedules::MAX_SCHEDULES_PER_RUN {
            return Ok(Some(format!(
                "run {run} would hold {total} schedules (at most {})",
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

/// Where a file stands among the files followed.
enum Standing {
    /// Never followed and not older than the newest: to apply.
    New,
    /// The one followed now.
    Current,
    /// Followed before and replaced since, or of a lower version.
    Older,
    /// Its version was followed with other content.
    VersionReused(i64),
}

/// The file's standing: its content against every file followed, its
/// version (when both have one) against the newest's.
fn standing(tx: &mut dyn Tx, file: &DeclaredFile) -> StoreResult<Standing> {
    let newest = tx.query_opt(
        "SELECT sha256, version FROM declared_files ORDER BY seq DESC LIMIT 1",
        vals![],
    )?;
    let (newest_sha, newest_version) = match newest {
        Some(r) => (
            Some(r.get::<String>("sha256")?),
            r.get::<Option<i64>>("version")?,
        ),
        None => (None, None),
    };
    if newest_sha.as_deref() == Some(file.sha256.as_str()) {
        return Ok(Standing::Current);
    }
    if let (Some(mine), Some(theirs)) = (file.version, newest_version) {
        return Ok(match mine.cmp(&theirs) {
            std::cmp::Ordering::Less => Standing::Older,
            std::cmp::Ordering::Equal => Standing::VersionReused(mine),
            std::cmp::Ordering::Greater => Standing::New,
        });
    }
    let seen: i64 = tx.scalar(
        "SELECT COUNT(*) FROM declared_files WHERE sha256 = ?1",
        vals![&file.sha256],
    )?;
    Ok(if seen > 0 {
        Standing::Older
    } else {
        Standing::New
    })
}

/// Each entry's schedule id, when it has one already.
fn existing_ids(tx: &mut dyn Tx, file: &DeclaredFile) -> StoreResult<Vec<Option<String>>> {
    let mut existing = Vec::new();
    for d in &file.schedules {
        let found = tx.query_opt(
            "SELECT id FROM schedules WHERE declared_key = ?1",
            vals![&d.key],
        )?;
        existing.push(found.map(|r| r.get::<String>("id")).transpose()?);
    }
    Ok(existing)
}

/// The declared schedules the file no longer names: (id, key).
fn gone(tx: &mut dyn Tx, file: &DeclaredFile) -> StoreResult<Vec<(String, String)>> {
    let keys: Vec<&str> = file.schedules.iter().map(|d| d.key.as_str()).collect();
    let declared = tx.query(
        "SELECT id, declared_key FROM schedules WHERE declared_key IS NOT NULL",
        vals![],
    )?;
    let mut out = Vec::new();
    for row in declared {
        let key: String = row.get("declared_key")?;
        if !keys.contains(&key.as_str()) {
            out.push((row.get("id")?, key));
        }
    }
    Ok(out)
}

/// The reconciliation script (see the module comment).
fn reconcile_in(
    tx: &mut dyn Tx,
    file: &DeclaredFile,
    node: &str,
    midway: &mut Option<Midway>,
) -> StoreResult<Reconciled> {
    tx.lock_tree(LOCK)?;
    match standing(tx, file)? {
        Standing::Current => return Ok(Reconciled::Unchanged),
        Standing::Older => return Ok(Reconciled::Older),
        Standing::VersionReused(v) => {
            return Ok(Reconciled::Refused(format!(
                "version {v} was applied with other content: give the changed file a higher version"
            )))
        }
        Standing::New => {}
    }
    let mut file = file.clone();
    let existing = existing_ids(tx, &file)?;
    let gone = gone(tx, &file)?;
    let keys_gone: Vec<String> = gone.iter().map(|(_, k)| k.clone()).collect();
    if let Some(why) = refusal(tx, &mut file, &existing, &keys_gone)? {
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
    let mut removed = 0;
    for (id, _) in gone {
        // an op it fired goes on as an ordinary op
        removed += tx.execute("DELETE FROM schedules WHERE id = ?1", vals![id])? as usize;
    }
    if let Some(hook) = midway.take() {
        hook();
    }
    let seq: i64 = tx.scalar(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM declared_files",
        vals![],
    )?;
    tx.execute(
        "INSERT INTO declared_files (sha256, path, applied_at, applied_by, seq, version) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        vals![&file.sha256, &file.path, now_ms(), node, seq, file.version],
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
