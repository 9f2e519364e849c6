//! Runs as durable tasks, as pure data (SPEC §14): run states and their
//! transitions, the envelope a run may act within, budgets and the usage
//! totals they are checked against. No I/O here: the store applies these
//! rules inside its transactions, the API maps their refusals to errors.

use serde::{Deserialize, Serialize};

/// The state of a run. `completed` and `cancelled` are absorbing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Active,
    Paused,
    Completed,
    Cancelled,
}

impl RunState {
    pub const ALL: [RunState; 4] = [
        RunState::Active,
        RunState::Paused,
        RunState::Completed,
        RunState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Active => "active",
            RunState::Paused => "paused",
            RunState::Completed => "completed",
            RunState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<RunState> {
        RunState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    pub fn is_final(self) -> bool {
        matches!(self, RunState::Completed | RunState::Cancelled)
    }
}

/// A requested change of a run's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunAction {
    Pause,
    Resume,
    Complete,
    Cancel,
}

impl RunAction {
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

    /// The event recorded when the action changes a run's state.
    pub fn event(self) -> &'static str {
        match self {
            RunAction::Pause => "run.paused",
            RunAction::Resume => "run.resumed",
            RunAction::Complete => "run.completed",
            RunAction::Cancel => "run.cancelled",
        }
    }
}

/// What an action does to a run in a given state: the one transition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The state changes (compare-and-set from `from`), with its event.
    Change { from: RunState, to: RunState },
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

/// Approval rules (SPEC §16) carried by the envelope; children may add
/// rules, never remove them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRules {
    /// Regexes matched against the command joined by spaces.
    #[serde(default, rename = "match")]
    pub patterns: Vec<String>,
    /// Every op needs approval.
    #[serde(default)]
    pub all: bool,
    pub timeout_sec: Option<u64>,
    pub on_timeout: Option<OnTimeout>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    Escalate,
    Deny,
}

impl OnTimeout {
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Escalate => "escalate",
            OnTimeout::Deny => "deny",
        }
    }

    pub fn parse(s: &str) -> Option<OnTimeout> {
        match s {
            "escalate" => Some(OnTimeout::Escalate),
            "deny" => Some(OnTimeout::Deny),
            _ => None,
        }
    }
}

impl ApprovalRules {
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty() && !self.all
    }
}

/// An envelope as a request gives it: any subset of the fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeRequest {
    pub max_timeout_sec: Option<u64>,
    pub memory_bytes: Option<i64>,
    pub cpus: Option<f64>,
    pub pids_limit: Option<i64>,
    pub network: Option<String>,
    pub max_live_ops: Option<u64>,
    pub max_children: Option<u64>,
    pub approval: Option<ApprovalRules>,
}

/// A run's envelope with every field resolved (at the run's creation, from
/// its parent's, or the kernel's defaults for a top-level run): what its
/// ops and its container may use. Fixed for the run's life.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// `None`: only the kernel's own ceilings apply.
    pub max_timeout_sec: Option<u64>,
    pub memory_bytes: i64,
    pub cpus: f64,
    pub pids_limit: i64,
    pub network: String,
    /// Live ops of the run and its descendants together.
    pub max_live_ops: u64,
    /// Unfinished (active or paused) descendant runs.
    #[serde(default = "default_max_children")]
    pub max_children: u64,
    #[serde(default, skip_serializing_if = "ApprovalRules::is_empty")]
    pub approval: ApprovalRules,
}

/// The kernel's default `max_children` (`OPKERNEL_MAX_CHILDREN`), also
/// for envelopes recorded before the field existed.
pub const DEFAULT_MAX_CHILDREN: u64 = 32;

fn default_max_children() -> u64 {
    DEFAULT_MAX_CHILDREN
}

/// Why a request may not have the envelope or budget it asks for.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EnvelopeError {
    /// Malformed (400).
    #[error("{0}")]
    Invalid(String),
    /// Wider than the parent's (403 `envelope_exceeded`), naming the field.
    #[error("{field}: {asked} is wider than the parent allows ({allowed})")]
    Wider {
        field: &'static str,
        asked: String,
        allowed: String,
    },
}

const MAX_APPROVAL_PATTERNS: usize = 64;
/// Longest approval timeout: a year.
const MAX_APPROVAL_TIMEOUT_SEC: u64 = 366 * 24 * 3600;
const MAX_PATTERN_BYTES: usize = 1024;

fn invalid(msg: impl Into<String>) -> EnvelopeError {
    EnvelopeError::Invalid(msg.into())
}

fn wider(field: &'static str, asked: impl ToString, allowed: impl ToString) -> EnvelopeError {
    EnvelopeError::Wider {
        field,
        asked: asked.to_string(),
        allowed: allowed.to_string(),
    }
}

/// Checks a Docker network name (the envelope never names anything else).
fn validate_network(name: &str) -> Result<(), EnvelopeError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "envelope network must match [A-Za-z0-9_.-]{{1,64}}, got {:?}",
            name.chars().take(80).collect::<String>()
        )))
    }
}

impl EnvelopeRequest {
    /// Checks each given field on its own (ranges, regexes).
    pub fn validate(&self) -> Result<(), EnvelopeError> {
        if self.max_timeout_sec == Some(0) {
            return Err(invalid("envelope max_timeout_sec must be at least 1"));
        }
        if let Some(m) = self.memory_bytes {
            if !(6 << 20..=1 << 50).contains(&m) {
                return Err(invalid(format!(
                    "envelope memory_bytes must be between 6291456 (6 MiB, Docker's minimum) and 2^50, got {m}"
                )));
            }
        }
        if let Some(c) = self.cpus {
            if !(c.is_finite() && (0.01..=1024.0).contains(&c)) {
                return Err(invalid(format!(
                    "envelope cpus must be between 0.01 and 1024, got {c}"
                )));
            }
        }
        if let Some(p) = self.pids_limit {
            if !(8..=1 << 22).contains(&p) {
                return Err(invalid(format!(
                    "envelope pids_limit must be between 8 and 4194304, got {p}"
                )));
            }
        }
        if let Some(n) = &self.network {
            validate_network(n)?;
        }
        if self.max_live_ops == Some(0) {
            return Err(invalid("envelope max_live_ops must be at least 1"));
        }
        if self.max_children.is_some_and(|c| c > 1 << 20) {
            return Err(invalid("envelope max_children must be at most 1048576"));
        }
        if let Some(a) = &self.approval {
            if a.patterns.len() > MAX_APPROVAL_PATTERNS {
                return Err(invalid(format!(
                    "envelope approval.match holds at most {MAX_APPROVAL_PATTERNS} patterns"
                )));
            }
            for p in &a.patterns {
                if p.len() > MAX_PATTERN_BYTES {
                    return Err(invalid(format!(
                        "envelope approval.match patterns are at most {MAX_PATTERN_BYTES} bytes"
                    )));
                }
                regex::Regex::new(p)
                    .map_err(|e| invalid(format!("envelope approval.match pattern {p:?}: {e}")))?;
            }
            if a.timeout_sec
                .is_some_and(|t| !(1..=MAX_APPROVAL_TIMEOUT_SEC).contains(&t))
            {
                return Err(invalid(format!(
                    "envelope approval.timeout_sec must be between 1 and {MAX_APPROVAL_TIMEOUT_SEC}"
                )));
            }
        }
        Ok(())
    }

    /// The envelope of a top-level run: the operator's values over the
    /// kernel's defaults. The operator may set any valid value.
    pub fn resolve_top_level(&self, defaults: &Envelope) -> Result<Envelope, EnvelopeError> {
        self.validate()?;
        let mut env = defaults.clone();
        env.max_timeout_sec = self.max_timeout_sec.or(defaults.max_timeout_sec);
        env.memory_bytes = self.memory_bytes.unwrap_or(defaults.memory_bytes);
        env.cpus = self.cpus.unwrap_or(defaults.cpus);
        env.pids_limit = self.pids_limit.unwrap_or(defaults.pids_limit);
        env.network = self.network.clone().unwrap_or(defaults.network.clone());
        env.max_live_ops = self.max_live_ops.unwrap_or(defaults.max_live_ops);
        env.max_children = self.max_children.unwrap_or(defaults.max_children);
        if let Some(a) = &self.approval {
            env.approval = add_rules(&defaults.approval, a);
        }
        Ok(env)
    }

    /// The envelope of a child: the parent's, narrowed by the request. A
    /// field wider than the parent's is refused, naming the field.
    pub fn narrow(&self, parent: &Envelope) -> Result<Envelope, EnvelopeError> {
        self.validate()?;
        let mut env = parent.clone();
        if let Some(t) = self.max_timeout_sec {
            if let Some(max) = parent.max_timeout_sec.filter(|max| t > *max) {
                return Err(wider("max_timeout_sec", t, max));
            }
            env.max_timeout_sec = Some(t);
        }
        // a parent limit of 0 (or below) is Docker's "unlimited"
        if let Some(m) = self.memory_bytes {
            if parent.memory_bytes > 0 && m > parent.memory_bytes {
                return Err(wider("memory_bytes", m, parent.memory_bytes));
            }
            env.memory_bytes = m;
        }
        if let Some(c) = self.cpus {
            if parent.cpus > 0.0 && c > parent.cpus {
                return Err(wider("cpus", c, parent.cpus));
            }
            env.cpus = c;
        }
        if let Some(p) = self.pids_limit {
            if parent.pids_limit > 0 && p > parent.pids_limit {
                return Err(wider("pids_limit", p, parent.pids_limit));
            }
            env.pids_limit = p;
        }
        if let Some(n) = &self.network {
            // the only narrower network than the parent's is none at all
            if *n != parent.network && n != "none" {
                return Err(wider("network", n, &parent.network));
            }
            env.network = n.clone();
        }
        if let Some(l) = self.max_live_ops {
            if l > parent.max_live_ops {
                return Err(wider("max_live_ops", l, parent.max_live_ops));
            }
            env.max_live_ops = l;
        }
        if let Some(c) = self.max_children {
            if c > parent.max_children {
                return Err(wider("max_children", c, parent.max_children));
            }
            env.max_children = c;
        }
        if let Some(a) = &self.approval {
            env.approval = add_rules(&parent.approval, a);
        }
        Ok(env)
    }
}

/// The parent's approval rules plus the request's: patterns are added
/// (never removed), `all` can only be switched on, and timeout settings
/// (which never approve anything) may be set.
fn add_rules(parent: &ApprovalRules, asked: &ApprovalRules) -> ApprovalRules {
    let mut rules = parent.clone();
    for p in &asked.patterns {
        if !rules.patterns.contains(p) {
            rules.patterns.push(p.clone());
        }
    }
    rules.all |= asked.all;
    if asked.timeout_sec.is_some() {
        rules.timeout_sec = asked.timeout_sec;
    }
    if asked.on_timeout.is_some() {
        rules.on_timeout = asked.on_timeout;
    }
    rules
}

impl Envelope {
    /// The container profile of a run with this envelope: the kernel's
    /// base profile with the envelope's limits. A top-level run with the
    /// kernel's defaults gets the base profile itself (same fingerprint).
    pub fn profile(&self, base: &sandbox::Profile) -> sandbox::Profile {
        sandbox::Profile {
            memory_bytes: self.memory_bytes,
            nano_cpus: (self.cpus * 1e9).round() as i64,
            pids_limit: self.pids_limit,
            network: self.network.clone(),
            ..base.clone()
        }
    }
}

/// The budget limits of a run, any subset. `tokens` counts input + output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_micros: Option<u64>,
}

/// The four budget limits, in the order messages and views list them.
pub const LIMITS: [&str; 4] = ["op_seconds", "cpu_seconds", "tokens", "cost_micros"];

/// Upper bound of any budget limit or usage amount: sums of many stay far
/// from overflowing SQLite's 64-bit integers.
pub const MAX_AMOUNT: u64 = 1 << 48;

impl Budget {
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
    pub op_ms: u64,
    pub cpu_ms: u64,
    pub tokens: u64,
    pub cost_micros: u64,
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
    pub limit: &'static str,
    pub used: f64,
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
#[path = "tasks_tests.rs"]
mod tests;
