//! Runs as durable tasks, as pure data (SPEC §14): run states and their
//! transitions, the envelope a run may act within, budgets and the usage
//! totals they are checked against. No I/O here: the store applies these
//! rules inside its transactions, the API maps their refusals to errors.

use serde::{Deserialize, Serialize};

use crate::envelope::{invalid, wider};
pub use crate::envelope::{
    ApprovalRules, Envelope, EnvelopeError, EnvelopeRequest, OnTimeout, Runtime,
    DEFAULT_MAX_CHILDREN,
};

/// The state of a run. `completed` and `cancelled` are absorbing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Ops are admitted.
    Active,
    /// No new op is admitted; running ops go on.
    Paused,
    /// Ended by an explicit `complete` with a summary (absorbing).
    Completed,
    /// Every live op of the run and its descendants is killed, nothing new is
    /// admitted (absorbing).
    Cancelled,
}

impl RunState {
    /// Every state, in lifecycle order.
    pub const ALL: [RunState; 4] = [
        RunState::Active,
        RunState::Paused,
        RunState::Completed,
        RunState::Cancelled,
    ];

    /// The state as stored in SQL and sent on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Active => "active",
            RunState::Paused => "paused",
            RunState::Completed => "completed",
            RunState::Cancelled => "cancelled",
        }
    }

    /// The state of a stored string; `None` for an unknown one.
    pub fn parse(s: &str) -> Option<RunState> {
        RunState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether the state is absorbing (`completed` or `cancelled`).
    pub fn is_final(self) -> bool {
        matches!(self, RunState::Completed | RunState::Cancelled)
    }
}

/// A requested change of a run's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunAction {
    /// Stop admitting new ops (`POST .../pause`).
    Pause,
    /// Admit ops again after a pause (`POST .../resume`).
    Resume,
    /// End the run with a summary (`POST .../complete`).
    Complete,
    /// Kill the run's and its descendants' live ops and end it (`POST
    /// .../cancel`).
    Cancel,
}

impl RunAction {
    /// The action's name, as in its endpoint and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            RunAction::Pause => "pause",
            RunAction::Resume => "resume",
            RunAction::Complete => "complete",
            RunAction::Cancel => "cancel",
        }
    }

    /// The state the action leads to.
    pub fn target(self) -> RunState {
        match self {
            RunAction::Pause => RunState::Paused,
            RunAction::Resume => RunState::Active,
            RunAction::Complete => RunState::Completed,
            RunAction::Cancel => RunState::Cancelled,
        }
    }
}

/// What an action does to a run in a given state: the one transition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The state changes (compare-and-set from `from`), with its event.
    Change {
        /// The state the compare-and-set expects.
        from: RunState,
        /// The state it writes.
        to: RunState,
    },
    /// Already there: nothing changes, no event (a retried call succeeds).
    Already,
    /// Not allowed from this state: the run is over.
    Refused(RunState),
    /// A pause placed by someone above the current pauser: the run stays
    /// paused and the pause of record becomes theirs (event `run.paused`).
    TakeOver,
    /// A resume by someone below whoever paused the run: refused.
    PausedAbove,
}

/// What `action` does to a run in `state`, ignoring who paused it (see
/// [`transition_by`]).
pub fn transition(state: RunState, action: RunAction) -> Transition {
    use RunAction as A;
    use RunState as S;
    match (state, action) {
        (S::Active, A::Pause) => Transition::Change {
            from: S::Active,
            to: S::Paused,
        },
        (S::Paused, A::Resume) => Transition::Change {
            from: S::Paused,
            to: S::Active,
        },
        (S::Active | S::Paused, A::Complete | A::Cancel) => Transition::Change {
            from: state,
            to: action.target(),
        },
        (S::Paused, A::Pause) | (S::Active, A::Resume) => Transition::Already,
        (S::Completed, A::Complete) | (S::Cancelled, A::Cancel) => Transition::Already,
        (S::Completed | S::Cancelled, _) => Transition::Refused(state),
    }
}

/// How high a principal stands over a run, for pauses: 0 is the operator,
/// then the run's root, down to the run itself (`chain` is the run's
/// ancestors, root first). A principal off the chain stands lowest.
pub fn pause_rank(principal: &str, chain: &[String], run_id: &str) -> usize {
    if principal == "operator" {
        return 0;
    }
    let Some(run) = principal.strip_prefix("run:") else {
        return usize::MAX;
    };
    chain
        .iter()
        .map(String::as_str)
        .chain(std::iter::once(run_id))
        .position(|r| r == run)
        .map_or(usize::MAX, |i| i + 1)
}

/// The transition table with the pause of record: the highest pauser's.
/// `by` and `pauser` are [`pause_rank`]s (`pauser`: of whoever paused the
/// run, `None` when nobody is recorded). A pause from above a paused
/// run's pauser takes the pause over; a resume needs that level or above.
pub fn transition_by(
    state: RunState,
    action: RunAction,
    by: usize,
    pauser: Option<usize>,
) -> Transition {
    match (state, action, pauser) {
        (RunState::Paused, RunAction::Pause, Some(p)) if by < p => Transition::TakeOver,
        (RunState::Paused, RunAction::Resume, Some(p)) if by > p => Transition::PausedAbove,
        _ => transition(state, action),
    }
}

/// A child run's id: `<parent>.<name>`, in its parent's namespace, so a
/// run token can never take an id the operator (or another tree) may use.
/// A name already in that namespace is kept as it is, so a retry may send
/// either form.
pub fn child_run_id(parent: &str, name: &str) -> String {
    match name
        .strip_prefix(parent)
        .and_then(|rest| rest.strip_prefix('.'))
    {
        Some(rest) if !rest.is_empty() => name.to_owned(),
        _ => format!("{parent}.{name}"),
    }
}

/// The budget limits of a run, any subset. `tokens` counts input + output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Limit on op wall time, in seconds (each op from its start to its end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op_seconds: Option<u64>,
    /// Limit on CPU time of the ops' process trees, in seconds (the shim's
    /// rusage).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<u64>,
    /// Limit on model tokens, input plus output, as the agent runtime reports
    /// them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Limit on model cost, in millionths of the currency unit, as the agent
    /// runtime reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_micros: Option<u64>,
}

/// The four budget limits, in the order messages and views list them.
pub const LIMITS: [&str; 4] = ["op_seconds", "cpu_seconds", "tokens", "cost_micros"];

/// Upper bound of any budget limit or usage amount: sums of many stay far
/// from overflowing SQLite's 64-bit integers.
pub const MAX_AMOUNT: u64 = 1 << 48;

impl Budget {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        self.limits().iter().all(|(_, l)| l.is_none())
    }

    /// `(name, limit)` for each of [`LIMITS`].
    pub fn limits(&self) -> [(&'static str, Option<u64>); 4] {
        [
            ("op_seconds", self.op_seconds),
            ("cpu_seconds", self.cpu_seconds),
            ("tokens", self.tokens),
            ("cost_micros", self.cost_micros),
        ]
    }

    /// Checks each limit on its own (at most [`MAX_AMOUNT`]).
    pub fn validate(&self) -> Result<(), EnvelopeError> {
        for (name, limit) in self.limits() {
            if limit.is_some_and(|l| l > MAX_AMOUNT) {
                return Err(invalid(format!(
                    "budget {name} must be at most {MAX_AMOUNT}"
                )));
            }
        }
        Ok(())
    }

    /// Checks a child's budget against the tightest limit of each kind on
    /// its parent's chain (the parent's own or an ancestor's).
    pub fn narrow(&self, tightest: &Budget) -> Result<(), EnvelopeError> {
        self.validate()?;
        for ((name, asked), (_, allowed)) in self.limits().into_iter().zip(tightest.limits()) {
            if let (Some(asked), Some(allowed)) = (asked, allowed) {
                if asked > allowed {
                    return Err(wider(name, asked, allowed));
                }
            }
        }
        Ok(())
    }

    /// The tighter limit of each kind.
    pub fn tightest(&self, other: &Budget) -> Budget {
        let min = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Budget {
            op_seconds: min(self.op_seconds, other.op_seconds),
            cpu_seconds: min(self.cpu_seconds, other.cpu_seconds),
            tokens: min(self.tokens, other.tokens),
            cost_micros: min(self.cost_micros, other.cost_micros),
        }
    }
}

/// Totals of the usage ledger over a set of runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Used {
    /// Op wall time, in milliseconds.
    pub op_ms: u64,
    /// CPU time of the ops' process trees, in milliseconds.
    pub cpu_ms: u64,
    /// Model tokens, input plus output.
    pub tokens: u64,
    /// Model cost, in millionths of the currency unit.
    pub cost_micros: u64,
    /// Connections through the egress proxy (SPEC §27).
    pub net_connections: u64,
    /// Bytes the egress proxy brought in to the run's containers.
    pub net_bytes_in: u64,
    /// Bytes the egress proxy sent out for them.
    pub net_bytes_out: u64,
}

impl Used {
    /// Used amounts keyed by the limit names (seconds with millisecond
    /// precision).
    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "op_seconds": self.op_ms as f64 / 1000.0,
            "cpu_seconds": self.cpu_ms as f64 / 1000.0,
            "tokens": self.tokens,
            "cost_micros": self.cost_micros,
            "net_connections": self.net_connections,
            "net_bytes_in": self.net_bytes_in,
            "net_bytes_out": self.net_bytes_out,
        })
    }

    /// `(name, used, limit)` of each limit the budget sets.
    pub fn amounts(self, budget: &Budget) -> Vec<(&'static str, f64, u64)> {
        self.against(budget)
            .into_iter()
            .map(|(name, used, limit, _)| (name, used, limit))
            .collect()
    }

    /// `(name, used, limit, reached)` of each limit the budget sets, in
    /// units of the limit (milliseconds compared as such, so a limit is
    /// reached exactly).
    fn against(self, budget: &Budget) -> Vec<(&'static str, f64, u64, bool)> {
        budget
            .limits()
            .into_iter()
            .filter_map(|(name, limit)| {
                let limit = limit?;
                let (used, reached) = match name {
                    "op_seconds" => (
                        self.op_ms as f64 / 1000.0,
                        self.op_ms >= limit.saturating_mul(1000),
                    ),
                    "cpu_seconds" => (
                        self.cpu_ms as f64 / 1000.0,
                        self.cpu_ms >= limit.saturating_mul(1000),
                    ),
                    "tokens" => (self.tokens as f64, self.tokens >= limit),
                    _ => (self.cost_micros as f64, self.cost_micros >= limit),
                };
                Some((name, used, limit, reached))
            })
            .collect()
    }

    /// Remaining of each limit the budget sets (never below zero).
    pub fn remaining(self, budget: &Budget) -> serde_json::Value {
        let map = self
            .against(budget)
            .into_iter()
            .map(|(name, used, limit, _)| {
                let left = (limit as f64 - used).max(0.0);
                let left = if name.ends_with("_seconds") {
                    serde_json::json!((left * 1000.0).round() / 1000.0)
                } else {
                    serde_json::json!(left as u64)
                };
                (name.to_owned(), left)
            })
            .collect::<serde_json::Map<_, _>>();
        serde_json::Value::Object(map)
    }

    /// The first limit of `budget` this usage has reached, if any.
    pub fn exhausted(self, budget: &Budget) -> Option<LimitUse> {
        self.against(budget)
            .into_iter()
            .find(|(_, _, _, reached)| *reached)
            .map(|(limit, used, max, _)| LimitUse {
                limit,
                used,
                max,
                run_id: String::new(),
            })
    }

    /// `op_seconds 12.3/600, tokens 1200/100000` for the limits set.
    pub fn summary(self, budget: &Budget) -> String {
        self.against(budget)
            .into_iter()
            .map(|(name, used, limit, _)| format!("{name} {}/{limit}", trim_amount(used)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The `Budget:` line that ends a report: per limit, used, the limit and
/// what is left (naming the ancestor whose budget it is when not the run's
/// own). `None` when no budget applies.
pub fn budget_line(run_id: &str, status: &[LimitUse]) -> Option<String> {
    if status.is_empty() {
        return None;
    }
    let parts: Vec<String> = status
        .iter()
        .map(|b| {
            let left = (b.max as f64 - b.used).max(0.0);
            let owner = if b.run_id == run_id {
                String::new()
            } else {
                format!(", budget of run {}", b.run_id)
            };
            format!(
                "{} {}/{} used ({} left{owner})",
                b.limit,
                trim_amount(b.used),
                b.max,
                trim_amount(left)
            )
        })
        .collect();
    Some(format!("Budget: {}", parts.join("; ")))
}

fn trim_amount(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{}", v as u64)
    } else {
        format!("{v:.1}")
    }
}

/// One budget limit and its use over the subtree of the run that set it;
/// when reached, the refusal of a new op or child run.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitUse {
    /// The limit's name, one of [`LIMITS`].
    pub limit: &'static str,
    /// The amount used, in the limit's unit (seconds for the `_seconds`
    /// limits).
    pub used: f64,
    /// The limit set.
    pub max: u64,
    /// The run whose budget it is (the run itself or an ancestor).
    pub run_id: String,
}

impl std::fmt::Display for LimitUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "budget exhausted: {} used {} of {} (budget of run {})",
            self.limit,
            trim_amount(self.used),
            self.max,
            self.run_id
        )
    }
}

#[cfg(test)]
#[path = "runs_tests.rs"]
mod tests;
