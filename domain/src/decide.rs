//! The pure decision core of an op's observer. Everything an attempt knows
//! arrives as an [`Evidence`] value next to its [`State`]; [`next`] answers
//! with one [`Action`], which the executor (`watch.rs`, `launch.rs`) carries
//! out before it asks again. Nothing here does I/O or reads a clock, so each
//! invariant of ARCHITECTURE.md that an observer enforces is a table test
//! below.
//!
//! The executor's side of the contract:
//! - every step starts with the code file read, the pid file read (while no
//!   pid is recorded), the wakes taken and one clock reading;
//! - every probe and every launch-status answer is followed by a fresh read
//!   of the code file, so a verdict is always judged against a code read
//!   after the evidence it rests on;
//! - a signal drops the step's probe (it predates the signal).

use std::time::{Duration, Instant};

use opkernel_shim::{Handback, PidRecord, Signal};

use crate::lifecycle::{KillReason, Outcome};
use crate::wake::Wake;

pub use crate::evidence::{
    evidence_deadline, Clock, CodeFile, Evidence, LaunchEnd, Probe, ProbeView, ShimProcess,
    NOT_STARTED_STATUS,
};

/// How soon to look again while a kill is under way or a code file awaits
/// its wrapper's end.
pub const RECHECK: Duration = Duration::from_millis(100);
/// How often an op whose start Docker did not confirm is looked at.
pub const START_POLL: Duration = Duration::from_millis(250);
/// The longest sleep of a monitored op (its container monitor alarms it).
pub const IDLE: Duration = Duration::from_secs(3600);
/// The shortest wait before a timeout is due.
const MIN_WAIT: Duration = Duration::from_millis(10);

/// The configured durations the decisions use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// TERM → KILL, and KILL → "is anything left?".
    pub kill_grace: Duration,
    /// An unreachable daemon or container makes the op `lost` after this.
    pub grace: Duration,
    /// How long a started op may take to show evidence of itself.
    pub start_evidence: Duration,
}

impl Timing {
    /// The start-evidence window: a start Docker confirmed shows its pid
    /// file within moments; an unconfirmed one may still be queued in the
    /// daemon, so it gets the grace window too.
    pub fn evidence_window(&self, start: Start) -> Duration {
        match start {
            Start::Confirmed => self.start_evidence,
            Start::Unconfirmed => self.start_evidence.max(self.grace),
        }
    }
}

/// Whether Docker confirmed the op's start (the row is `running`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The row is still `starting`: the exec was claimed, but whether it began
    /// is not known yet.
    Unconfirmed,
    /// Docker or the op's own evidence confirmed the start: the row is
    /// `running`.
    Confirmed,
}

/// Where a kill stands in this attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillPhase {
    /// Recorded, no signal sent by this attempt yet.
    Requested,
    /// TERM was sent; KILL follows once the kill grace has passed.
    TermSent {
        /// When this attempt sent the TERM.
        at: Instant,
    },
    /// KILL was sent; after the grace a fresh probe checks whether anything is
    /// left.
    KillSent {
        /// When this attempt last sent a KILL.
        at: Instant,
    },
}

/// A durable kill request as this attempt carries it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kill {
    /// Why the op is killed: a timeout settles `timed_out`, a kill or cancel
    /// `completed` with `killed`.
    pub reason: KillReason,
    /// How far this attempt got through TERM → grace → KILL.
    pub phase: KillPhase,
    /// A signal reached the op's processes (durable: counts across restarts).
    pub signalled: bool,
    /// A signal was about to be sent (durable, written before the first):
    /// a TERM or KILL death after it is the kill's, even when the kernel
    /// died before recording that the signal landed.
    pub intent: bool,
}

impl Kill {
    /// Takes up a recorded kill request: the sequence starts over at TERM,
    /// and a signal sent before a restart still counts.
    pub fn adopt(reason: KillReason, signalled: bool) -> Kill {
        Kill {
            reason,
            phase: KillPhase::Requested,
            signalled,
            intent: signalled,
        }
    }

    /// The request with its recorded intent to signal.
    pub fn with_intent(self, intent: bool) -> Kill {
        Kill {
            intent: self.intent || intent,
            ..self
        }
    }

    /// The kill after `signal` was sent at `at`; `hit` when it reached a process.
    pub fn sent(self, signal: Signal, at: Instant, hit: bool) -> Kill {
        Kill {
            // the kill sequence sends TERM, then KILL; an agent's single
            // signal (SPEC §25) is not a kill and never comes here
            phase: match signal {
                Signal::Kill => KillPhase::KillSent { at },
                _ => KillPhase::TermSent { at },
            },
            signalled: self.signalled || hit,
            intent: true,
            ..self
        }
    }
}

/// An op handed to its container's resident launcher (the inbox), while
/// its start is unconfirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// The request waits for the launcher to claim it until `claim_by`;
    /// after that (or on a kill) the kernel asks for it back.
    Pending {
        /// When the request was filed plus the launcher's claim window
        /// (`launcher_claim`), on this attempt's monotonic clock.
        claim_by: Instant,
    },
    /// The launcher claimed it: it runs there or nowhere. Its pid file is
    /// awaited (by file events, no probe) until the start-evidence deadline.
    Claimed,
    /// The request came back unclaimed (or was never filed): nothing ran,
    /// and nothing will unless the kernel starts it by `docker exec`.
    Returned,
}

impl Handover {
    /// Where the handover stands after asking for the request back: a
    /// claimed request belongs to the launcher (its evidence decides).
    pub fn after_withdraw(handback: Handback) -> Handover {
        match handback {
            Handback::Claimed => Handover::Claimed,
            Handback::Withdrawn | Handback::NeverFiled => Handover::Returned,
        }
    }
}

/// What an attempt carries from step to step.
#[derive(Debug, Clone)]
pub struct State {
    /// Whether the op's start is confirmed (`running`) or still only claimed
    /// (`starting`).
    pub start: Start,
    /// The op's request in its launcher's inbox, while one is in play.
    pub handover: Option<Handover>,
    /// The wrapper's identity, once recorded in the control plane.
    pub pid: Option<PidRecord>,
    /// The kill or timeout request being carried out; `None` while none is
    /// recorded.
    pub kill: Option<Kill>,
    /// Commands run as root: a code file is believed only when the
    /// wrapper's own launch ended with the same code.
    pub root_mode: bool,
    /// The op's timeout, counted from its recorded start.
    pub timeout_at: Instant,
    /// See [`evidence_deadline`].
    pub evidence_by: Instant,
    /// The next safety-net tick of an op no container monitor watches yet.
    pub next_tick: Instant,
    /// Since when probes fail to reach the container.
    pub unreachable_since: Option<Instant>,
    /// The configured grace windows the decisions use.
    pub timing: Timing,
}

impl State {
    /// Notes what a probe says about reachability.
    pub fn observe(&mut self, probe: &Probe, now: Instant) {
        match probe.view {
            ProbeView::Seen { .. } => self.unreachable_since = None,
            ProbeView::Unreachable(_) => {
                self.unreachable_since.get_or_insert(now);
            }
            ProbeView::Gone | ProbeView::Stopped => {}
        }
    }

    /// The outcome of a recorded exit code, given the kill request (only a
    /// signal that reached the command makes it killed or timed out).
    ///
    /// A signal is recorded after it lands, its intent before it is sent:
    /// a kernel that died between the two leaves the code as the witness.
    /// A death by TERM or KILL after the intent is taken as the kill's.
    pub fn outcome_of(&self, code: i32) -> Outcome {
        match self.kill {
            Some(kill) => kill.reason.outcome(
                code,
                kill.signalled || (kill.intent && died_of_kill_signal(code)),
            ),
            None => Outcome::Completed {
                exit_code: code,
                killed: false,
            },
        }
    }
}

/// Whether an exit code says the process died of SIGTERM or SIGKILL (the
/// shim reports a death by signal N as 128 + N).
pub fn died_of_kill_signal(code: i32) -> bool {
    // Linux's numbers (the only platform the shim runs on)
    const SIGKILL: i32 = 9;
    const SIGTERM: i32 = 15;
    code == 128 + SIGTERM || code == 128 + SIGKILL
}

/// What the executor does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The compare-and-set terminal write.
    Settle(Outcome),
    /// Evidence shows the unconfirmed start happened: the row becomes `running`.
    ConfirmStart,
    /// Write the wrapper's pid record, read from its `.pid` file, into the op's
    /// row.
    RecordPid(PidRecord),
    /// Record a timeout kill request (the first recorded reason wins).
    RequestTimeout,
    /// Send `signal` to the op's processes, identity-checked against `rec`.
    Signal {
        /// TERM or KILL.
        signal: Signal,
        /// The wrapper's recorded identity (pid, start ticks, hostname) the
        /// signal must match.
        rec: PidRecord,
    },
    /// Probe the container; `fresh` refuses a cached snapshot.
    Probe {
        /// `true`: take a new probe; a snapshot from the shared cache will not
        /// do.
        fresh: bool,
    },
    /// Ask the backend how the wrapper's launch ended.
    AskLaunchEnd,
    /// Take the op's request back from the launcher's inbox.
    Withdraw,
    /// Start the op by `docker exec` (its request is back, nothing ran).
    LaunchByExec,
    /// Wait for a wake or this long, then gather a new step.
    Wait(Duration),
}

fn lost(reason: impl Into<String>) -> Action {
    Action::Settle(Outcome::Lost {
        reason: reason.into(),
    })
}

/// The next action of an attempt, given its state and this step's evidence.
pub fn next(s: &State, e: &Evidence) -> Action {
    match s.start {
        Start::Unconfirmed => next_unconfirmed(s, e),
        Start::Confirmed => next_confirmed(s, e),
    }
}

/// A claimed op whose start Docker did not confirm: any file or marked
/// process confirms it; none by the evidence deadline makes it `lost`
/// (Docker may still run a queued start, so "nothing ran" would be a
/// guess). Never launched again.
fn next_unconfirmed(s: &State, e: &Evidence) -> Action {
    if e.code != CodeFile::Missing || e.pid_file.is_some() {
        return Action::ConfirmStart;
    }
    match s.handover {
        // the launcher's claim shows as the pid file within moments; no
        // probe (a docker exec) is spent while it may still come
        Some(Handover::Pending { claim_by }) if s.kill.is_none() && e.now < claim_by => {
            return Action::Wait(claim_by - e.now);
        }
        Some(Handover::Pending { .. }) => return Action::Withdraw,
        Some(Handover::Returned) if s.kill.is_some() => {
            return Action::Settle(Outcome::Failed {
                error: "cancelled before start".into(),
                killed: true,
            })
        }
        Some(Handover::Returned) => return Action::LaunchByExec,
        // a live launcher claimed it: its pid file comes by file events; a
        // probe (a docker exec per op) would add load and no evidence
        Some(Handover::Claimed) if e.now < s.evidence_by => {
            return Action::Wait(s.evidence_by - e.now);
        }
        Some(Handover::Claimed) | None => {}
    }
    match &e.probe {
        None => return Action::Probe { fresh: true },
        Some(Probe {
            view: ProbeView::Seen { marked: true, .. },
            ..
        }) => return Action::ConfirmStart,
        Some(_) => {}
    }
    if e.now >= s.evidence_by {
        return lost(format!(
            "the start of the command was not confirmed: no pid file, exit code or process of it \
             appeared within {}s of its launch (it may still have run)",
            s.timing.evidence_window(Start::Unconfirmed).as_secs()
        ));
    }
    Action::Wait(START_POLL)
}

/// A started op: a recorded result first, then the pid record, the
/// timeout, the kill sequence and the liveness safety net.
fn next_confirmed(s: &State, e: &Evidence) -> Action {
    let look_again_soon = match judge_code(s, e) {
        Judged::Act(action) => return action,
        Judged::LookAgainSoon => true,
        Judged::Nothing => false,
    };
    // root mode: a recorded code awaits its launch's end; it beats any
    // "vanished" verdict meanwhile (a recorded result beats the container)
    let code_pending =
        look_again_soon && matches!(e.code, CodeFile::Recorded(_) | CodeFile::NotStarted(_));
    if let (None, Some(rec)) = (&s.pid, &e.pid_file) {
        return Action::RecordPid(rec.clone());
    }
    if s.kill.is_none() && e.now >= s.timeout_at {
        return Action::RequestTimeout;
    }
    if let Some(action) = s.kill.and_then(|kill| step_kill(s, kill, e, code_pending)) {
        return action;
    }
    if let Some(action) = check_liveness(s, e, code_pending) {
        return action;
    }
    Action::Wait(wait_for(s, e, look_again_soon))
}

enum Judged {
    Act(Action),
    LookAgainSoon,
    Nothing,
}

/// A recorded result beats the container; an unusable one counts only
/// once its wrapper is proven gone.
fn judge_code(s: &State, e: &Evidence) -> Judged {
    match &e.code {
        CodeFile::Missing => Judged::Nothing,
        CodeFile::Recorded(code) if !s.root_mode => {
            Judged::Act(Action::Settle(s.outcome_of(*code)))
        }
        CodeFile::Recorded(code) => judge_root_result(
            s,
            e,
            i64::from(*code),
            s.outcome_of(*code),
            &format!("the exit code file's {code}"),
        ),
        CodeFile::NotStarted(why) => {
            let failed = Outcome::Failed {
                error: format!("the command was not started: {why}"),
                killed: false,
            };
            if s.root_mode {
                judge_root_result(s, e, NOT_STARTED_STATUS, failed, "its not-started record")
            } else {
                Judged::Act(Action::Settle(failed))
            }
        }
        CodeFile::Unusable(bad) => match wrapper_gone(s, e) {
            Err(probe) => Judged::Act(probe),
            Ok(true) => Judged::Act(lost(format!("exit code unusable: {bad}"))),
            Ok(false) => Judged::Nothing,
        },
    }
}

/// Root mode: the `.ops` dir is within the command's reach. A result next
/// to a live wrapper is ignored; once the wrapper is gone, the result is
/// believed only if the wrapper's launch exited with the matching status
/// (`status`: the code, or 125 for a launch that started nothing).
fn judge_root_result(s: &State, e: &Evidence, status: i64, outcome: Outcome, what: &str) -> Judged {
    if s.pid.is_some() {
        match wrapper_gone(s, e) {
            Err(probe) => return Judged::Act(probe),
            Ok(false) => return Judged::LookAgainSoon,
            Ok(true) => {}
        }
    }
    let forgeable = "commands run as root can forge it";
    match &e.launch_end {
        None => Judged::Act(Action::AskLaunchEnd),
        Some(LaunchEnd::Exited(ended)) if *ended == status => Judged::Act(Action::Settle(outcome)),
        Some(LaunchEnd::Running | LaunchEnd::Unreachable) => Judged::LookAgainSoon,
        Some(LaunchEnd::Exited(ended)) => Judged::Act(lost(format!(
            "the wrapper did not end normally (its exec exited {ended}); {what} is not believed"
        ))),
        Some(LaunchEnd::NotRecorded) => Judged::Act(lost(format!(
            "{what} cannot be confirmed: the wrapper's end is unknown (no exec recorded); \
             {forgeable}"
        ))),
        Some(LaunchEnd::Unconfirmable(why)) => Judged::Act(lost(format!(
            "{what} cannot be confirmed: the wrapper's end is unknown ({why}); {forgeable}"
        ))),
    }
}

/// Whether a fresh probe proves the identity-checked wrapper gone. `Ok(false)`
/// when it lives, no pid is recorded, or the probe failed (not proof);
/// `Err(action)` when a fresh probe must be taken first.
fn wrapper_gone(s: &State, e: &Evidence) -> Result<bool, Action> {
    if s.pid.is_none() {
        return Ok(false);
    }
    match &e.probe {
        Some(Probe { fresh: true, view }) => Ok(matches!(
            view,
            ProbeView::Seen {
                shim: ShimProcess::Absent | ShimProcess::PidReused,
                ..
            }
        )),
        _ => Err(Action::Probe { fresh: true }),
    }
}

/// One step of TERM → grace → KILL (→ grace → KILL again while the
/// wrapper lives). Nothing is signalled before the wrapper recorded itself.
fn step_kill(s: &State, kill: Kill, e: &Evidence, code_pending: bool) -> Option<Action> {
    let vanished = |reason: &str| (!code_pending).then(|| lost(reason));
    let Some(rec) = &s.pid else {
        return (e.now > s.evidence_by)
            .then(|| vanished("killed before the op recorded its process"))
            .flatten();
    };
    let signal = |signal| Action::Signal {
        signal,
        rec: rec.clone(),
    };
    // at least one recheck between signals, even with a zero kill grace
    let grace = s.timing.kill_grace.max(RECHECK);
    let grace_over = |at: Instant| e.now.saturating_duration_since(at) >= grace;
    match kill.phase {
        KillPhase::Requested => Some(signal(Signal::Term)),
        KillPhase::TermSent { at } if grace_over(at) => Some(signal(Signal::Kill)),
        KillPhase::KillSent { at } if grace_over(at) => match wrapper_gone(s, e) {
            Err(probe) => Some(probe),
            Ok(true) => vanished("the process vanished without an exit code while being killed"),
            Ok(false) => Some(signal(Signal::Kill)),
        },
        _ => None,
    }
}

/// The safety net, on a monitor's alarm or an unmonitored op's tick: a
/// cached probe first, a fresh one before any verdict of death.
fn check_liveness(s: &State, e: &Evidence, code_pending: bool) -> Option<Action> {
    if !(e.wakes.has(Wake::Alarm) || e.tick) {
        return None;
    }
    let vanished = |reason: &str| (!code_pending).then(|| lost(reason));
    let Some(probe) = &e.probe else {
        return Some(Action::Probe { fresh: false });
    };
    match (&probe.view, &s.pid) {
        (ProbeView::Seen { marked: true, .. }, None) => None,
        (ProbeView::Seen { .. }, None) if !probe.fresh => Some(Action::Probe { fresh: true }),
        (ProbeView::Seen { .. }, None) => (e.now > s.evidence_by)
            .then(|| vanished("the process vanished before recording itself"))
            .flatten(),
        (ProbeView::Seen { shim: wrapper, .. }, Some(_)) => match wrapper {
            ShimProcess::Alive => None,
            // a probe taken before the pid was recorded says nothing of it
            ShimProcess::Unknown => Some(Action::Probe { fresh: true }),
            _ if !probe.fresh => Some(Action::Probe { fresh: true }),
            ShimProcess::PidReused => vanished(
                "the process vanished without an exit code (its pid now belongs to another process)",
            ),
            ShimProcess::Absent => vanished("the process vanished without an exit code"),
        },
        (ProbeView::Gone, _) => Some(lost("the container was removed")),
        (ProbeView::Stopped, _) => Some(lost("the container stopped")),
        (ProbeView::Unreachable(_), _) => {
            let since = s.unreachable_since.unwrap_or(e.now);
            (e.now.saturating_duration_since(since) >= s.timing.grace).then(|| {
                lost(format!(
                    "container unreachable for {}s",
                    s.timing.grace.as_secs()
                ))
            })
        }
    }
}

/// How long to sleep: a monitored op until its monitor or a file wakes
/// it, an unmonitored one until its next tick; never past the timeout, and
/// briefly while a kill is under way or a code awaits its wrapper's end.
fn wait_for(s: &State, e: &Evidence, look_again_soon: bool) -> Duration {
    let mut until = match s.pid {
        Some(_) => e.now + IDLE,
        None => s.next_tick,
    };
    if s.kill.is_some() || look_again_soon {
        until = until.min(e.now + RECHECK);
    } else {
        until = until.min(s.timeout_at.max(e.now + MIN_WAIT));
    }
    until.saturating_duration_since(e.now)
}

/// How Docker answered the one launch of an op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchVerdict {
    /// It started: the row becomes `running`.
    Started,
    /// The container vanished under the cached registry entry: no exec
    /// exists, so nothing ran; ensure the container afresh and launch once more.
    StaleContainer,
    /// The engine said no: nothing ran (`failed`).
    Refused(String),
    /// Whether it started is unknown: the evidence decides, never a guess.
    Unknown,
}

/// An unclaimed op before its launch: a kill recorded before the exec
/// claim wins, and the op ends `failed` (nothing ran) with `killed`.
pub fn cancelled_before_start(claimed: bool, kill_requested: bool) -> Option<Outcome> {
    (!claimed && kill_requested).then(|| Outcome::Failed {
        error: "cancelled before start".into(),
        killed: true,
    })
}

/// Facts about the container an op's row names, as inspected at attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerFacts {
    /// Managed label, this home's scratch mount, the op's run and scratch key.
    pub identity_matches: bool,
    /// The container's hostname, matched against the pid file's (empty when
    /// unknown: no check).
    pub hostname: String,
}

/// Whether the recorded container still is the op's; `Some(outcome)` when not.
pub fn judge_container(c: &ContainerFacts, pid: Option<&PidRecord>) -> Option<Outcome> {
    if !c.identity_matches {
        return Some(Outcome::Lost {
            reason: "the recorded container's identity cannot be confirmed".into(),
        });
    }
    let foreign_pid = pid.is_some_and(|rec| {
        !c.hostname.is_empty() && !rec.hostname.is_empty() && rec.hostname != c.hostname
    });
    foreign_pid.then(|| Outcome::Lost {
        reason: "the pid file belongs to another container".into(),
    })
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
