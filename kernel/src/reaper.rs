//! The orphan reaper. A container missing from the registry is not an
//! orphan by that fact alone: age only makes it a candidate; the decision
//! comes from the control plane, the `.ops` files and the process table.
//! Anything live or undecidable keeps the container, with the reason.

use std::time::Duration;

use serde::Serialize;

use crate::kernel::Kernel;
use crate::store::{now_ms, StoreError};

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ReapDecision {
    pub container_id: String,
    pub name: String,
    pub run_id: Option<String>,
    /// `remove` or `keep`.
    pub action: &'static str,
    pub reason: String,
    /// True when the container was actually removed (never in a dry run).
    pub removed: bool,
}

/// Commands of a run container's own idle processes (init and main loop).
fn is_idle_process(command: &str) -> bool {
    command.contains("docker-init")
        || command.contains("while :; do sleep 3600; done")
        || command == "sleep 3600"
}

/// What the reaper knows about one managed container when it decides.
#[derive(Debug, Clone)]
pub struct ReapFacts {
    /// The run id from its label, when it is a valid run id.
    pub run_id: Option<String>,
    /// Its scratch key label matches its run.
    pub scratch_key_matches: bool,
    /// Its `/scratch` is this kernel home's (else: where it points).
    pub owned: Result<(), String>,
    /// A live op of the run (id, status) in the control plane.
    pub live_op: Option<(String, String)>,
    /// Whether the container runs; then what its processes show.
    pub running: bool,
    /// A marked process found by the probe, or why it could not probe.
    pub marked_process: Result<Option<String>, String>,
    /// A process that is neither init nor the idle loop, or why `top` failed.
    pub unknown_process: Result<Option<String>, String>,
    pub run_finished: bool,
    pub idle_ms: i64,
    pub ttl_ms: i64,
    /// Ops in the `.ops` dir with a pid file and no code file.
    pub open_op_files: usize,
}

impl Default for ReapFacts {
    /// Nothing known yet: no run, nothing found.
    fn default() -> Self {
        ReapFacts {
            run_id: None,
            scratch_key_matches: false,
            owned: Ok(()),
            live_op: None,
            running: false,
            marked_process: Ok(None),
            unknown_process: Ok(None),
            run_finished: false,
            idle_ms: 0,
            ttl_ms: 0,
            open_op_files: 0,
        }
    }
}

/// The reaper's verdict on one container: `Some(reason)` to remove it,
/// `Err(reason)` to keep it. Pure: every fact is gathered beforehand.
pub fn decide_reap(f: &ReapFacts) -> Result<String, String> {
    if f.run_id.is_none() {
        return Err("its run label cannot be confirmed".into());
    }
    if !f.scratch_key_matches {
        return Err("its scratch key label does not match its run".into());
    }
    if let Err(source) = &f.owned {
        return Err(format!("it belongs to another kernel home ({source})"));
    }
    if let Some((id, status)) = &f.live_op {
        return Err(format!("op {id} is {status}"));
    }
    if f.running {
        match &f.marked_process {
            Ok(Some(p)) => return Err(p.clone()),
            Err(e) => return Err(format!("cannot probe its processes: {e}")),
            Ok(None) => {}
        }
        match &f.unknown_process {
            Ok(Some(cmd)) => return Err(format!("unknown process running: {cmd}")),
            Err(e) => return Err(format!("cannot read its process table: {e}")),
            Ok(None) => {}
        }
    }
    if f.run_finished {
        return Ok("run finished and no op is live".into());
    }
    if f.idle_ms < f.ttl_ms {
        let open = if f.open_op_files > 0 {
            format!(", {} op(s) without an exit code", f.open_op_files)
        } else {
            String::new()
        };
        return Err(format!(
            "idle {}s, below the {}s ttl{open}",
            f.idle_ms / 1000,
            f.ttl_ms / 1000
        ));
    }
    Ok(format!(
        "no live op and idle {}s (ttl {}s)",
        f.idle_ms / 1000,
        f.ttl_ms / 1000
    ))
}

/// Gathers the facts about one container (control plane, `.ops` files,
/// probe and `docker top`).
async fn facts(
    k: &Kernel,
    c: &sandbox::ContainerInfo,
    live_ops: &[crate::store::Op],
) -> Result<ReapFacts, StoreError> {
    let mut f = ReapFacts {
        run_id: c
            .labels
            .get(sandbox::profile::LABEL_RUN_ID)
            .filter(|r| sandbox::profile::validate_run_id(r).is_ok())
            .cloned(),
        ttl_ms: k.config.reap_ttl.as_millis() as i64,
        ..ReapFacts::default()
    };
    let Some(run) = f.run_id.clone() else {
        return Ok(f);
    };
    let key = sandbox::profile::scratch_key(&run);
    f.scratch_key_matches = c.labels.get(sandbox::profile::LABEL_SCRATCH_KEY) == Some(&key);
    if !k.sandbox.owns(c) {
        f.owned = Err(c
            .scratch_source
            .clone()
            .unwrap_or_else(|| "no /scratch mount".into()));
    }
    if !f.scratch_key_matches || f.owned.is_err() {
        return Ok(f);
    }
    f.live_op = live_ops
        .iter()
        .find(|op| {
            op.container_id.as_deref() == Some(&c.id)
                || (op.run_id == run && op.container_id.is_none())
        })
        .map(|op| (op.id.clone(), op.status.as_str().to_owned()));
    if f.live_op.is_some() {
        return Ok(f);
    }
    let ops_dir = k.sandbox.ops_dir(&key);
    f.open_op_files = open_op_files(ops_dir.path());
    f.running = c.running;
    if c.running {
        f.marked_process = match k.sandbox.probe(&c.id).await {
            Ok(procs) => Ok(procs
                .first()
                .map(|p| format!("op {} still has processes (pid {})", p.op_id, p.pid))),
            Err(e) => Err(e.to_string()),
        };
        if matches!(f.marked_process, Ok(None)) {
            f.unknown_process = match k.sandbox.top(&c.id).await {
                Ok(top) => Ok(top
                    .into_iter()
                    .find(|p| !is_idle_process(&p.command))
                    .map(|p| p.command)),
                Err(e) => Err(e.to_string()),
            };
        }
    }
    f.run_finished = k.store.run_finished(&run).await?.unwrap_or(false);
    let created_ms = c
        .labels
        .get(sandbox::profile::LABEL_CREATED_AT)
        .and_then(|v| v.parse::<i64>().ok())
        .map(|s| s * 1000)
        .unwrap_or(0);
    let last_activity = k
        .store
        .run_last_activity(&run)
        .await?
        .unwrap_or(0)
        .max(newest_mtime_ms(ops_dir.path()))
        .max(created_ms);
    f.idle_ms = now_ms() - last_activity;
    Ok(f)
}

pub async fn reap(k: &Kernel, dry_run: bool) -> Result<Vec<ReapDecision>, StoreError> {
    let containers = match k.sandbox.list_managed().await {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!(%e, "reaper: cannot list containers");
            return Ok(Vec::new());
        }
    };
    let live_ops = k.store.live_ops().await?;
    let mut decisions = Vec::new();
    for c in containers {
        let f = facts(k, &c, &live_ops).await?;
        let mut decision = ReapDecision {
            container_id: c.id.clone(),
            name: c.name.clone(),
            run_id: c.labels.get(sandbox::profile::LABEL_RUN_ID).cloned(),
            action: "keep",
            reason: String::new(),
            removed: false,
        };
        match decide_reap(&f) {
            Err(reason) => decision.reason = reason,
            Ok(reason) => {
                decision.action = "remove";
                decision.reason = reason;
                if let (false, Some(run)) = (dry_run, f.run_id.as_deref()) {
                    remove_under_gate(k, &c, run, &mut decision).await?;
                }
            }
        }
        decisions.push(decision);
    }
    Ok(decisions)
}

/// Removes a container the reaper decided on, holding the run's gate (no
/// launch of the run is between container and exec) and re-checking the
/// control plane under it: an op admitted since the decision keeps the
/// container. The scratch dir goes with it once every result of the run
/// was delivered.
async fn remove_under_gate(
    k: &Kernel,
    c: &sandbox::ContainerInfo,
    run: &str,
    decision: &mut ReapDecision,
) -> Result<(), StoreError> {
    let _gate = k.reap_gate(run).await;
    // decide again from fresh facts: an op admitted (and perhaps already
    // ended, reopening a finished run) since the first look keeps it
    let live = k.store.run_ops_live(run).await?;
    if let Err(reason) = decide_reap(&facts(k, c, &live).await?) {
        decision.action = "keep";
        decision.reason = format!("kept on a second look under the run's gate: {reason}");
        return Ok(());
    }
    match tokio::time::timeout(Duration::from_secs(30), k.sandbox.remove(&c.id)).await {
        Ok(Ok(_)) => {
            decision.removed = true;
            k.forget_container(&c.id);
            k.probes.forget(&c.id);
            tracing::info!(container = %c.name, reason = %decision.reason, "reaped container");
        }
        Ok(Err(e)) => {
            // it may be half gone: the next launch must look it up afresh
            k.forget_container(&c.id);
            tracing::warn!(container = %c.name, %e, "reaper could not remove container");
            return Ok(());
        }
        Err(_) => {
            k.forget_container(&c.id);
            tracing::warn!(container = %c.name, "reaper: remove timed out");
            return Ok(());
        }
    }
    // the scratch dir is shared by every container of the run (a profile
    // change makes a second one): it goes with the last of them
    let others = k.sandbox.list_managed().await.map(|list| {
        list.iter().any(|o| {
            o.id != c.id
                && o.labels
                    .get(sandbox::profile::LABEL_RUN_ID)
                    .map(String::as_str)
                    == Some(run)
        })
    });
    if !matches!(others, Ok(false)) {
        decision
            .reason
            .push_str("; scratch dir kept for the run's other container");
    } else if k.store.run_delivered(run).await? {
        let key = sandbox::profile::scratch_key(run);
        k.watcher.unwatch(k.sandbox.ops_dir(&key).path());
        match k.sandbox.remove_scratch(&key) {
            Ok(()) => decision
                .reason
                .push_str("; scratch dir removed (every result delivered)"),
            Err(e) => tracing::warn!(%e, "reaper could not remove a scratch dir"),
        }
    } else {
        decision
            .reason
            .push_str("; scratch dir kept until its results are delivered");
    }
    Ok(())
}

/// Ops in a `.ops` dir with a pid file and no code file.
fn open_op_files(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".pid"))
                .map(str::to_owned)
        })
        .filter(|id| !dir.join(format!("{id}.code")).exists())
        .count()
}

fn newest_mtime_ms(dir: &std::path::Path) -> i64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok()?.metadata().ok()?.modified().ok())
        .filter_map(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
        .max()
        .unwrap_or(0)
}

/// Runs the reaper every `reap_interval`.
pub fn spawn_periodic(k: std::sync::Arc<Kernel>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(k.config.reap_interval);
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Err(e) = reap(&k, false).await {
                tracing::warn!(%e, "periodic reap failed");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn removable() -> ReapFacts {
        ReapFacts {
            run_id: Some("r".into()),
            scratch_key_matches: true,
            running: true,
            idle_ms: 7_200_000,
            ttl_ms: 3_600_000,
            ..ReapFacts::default()
        }
    }

    #[test]
    fn decide_reap_keeps_anything_live_or_undecidable() {
        assert!(decide_reap(&removable()).is_ok());
        let keep = |change: &dyn Fn(&mut ReapFacts), why: &str| {
            let mut f = removable();
            change(&mut f);
            let reason = decide_reap(&f).expect_err(why);
            assert!(reason.contains(why), "{reason} lacks {why}");
        };
        keep(&|f| f.run_id = None, "run label");
        keep(&|f| f.scratch_key_matches = false, "scratch key");
        keep(
            &|f| f.owned = Err("/other/home".into()),
            "another kernel home",
        );
        keep(
            &|f| f.live_op = Some(("o1".into(), "starting".into())),
            "op o1 is starting",
        );
        keep(
            &|f| f.marked_process = Ok(Some("op x still has processes".into())),
            "still has processes",
        );
        keep(
            &|f| f.marked_process = Err("timeout".into()),
            "cannot probe",
        );
        keep(
            &|f| f.unknown_process = Ok(Some("python x.py".into())),
            "unknown process",
        );
        keep(&|f| f.unknown_process = Err("gone".into()), "process table");
        keep(&|f| f.idle_ms = 10_000, "below the 3600s ttl");
        // a finished run goes at once; a stopped container is not probed
        let mut f = removable();
        f.run_finished = true;
        f.idle_ms = 0;
        assert_eq!(decide_reap(&f).unwrap(), "run finished and no op is live");
        let mut f = removable();
        f.running = false;
        f.marked_process = Err("not running".into());
        assert!(decide_reap(&f).is_ok());
    }

    #[test]
    fn idle_processes_are_recognised() {
        assert!(super::is_idle_process(
            "/sbin/docker-init -- /bin/sh -c while :; do sleep 3600; done"
        ));
        assert!(super::is_idle_process("sleep 3600"));
        assert!(!super::is_idle_process("python server.py"));
    }
}
