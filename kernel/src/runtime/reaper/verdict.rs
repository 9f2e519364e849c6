//! The reaper's pure decisions: the verdict on one container from the
//! facts gathered about it, and the fate of a run's scratch dir.

use std::fmt;

use super::{ReapAction, ReapDecision};

/// Commands of a run container's own idle processes: Docker's init and the
/// shim's main process (`serve`, the resident launcher, or `idle`; the
/// shell loop of containers made before the shim).
pub(super) fn is_idle_process(command: &str) -> bool {
    let shim_idle = command
        .strip_prefix(sandbox::shim::SHIM_PATH)
        .is_some_and(|rest| {
            rest == " idle"
                || rest.strip_prefix(" serve").is_some_and(|poll| {
                    poll.is_empty()
                        || poll.strip_prefix(" --poll-ms=").is_some_and(|n| {
                            !n.is_empty() && n.len() <= 4 && n.bytes().all(|b| b.is_ascii_digit())
                        })
                })
        });
    shim_idle
        || command.contains("docker-init")
        || command.contains("while :; do sleep 3600; done")
        || command == "sleep 3600"
}

/// What the reaper knows about one managed container when it decides.
#[derive(Debug, Clone)]
pub struct ReapFacts {
    /// Docker's container id.
    pub container_id: String,
    /// The container's name.
    pub name: String,
    /// Its run label as found (for the report), valid or not.
    pub run_label: Option<String>,
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
    /// Its run was finished (`POST /v1/runs/{run}/finish`): no idle wait
    /// applies.
    pub run_finished: bool,
    /// Milliseconds since the run's last activity (control plane, `.ops` files,
    /// creation label).
    pub idle_ms: i64,
    /// Idle time after which a container without live ops may go
    /// (`OPKERNEL_REAP_TTL`), in milliseconds.
    pub ttl_ms: i64,
    /// Ops in the `.ops` dir with a pid file and no code file.
    pub open_op_files: usize,
}

impl Default for ReapFacts {
    /// Nothing known yet: no run, nothing found.
    fn default() -> Self {
        ReapFacts {
            container_id: String::new(),
            name: String::new(),
            run_label: None,
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

/// Why the reaper keeps a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeepReason {
    /// Its run label is missing or not a valid run id.
    UnconfirmedRun,
    /// Its scratch key label does not match its run.
    ScratchKeyMismatch,
    /// Its `/scratch` belongs to another kernel home (where it points).
    OtherHome(String),
    /// An op of its run is live in the control plane.
    LiveOp {
        /// The op's id.
        op_id: String,
        /// Its status as stored.
        status: String,
    },
    /// The probe found a marked process (its description).
    MarkedProcess(String),
    /// The probe could not run (why).
    ProbeFailed(String),
    /// A process that is neither init nor the idle loop runs (its command).
    UnknownProcess(String),
    /// The process table could not be read (why).
    ProcessTableFailed(String),
    /// Idle for less than the ttl.
    Recent {
        /// Milliseconds since the run's last activity.
        idle_ms: i64,
        /// The reap ttl, in milliseconds.
        ttl_ms: i64,
        /// Ops in the `.ops` dir with a pid file and no code file.
        open_op_files: usize,
    },
}

/// Why the reaper removes a container: nothing in it is live, and
/// one of these holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoveReason {
    /// Its run was finished.
    RunFinished,
    /// It idled past the ttl.
    Idle {
        /// Milliseconds since the run's last activity.
        idle_ms: i64,
        /// The reap ttl, in milliseconds.
        ttl_ms: i64,
    },
}

/// The reaper's verdict on one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Leave it, for this reason.
    Keep(KeepReason),
    /// Remove it, for this reason.
    Remove(RemoveReason),
}

impl Verdict {
    /// Keep or remove.
    pub fn action(&self) -> ReapAction {
        match self {
            Verdict::Keep(_) => ReapAction::Keep,
            Verdict::Remove(_) => ReapAction::Remove,
        }
    }
}

impl fmt::Display for KeepReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeepReason::UnconfirmedRun => write!(f, "its run label cannot be confirmed"),
            KeepReason::ScratchKeyMismatch => {
                write!(f, "its scratch key label does not match its run")
            }
            KeepReason::OtherHome(source) => {
                write!(f, "it belongs to another kernel home ({source})")
            }
            KeepReason::LiveOp { op_id, status } => write!(f, "op {op_id} is {status}"),
            KeepReason::MarkedProcess(p) => write!(f, "{p}"),
            KeepReason::ProbeFailed(e) => write!(f, "cannot probe its processes: {e}"),
            KeepReason::UnknownProcess(cmd) => write!(f, "unknown process running: {cmd}"),
            KeepReason::ProcessTableFailed(e) => write!(f, "cannot read its process table: {e}"),
            KeepReason::Recent {
                idle_ms,
                ttl_ms,
                open_op_files,
            } => {
                write!(
                    f,
                    "idle {}s, below the {}s ttl",
                    idle_ms / 1000,
                    ttl_ms / 1000
                )?;
                if *open_op_files > 0 {
                    write!(f, ", {open_op_files} op(s) without an exit code")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for RemoveReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemoveReason::RunFinished => write!(f, "run finished and no op is live"),
            RemoveReason::Idle { idle_ms, ttl_ms } => write!(
                f,
                "no live op and idle {}s (ttl {}s)",
                idle_ms / 1000,
                ttl_ms / 1000
            ),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Keep(r) => r.fmt(f),
            Verdict::Remove(r) => r.fmt(f),
        }
    }
}

/// The verdict on one container: anything live or undecidable keeps it.
pub fn verdict(f: &ReapFacts) -> Verdict {
    match keep_reason(f) {
        Some(reason) => Verdict::Keep(reason),
        None if f.run_finished => Verdict::Remove(RemoveReason::RunFinished),
        None => Verdict::Remove(RemoveReason::Idle {
            idle_ms: f.idle_ms,
            ttl_ms: f.ttl_ms,
        }),
    }
}

/// What keeps the container, if anything.
fn keep_reason(f: &ReapFacts) -> Option<KeepReason> {
    if f.run_id.is_none() {
        return Some(KeepReason::UnconfirmedRun);
    }
    if !f.scratch_key_matches {
        return Some(KeepReason::ScratchKeyMismatch);
    }
    if let Err(source) = &f.owned {
        return Some(KeepReason::OtherHome(source.clone()));
    }
    if let Some((op_id, status)) = &f.live_op {
        return Some(KeepReason::LiveOp {
            op_id: op_id.clone(),
            status: status.clone(),
        });
    }
    if f.running {
        match &f.marked_process {
            Ok(Some(p)) => return Some(KeepReason::MarkedProcess(p.clone())),
            Err(e) => return Some(KeepReason::ProbeFailed(e.clone())),
            Ok(None) => {}
        }
        match &f.unknown_process {
            Ok(Some(cmd)) => return Some(KeepReason::UnknownProcess(cmd.clone())),
            Err(e) => return Some(KeepReason::ProcessTableFailed(e.clone())),
            Ok(None) => {}
        }
    }
    if !f.run_finished && f.idle_ms < f.ttl_ms {
        return Some(KeepReason::Recent {
            idle_ms: f.idle_ms,
            ttl_ms: f.ttl_ms,
            open_op_files: f.open_op_files,
        });
    }
    None
}

/// The reaper's decisions on every managed container, from facts gathered
/// beforehand. Pure: the removal loop carries them out.
pub fn decide_reap(facts: &[ReapFacts]) -> Vec<ReapDecision> {
    facts
        .iter()
        .map(|f| {
            let verdict = verdict(f);
            ReapDecision {
                container_id: f.container_id.clone(),
                name: f.name.clone(),
                run_id: f.run_label.clone(),
                action: verdict.action(),
                reason: verdict.to_string(),
                removed: false,
                node: None,
            }
        })
        .collect()
}

/// What becomes of a run's scratch dir once one of its containers is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScratchFate {
    /// Remove the scratch dir with the container.
    Remove,
    /// Keep it, for this reason.
    Keep(&'static str),
}

/// The scratch dir is shared by every container of the run (a profile
/// change makes a second one): it goes with the last of them, and only
/// once every result of the run was delivered. Undecidable keeps it.
pub fn scratch_fate(other_containers: Option<bool>, delivered: bool) -> ScratchFate {
    match (other_containers, delivered) {
        (Some(false), true) => ScratchFate::Remove,
        (Some(false), false) => ScratchFate::Keep("until its results are delivered"),
        _ => ScratchFate::Keep("for the run's other container"),
    }
}

#[cfg(test)]
#[path = "verdict_tests.rs"]
mod tests;
