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

pub async fn reap(k: &Kernel, dry_run: bool) -> Result<Vec<ReapDecision>, StoreError> {
    let containers = match k.sandbox.list_managed().await {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!(%e, "reaper: cannot list containers");
            return Ok(Vec::new());
        }
    };
    let live_ops = k.store.live_ops().await?;
    let ttl_ms = k.config.reap_ttl.as_millis() as i64;
    let now = now_ms();
    let mut decisions = Vec::new();
    for c in containers {
        let run_id = c.labels.get(sandbox::profile::LABEL_RUN_ID).cloned();
        let keep = |reason: String| ReapDecision {
            container_id: c.id.clone(),
            name: c.name.clone(),
            run_id: run_id.clone(),
            action: "keep",
            reason,
            removed: false,
        };
        let Some(run) = run_id
            .clone()
            .filter(|r| sandbox::profile::validate_run_id(r).is_ok())
        else {
            decisions.push(keep("its run label cannot be confirmed".into()));
            continue;
        };
        let key = sandbox::profile::scratch_key(&run);
        if c.labels.get(sandbox::profile::LABEL_SCRATCH_KEY) != Some(&key) {
            decisions.push(keep("its scratch key label does not match its run".into()));
            continue;
        }
        if !k.sandbox.owns(&c) {
            decisions.push(keep(format!(
                "it belongs to another kernel home ({})",
                c.scratch_source.as_deref().unwrap_or("no /scratch mount")
            )));
            continue;
        }
        if let Some(op) = live_ops.iter().find(|op| {
            op.container_id.as_deref() == Some(&c.id)
                || (op.run_id == run && op.container_id.is_none())
        }) {
            decisions.push(keep(format!("op {} is {}", op.id, op.status.as_str())));
            continue;
        }
        // ops the control plane may not know of: a pid file without a code
        let ops_dir = k.sandbox.ops_dir(&key);
        let open_ops = open_op_files(ops_dir.path());
        let mut verdict: Option<String> = None;
        if c.running {
            match k.sandbox.probe(&c.id).await {
                Ok(procs) => {
                    if let Some(p) = procs.first() {
                        verdict = Some(format!(
                            "op {} still has processes (pid {})",
                            p.op_id, p.pid
                        ));
                    }
                }
                Err(e) => verdict = Some(format!("cannot probe its processes: {e}")),
            }
            if verdict.is_none() {
                match k.sandbox.top(&c.id).await {
                    Ok(top) => {
                        if let Some(p) = top.iter().find(|p| !is_idle_process(&p.command)) {
                            verdict = Some(format!("unknown process running: {}", p.command));
                        }
                    }
                    Err(e) => verdict = Some(format!("cannot read its process table: {e}")),
                }
            }
        }
        if let Some(reason) = verdict {
            decisions.push(keep(reason));
            continue;
        }
        let finished = k.store.run_finished(&run).await?.unwrap_or(false);
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
        let idle_ms = now - last_activity;
        if !finished && idle_ms < ttl_ms {
            decisions.push(keep(format!(
                "idle {}s, below the {}s ttl{}",
                idle_ms / 1000,
                ttl_ms / 1000,
                if open_ops > 0 {
                    format!(", {open_ops} op(s) without an exit code")
                } else {
                    String::new()
                }
            )));
            continue;
        }
        let reason = if finished {
            "run finished and no op is live".to_owned()
        } else {
            format!(
                "no live op and idle {}s (ttl {}s)",
                idle_ms / 1000,
                ttl_ms / 1000
            )
        };
        let mut removed = false;
        if !dry_run {
            match tokio::time::timeout(Duration::from_secs(30), k.sandbox.remove(&c.id)).await {
                Ok(Ok(_)) => {
                    removed = true;
                    k.forget_container(&c.id);
                    k.probes.forget(&c.id);
                    tracing::info!(container = %c.name, %reason, "reaped container");
                }
                Ok(Err(e)) => {
                    tracing::warn!(container = %c.name, %e, "reaper could not remove container")
                }
                Err(_) => tracing::warn!(container = %c.name, "reaper: remove timed out"),
            }
        }
        decisions.push(ReapDecision {
            container_id: c.id.clone(),
            name: c.name.clone(),
            run_id: Some(run),
            action: "remove",
            reason,
            removed,
        });
    }
    Ok(decisions)
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
    #[test]
    fn idle_processes_are_recognised() {
        assert!(super::is_idle_process(
            "/sbin/docker-init -- /bin/sh -c while :; do sleep 3600; done"
        ));
        assert!(super::is_idle_process("sleep 3600"));
        assert!(!super::is_idle_process("python server.py"));
    }
}
