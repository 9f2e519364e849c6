//! Views of runs as tasks (SPEC §14): one run with its family, budget and
//! usage; the run tree; a new run's answer; a state change's answer; a
//! usage fact's answer.

use serde::{Deserialize, Serialize};

use crate::runs::{Budget, Envelope, RunState, Used};

/// A run as `GET /v1/runs/{run}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunView {
    /// The run's id.
    pub run_id: String,
    /// `active`, `paused`, `completed` or `cancelled`.
    pub state: RunState,
    /// The run that created it; null for a top-level run.
    pub parent_run_id: Option<String>,
    /// Ancestor run ids, root first (empty for a top-level run).
    pub chain: Vec<String>,
    /// Who created it: `operator`, or `run:<id>` of its parent.
    pub principal: String,
    /// Its direct children.
    pub children: Vec<ChildView>,
    /// What its ops and its container may use, fixed at its creation.
    pub envelope: Envelope,
    /// Its own budget limits, any subset (empty: none).
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
    /// The cluster node its tree lives on (placed at its first use; a
    /// child's is its root's); null without a cluster or before any op.
    pub node: Option<String>,
    /// Its image, by the operator's name (SPEC §26).
    pub image: String,
    /// Where it was made from (SPEC §28); absent for a run made before
    /// origins were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<crate::origin::Origin>,
}

/// A child run, with its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChildView {
    /// The child's id.
    pub run_id: String,
    /// `active`, `paused`, `completed` or `cancelled`.
    pub state: RunState,
}

/// Amounts keyed by the budget's limit names: seconds with millisecond
/// precision, tokens (input + output) and cost in micro-units. `used`
/// names every limit; `remaining` only those the budget sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Amounts {
    /// Op wall time, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_seconds: Option<f64>,
    /// CPU time (user + system) of the ops' process trees, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// Model tokens, input plus output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Model cost, in millionths of the currency unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_micros: Option<u64>,
    /// Connections the egress proxy let through (SPEC §27).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_connections: Option<u64>,
    /// Bytes the egress proxy brought in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_bytes_in: Option<u64>,
    /// Bytes the egress proxy sent out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_bytes_out: Option<u64>,
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunCreated {
    /// The run's id.
    pub run_id: String,
    /// The run token: acts on this run alone (and its descendants).
    pub token: String,
    /// The run whose token created it; null for a top-level run.
    pub parent_run_id: Option<String>,
    /// Ancestor run ids, root first (empty for a top-level run).
    pub chain: Vec<String>,
    /// `active`, `paused`, `completed` or `cancelled`.
    pub state: RunState,
    /// Its envelope, resolved from the request, its parent's and the
    /// kernel's defaults.
    pub envelope: Envelope,
    /// Its own budget limits.
    pub budget: Budget,
    /// Its image, by the operator's name (SPEC §26).
    pub image: String,
    /// What its workspace was copied from (`RUN` or `RUN@SNAPSHOT`), when
    /// it was forked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<String>,
}

/// `GET /v1/runs`: every run the token reaches, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunList {
    /// The runs, oldest first.
    pub runs: Vec<RunSummary>,
}

/// One run of the run tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunSummary {
    /// The run's id.
    pub run_id: String,
    /// Its parent; null for a top-level run.
    pub parent_run_id: Option<String>,
    /// How many ancestors it has (0 for a top-level run).
    pub depth: usize,
    /// `active`, `paused`, `completed` or `cancelled`.
    pub state: RunState,
    /// Its ops that are not terminal.
    pub live_ops: u64,
    /// Its own budget limits.
    pub budget: Budget,
    /// Unix ms.
    pub created_at: i64,
}

/// `POST /v1/runs/{run}/pause|resume|cancel|complete`: the run as it is
/// now and what the change did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunChangeAnswer {
    /// The run after the change.
    pub run: RunView,
    /// The runs whose state changed (a cancel's descendants included).
    pub changed: Vec<String>,
    /// Live ops that got a durable kill request.
    pub kill_requested: Vec<String>,
    /// Ops waiting for approval that were denied.
    pub denied: Vec<String>,
}

/// `POST /v1/runs/{run}/usage`: the ledger fact and the run's usage now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageAnswer {
    /// The run the fact is charged to.
    pub run_id: String,
    /// The fact's ledger sequence number.
    pub seq: i64,
    /// False for a retry under the same `Idempotency-Key`.
    pub recorded: bool,
    /// Over the run and its descendants, fact included.
    pub used: Amounts,
    /// Of the run's own budget limits, fact included.
    pub remaining: Amounts,
}
