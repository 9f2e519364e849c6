//! What one step of an observer attempt found, as the pure decision core
//! (`decide.rs`) reads it: the op's `.code` file, a probe's view of its
//! wrapper and container, how its launch ended, the step's wakes and
//! clock reading.

use std::time::{Duration, Instant};

use opkernel_shim::PidRecord;

use crate::wake::Wakes;

/// The op's `.code` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodeFile {
    /// No code yet: the command still runs, or died before writing one.
    Missing,
    /// The command's exit code, parsed strictly from the file.
    Recorded(i32),
    /// The shim could not start the command (nothing ran): `failed`.
    NotStarted(String),
    /// Empty, partial or garbage: settles nothing while the wrapper lives.
    Unusable(String),
}

/// The exit status of a shim launch that did not start its command.
pub const NOT_STARTED_STATUS: i64 = 125;

/// A probe's view of the op's wrapper (identity-checked by pid, start time
/// and marker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShimProcess {
    /// The recorded pid runs with the recorded start time and the op's marker.
    Alive,
    /// No process has the recorded pid any more.
    Absent,
    /// The recorded pid belongs to another process now.
    PidReused,
    /// No pid is recorded: there is no identity to check.
    Unknown,
}

/// What a probe of the op's container saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeView {
    /// The container runs and its process table was read.
    Seen {
        /// The op's wrapper, checked against its recorded identity.
        shim: ShimProcess,
        /// Some process carries the op's marker.
        marked: bool,
    },
    /// The container no longer exists.
    Gone,
    /// The container exists but is not running.
    Stopped,
    /// The daemon or container did not answer (or answered garbage).
    Unreachable(String),
}

/// One probe's answer for this step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// What the probe saw.
    pub view: ProbeView,
    /// Taken for this question, not served from the shared cache.
    pub fresh: bool,
}

/// How the wrapper's own launch ended, as the backend (out of the
/// command's reach) records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchEnd {
    /// The wrapper's exec is still running.
    Running,
    /// The exec ended with this status (the command's code, or 125: nothing
    /// started).
    Exited(i64),
    /// The daemon did not answer the question; ask again later.
    Unreachable,
    /// No launch id was recorded for the op.
    NotRecorded,
    /// The backend cannot tell (e.g. Docker dropped the exec record); why.
    Unconfirmable(String),
}

/// What one step of an attempt found.
#[derive(Debug, Clone)]
pub struct Evidence {
    /// This step's one clock reading.
    pub now: Instant,
    /// The wakes taken at the start of the step (file events, alarms, kill
    /// requests).
    pub wakes: Wakes,
    /// The safety-net tick of an unmonitored op fell due in this step.
    pub tick: bool,
    /// The `.code` file, read at the start of the step and again after each
    /// probe.
    pub code: CodeFile,
    /// The `.pid` file, read while no pid is recorded.
    pub pid_file: Option<PidRecord>,
    /// A probe of the container, when the previous action asked for one.
    pub probe: Option<Probe>,
    /// How the wrapper's launch ended, when the previous action asked.
    pub launch_end: Option<LaunchEnd>,
}

impl Evidence {
    /// The cheap facts of a step; probes and launch ends come on request.
    pub fn new(now: Instant, wakes: Wakes, code: CodeFile) -> Evidence {
        Evidence {
            now,
            wakes,
            tick: false,
            code,
            pid_file: None,
            probe: None,
            launch_end: None,
        }
    }
}

/// One reading of both clocks, taken once per supervision of an op and
/// carried forward to each attempt on the monotonic clock ([`Clock::at`]):
/// wall-clock times of the control plane become monotonic instants through
/// it, so a later step of the wall clock moves no deadline, not even for
/// an attempt that starts after the step.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// The wall-clock reading, in milliseconds since the Unix epoch.
    pub wall_ms: i64,
    /// The monotonic instant of the same reading.
    pub mono: Instant,
}

impl Clock {
    /// This reading carried forward on the monotonic clock to `now`: the
    /// same mapping of wall-clock times to instants, with `now` as the
    /// reading's moment (whatever the wall clock did since).
    pub fn at(&self, now: Instant) -> Clock {
        let since = now.saturating_duration_since(self.mono).as_millis();
        Clock {
            wall_ms: self
                .wall_ms
                .saturating_add(since.min(i64::MAX as u128) as i64),
            mono: now,
        }
    }

    /// The monotonic instant of a wall-clock time.
    pub fn instant(&self, wall_ms: i64) -> Instant {
        let delta = Duration::from_millis(wall_ms.abs_diff(self.wall_ms));
        if wall_ms >= self.wall_ms {
            self.mono + delta
        } else {
            self.mono.checked_sub(delta).unwrap_or(self.mono)
        }
    }
}

/// The one start-evidence rule: an op must show evidence of itself (pid
/// file, code file or a marked process) within `window` of the later of
/// its exec claim and the moment this attempt began watching. No attempt
/// concludes "no evidence" without having watched a full window itself: a
/// start request may have taken up to the Docker timeout to fail, and a
/// restarted kernel missed the file events of its downtime.
pub fn evidence_deadline(clock: &Clock, claimed_ms: i64, window: Duration) -> Instant {
    clock.instant(claimed_ms).max(clock.mono) + window
}
