//! The op lifecycle as pure data: statuses, the one definition of
//! "terminal" (shared with SQL), and the outcomes an observer may settle.

use serde::{Deserialize, Serialize};

/// An op's status in the control plane (SPEC §4), stored as text
/// (`as_str`/`parse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Admitted, held for an operator's decision (SPEC §16): nothing is
    /// claimed or executed, no observer runs.
    AwaitingApproval,
    /// Admitted and to be launched by its observer; that the command began is
    /// not yet confirmed.
    Starting,
    /// Docker or the op's own evidence confirmed that the command started.
    Running,
    /// The command ended with an exit code (killed ops too, flagged `killed`).
    Completed,
    /// The op's timeout passed and the kernel signalled the command.
    TimedOut,
    /// The process vanished without a code or stayed unobservable past the
    /// grace window (effect uncertain).
    Lost,
    /// Could not be started: nothing ran.
    Failed,
    /// Refused by the operator, by the approval timeout or by a kill before
    /// approval: nothing ran.
    Denied,
}

impl std::fmt::Display for Status {
    /// The status as on the wire (padding honoured).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl Status {
    /// Every status, in lifecycle order.
    pub const ALL: [Status; 8] = [
        Status::AwaitingApproval,
        Status::Starting,
        Status::Running,
        Status::Completed,
        Status::TimedOut,
        Status::Lost,
        Status::Failed,
        Status::Denied,
    ];
    /// The absorbing statuses. Every SQL statement that needs them uses
    /// [`terminal_sql`], [`live_sql`] or [`observed_sql`], built from this list.
    pub const TERMINAL: [Status; 5] = [
        Status::Completed,
        Status::TimedOut,
        Status::Lost,
        Status::Failed,
        Status::Denied,
    ];

    /// The status as stored in SQL and sent on the wire (`snake_case`).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::AwaitingApproval => "awaiting_approval",
            Status::Starting => "starting",
            Status::Running => "running",
            Status::Completed => "completed",
            Status::TimedOut => "timed_out",
            Status::Lost => "lost",
            Status::Failed => "failed",
            Status::Denied => "denied",
        }
    }

    /// The status of a stored string; `None` for an unknown one.
    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether the status is absorbing (one of [`Status::TERMINAL`]).
    pub fn is_terminal(self) -> bool {
        Status::TERMINAL.contains(&self)
    }

    /// Whether an observer watches the op in this status (it may have run).
    pub fn is_observed(self) -> bool {
        matches!(self, Status::Starting | Status::Running)
    }

    /// Whether the lifecycle allows moving from `self` to `next`.
    pub fn can_become(self, next: Status) -> bool {
        match (self, next) {
            (Status::AwaitingApproval, n) => matches!(n, Status::Starting | Status::Denied),
            (Status::Starting, Status::Running) => true,
            // denied means nothing ran: only a waiting op can be denied
            (Status::Starting | Status::Running, Status::Denied) => false,
            (Status::Starting | Status::Running, n) => n.is_terminal(),
            _ => false,
        }
    }
}

fn sql_list(statuses: impl Iterator<Item = Status>) -> String {
    statuses
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(",")
}

/// `'completed','timed_out','lost','failed'` for `status IN (...)`.
pub fn terminal_sql() -> String {
    sql_list(Status::TERMINAL.into_iter())
}

/// `'awaiting_approval','starting','running'` (every status that is not
/// terminal) for `status IN (...)`.
pub fn live_sql() -> String {
    sql_list(Status::ALL.into_iter().filter(|s| !s.is_terminal()))
}

/// `'starting','running'`: the statuses an observer watches (and settles
/// from) for `status IN (...)`.
pub fn observed_sql() -> String {
    sql_list(Status::ALL.into_iter().filter(|s| s.is_observed()))
}

/// The effect of a lost op: the command may or may not have done its work.
pub const EFFECT_UNCERTAIN: &str = "uncertain";

/// What an observer settles an op with: written by compare-and-set on a
/// non-terminal row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The command ended on its own or on a kill (`killed`: a signal reached it).
    Completed {
        /// The command's own exit code (143 or 137 after a TERM or KILL).
        exit_code: i32,
        /// A kill's signal reached the command.
        killed: bool,
    },
    /// The deadline passed and the kernel signalled the command. Its effect
    /// is uncertain: it was cut off mid-work.
    TimedOut {
        /// The code the command ended with; `None` when none was recorded.
        exit_code: Option<i32>,
        /// A signal reached the command.
        killed: bool,
    },
    /// The process vanished without a code, or could not be observed.
    Lost {
        /// Why, as the report shows it (`lost: <reason>`).
        reason: String,
    },
    /// Nothing ran: Docker said no, or a kill came before the exec.
    Failed {
        /// Why nothing ran, as the report shows it.
        error: String,
        /// A kill came before the exec (`cancelled before start`).
        killed: bool,
    },
}

impl Outcome {
    /// The terminal status this outcome writes.
    pub fn status(&self) -> Status {
        match self {
            Outcome::Completed { .. } => Status::Completed,
            Outcome::TimedOut { .. } => Status::TimedOut,
            Outcome::Lost { .. } => Status::Lost,
            Outcome::Failed { .. } => Status::Failed,
        }
    }
}

/// Why the kernel is signalling an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// A `kill_operation` by the agent or an operator.
    Kill,
    /// The op's timeout passed.
    Timeout,
    /// The op's run (or an ancestor) was cancelled: a kill like any other.
    Cancel,
}

impl KillReason {
    /// The reason as stored with the op's kill request.
    pub fn as_str(self) -> &'static str {
        match self {
            KillReason::Kill => "kill",
            KillReason::Timeout => "timeout",
            KillReason::Cancel => "cancel",
        }
    }

    /// The reason of a stored string; `None` for an unknown one.
    pub fn parse(s: &str) -> Option<KillReason> {
        match s {
            "kill" => Some(KillReason::Kill),
            "timeout" => Some(KillReason::Timeout),
            "cancel" => Some(KillReason::Cancel),
            _ => None,
        }
    }

    /// The outcome of an op with a kill request once its exit code is
    /// known. Only a signal that reached the command makes it killed or
    /// timed out: a command that ended on its own before any signal (a
    /// deadline racing a natural exit) completed with its own code.
    pub fn outcome(self, exit_code: i32, signalled: bool) -> Outcome {
        match (self, signalled) {
            (_, false) => Outcome::Completed {
                exit_code,
                killed: false,
            },
            (KillReason::Kill | KillReason::Cancel, true) => Outcome::Completed {
                exit_code,
                killed: true,
            },
            (KillReason::Timeout, true) => Outcome::TimedOut {
                exit_code: Some(exit_code),
                killed: true,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_strings_round_trip() {
        for s in Status::ALL {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert_eq!(Status::parse("done"), None);
    }

    #[test]
    fn terminal_statuses_are_absorbing() {
        for from in Status::TERMINAL {
            for to in Status::ALL {
                assert!(!from.can_become(to), "{from:?} -> {to:?}");
            }
        }
    }

    #[test]
    fn live_statuses_move_forward_only() {
        assert!(Status::Starting.can_become(Status::Running));
        assert!(!Status::Running.can_become(Status::Starting));
        assert!(!Status::Running.can_become(Status::Running));
        assert!(!Status::Starting.can_become(Status::AwaitingApproval));
        for t in Status::TERMINAL
            .into_iter()
            .filter(|t| *t != Status::Denied)
        {
            assert!(Status::Starting.can_become(t));
            assert!(Status::Running.can_become(t));
        }
    }

    #[test]
    fn sql_lists_follow_the_rust_definition() {
        assert_eq!(
            terminal_sql(),
            "'completed','timed_out','lost','failed','denied'"
        );
        assert_eq!(live_sql(), "'awaiting_approval','starting','running'");
        assert_eq!(observed_sql(), "'starting','running'");
    }

    #[test]
    fn a_waiting_op_starts_or_is_denied_and_only_it_can_be_denied() {
        assert!(Status::AwaitingApproval.can_become(Status::Starting));
        assert!(Status::AwaitingApproval.can_become(Status::Denied));
        assert!(!Status::AwaitingApproval.can_become(Status::Completed));
        assert!(!Status::AwaitingApproval.can_become(Status::Running));
        assert!(!Status::Starting.can_become(Status::Denied));
        assert!(!Status::Running.can_become(Status::Denied));
        assert!(!Status::AwaitingApproval.is_observed());
    }

    #[test]
    fn kill_outcomes() {
        assert_eq!(
            KillReason::Kill.outcome(143, true),
            Outcome::Completed {
                exit_code: 143,
                killed: true
            }
        );
        assert_eq!(
            KillReason::Timeout.outcome(137, true),
            Outcome::TimedOut {
                exit_code: Some(137),
                killed: true
            }
        );
        // a deadline racing a natural exit: nothing was signalled
        assert_eq!(
            KillReason::Timeout.outcome(0, false),
            Outcome::Completed {
                exit_code: 0,
                killed: false
            }
        );
        assert_eq!(
            KillReason::Kill.outcome(0, false),
            Outcome::Completed {
                exit_code: 0,
                killed: false
            }
        );
        assert_eq!(Outcome::Lost { reason: "x".into() }.status(), Status::Lost);
    }
}
