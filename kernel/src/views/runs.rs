//! Views of runs as tasks (SPEC §14): one run with its family, budget and
//! usage; the run tree; a new run's answer; a state change's answer; a
//! usage fact's answer.

use serde::{Deserialize, Serialize};

use crate::runs::{Budget, Envelope, RunState, Used};

/// A run as `GET /v1/runs/{run}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunView {
    pub run_id: String,
    pub state: RunState,
    pub parent_run_id: Option<String>,
    /// Ancestor run ids, root first (empty for a top-level run).
    pub chain: Vec<String>,
    /// Who created it: `operator`, or `run:<id>` of its parent.
    pub principal: String,
    pub children: Vec<ChildView>,
    pub envelope: Envelope,
    pub budget: Budget,
    /// Over the run and its descendants, keyed by the limit names.
    pub used: Amounts,
    /// Of the run's own budget limits, derived from the ledger now.
    pub remaining: Amounts,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms of its last state change.
    pub state_changed_at: Option<i64>,
    /// A completed run's summary.
    pub summary: Option<String>,
    /// Who completed or cancelled it.
    pub decided_by: Option<String>,
}

/// A child run, with its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildView {
    pub run_id: String,
    pub state: RunState,
}

/// Amounts keyed by the budget's limit names: seconds with millisecond
/// precision, tokens (input + output) and cost in micro-units. `used`
/// names every limit; `remaining` only those the budget sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Amounts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_micros: Option<u64>,
}

impl Amounts {
    /// What the ledger's totals say was used ([`Used::to_json`]).
    pub fn used(used: Used) -> serde_json::Result<Amounts> {
        serde_json::from_value(used.to_json())
    }

    /// What is left of each limit `budget` sets ([`Used::remaining`]).
    pub fn remaining(used: Used, budget: &Budget) -> serde_json::Result<Amounts> {
        serde_json::from_value(used.remaining(budget))
    }
}

/// `POST /v1/runs`: the new run (or a re-keyed one) and its token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunCreated {
    pub run_id: String,
    /// The run token: acts on this run alone (and its descendants).
    pub token: String,
    pub parent_run_id: Option<String>,
    pub chain: Vec<String>,
    pub state: RunState,
    pub envelope: Envelope,
    pub budget: Budget,
}

/// `GET /v1/runs`: every run the token reaches, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunList {
    pub runs: Vec<RunSummary>,
}

/// One run of the run tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub run_id: String,
    pub parent_run_id: Option<String>,
    /// How many ancestors it has (0 for a top-level run).
    pub depth: usize,
    pub state: RunState,
    /// Its ops that are not terminal.
    pub live_ops: u64,
    pub budget: Budget,
    /// Unix ms.
    pub created_at: i64,
}

/// `POST /v1/runs/{run}/pause|resume|cancel|complete`: the run as it is
/// now and what the change did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunChangeAnswer {
    pub run: RunView,
    /// The runs whose state changed (a cancel's descendants included).
    pub changed: Vec<String>,
    /// Live ops that got a durable kill request.
    pub kill_requested: Vec<String>,
    /// Ops waiting for approval that were denied.
    pub denied: Vec<String>,
}

/// `POST /v1/runs/{run}/usage`: the ledger fact and the run's usage now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageAnswer {
    pub run_id: String,
    /// The fact's ledger sequence number.
    pub seq: i64,
    /// False for a retry under the same `Idempotency-Key`.
    pub recorded: bool,
    pub used: Amounts,
    pub remaining: Amounts,
}
