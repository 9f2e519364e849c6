//! Views of the operator's containers and of the reaper's decisions.

use serde::{Deserialize, Serialize};

/// A managed container as the operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ContainerView {
    /// Docker's id of the container.
    pub container_id: String,
    /// Docker's name of the container.
    pub name: String,
    /// Docker's state (`running`, `exited`, ...).
    pub state: String,
    /// The run it serves: its `opkernel.run_id` label, or the run that
    /// adopted it from the warm pool; null for a free pool container.
    pub run_id: Option<String>,
    /// For a warm-pool container: `free`, `making`, `adopting`, `bound` (adopted by
    /// `run_id`), `unconfirmed` (a binding file names it, the control plane
    /// does not: never reused) or `stray` (about to be removed); null for a
    /// container made for its run.
    pub pool: Option<String>,
    /// Its `opkernel.scratch_key` label: whose scratch dir it mounts.
    pub scratch_key: Option<String>,
    /// Its `opkernel.run_fingerprint` label: sha256 over the run id and
    /// its profile.
    pub run_fingerprint: Option<String>,
    /// Its `opkernel.created_at` label: creation time in unix seconds.
    pub created_at: Option<String>,
    /// In this kernel's registry of run containers.
    pub registered: bool,
    /// The cluster node whose engine holds it; absent on a single kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// A cluster node whose part of an operator view is missing: it did not
/// answer, or it is dead (SPEC §24: listed, never silently left out).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UnreachableNode {
    /// The node.
    pub node: String,
    /// Why its part is missing.
    pub reason: String,
}

/// `GET /v1/containers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ContainerList {
    /// Every container labelled `opkernel.managed` (in a cluster: on every
    /// node that answered).
    pub containers: Vec<ContainerView>,
    /// The nodes that could not answer (a cluster only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable: Vec<UnreachableNode>,
}

/// `POST /v1/reap`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReapList {
    /// The decisions were only shown: nothing was removed.
    pub dry_run: bool,
    /// The reaper's verdict on every managed container, with its reason
    /// (in a cluster: every node's that answered, each naming its node).
    pub decisions: Vec<crate::runtime::reaper::ReapDecision>,
    /// The nodes that could not answer (a cluster only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable: Vec<UnreachableNode>,
}

/// One op of an inspected container's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InspectOp {
    /// The op's id.
    pub operation_id: String,
    /// Where it stands (`running`, `completed`, ...).
    pub status: crate::lifecycle::Status,
    /// Milliseconds since it was admitted.
    pub age_ms: i64,
    /// Its exit code, once it has one.
    pub exit_code: Option<i64>,
    /// Its argv, joined by spaces (cut at 200 characters).
    pub command: String,
}

/// One marked process of an inspected container (the shim's `ps`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InspectProcess {
    /// Its pid inside the container.
    pub pid: u32,
    /// The op it belongs to.
    pub operation_id: String,
    /// Its owner's name in the container (or the uid).
    pub user: String,
    /// CPU time used, seconds.
    pub cpu: f64,
    /// Resident memory, bytes.
    pub rss: u64,
    /// Seconds since it started.
    pub age: f64,
    /// Its command line.
    pub command: String,
}

/// The reaper's verdict on the container now (as a dry run gives it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReaperVerdict {
    /// `keep` or `remove`.
    pub verdict: crate::runtime::reaper::ReapAction,
    /// Why.
    pub reason: String,
}

/// `GET /v1/containers/{id}`: everything an operator asks about one
/// container (SPEC §23).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ContainerInspect {
    /// Docker's id of the container.
    pub container_id: String,
    /// Docker's name of the container.
    pub name: String,
    /// Docker's state (`running`, `exited`, ...).
    pub state: String,
    /// Every label it carries.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Its `opkernel.run_fingerprint` label.
    pub fingerprint: Option<String>,
    /// The profile its run gets now (image, limits, user, network); null
    /// for a container without a known run.
    pub profile: Option<ProfileView>,
    /// The run it serves (its label).
    pub run_id: Option<String>,
    /// The run's live ops and its latest ones, newest first.
    pub ops: Vec<InspectOp>,
    /// Its marked processes; null when they could not be read (see
    /// `processes_error`), empty when none run.
    pub processes: Option<Vec<InspectProcess>>,
    /// Why the process table is missing, when it is.
    pub processes_error: Option<String>,
    /// Who read the table: `launcher` (the container's resident launcher,
    /// through the run's inbox) or `exec` (a `docker exec` of the shim).
    pub processes_source: Option<String>,
    /// Bytes under the run's scratch dir (its files and its op files);
    /// null when the dir is not this kernel's.
    pub scratch_bytes: Option<u64>,
    /// The reaper's verdict and reason.
    pub reaper: ReaperVerdict,
}

/// A container profile as inspect shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProfileView {
    /// The image.
    pub image: String,
    /// Memory limit, bytes (0: none).
    pub memory_bytes: i64,
    /// CPU limit, in CPUs.
    pub cpus: f64,
    /// Process limit (0: none).
    pub pids_limit: i64,
    /// Docker network mode.
    pub network: String,
    /// Who commands run as (null: root).
    pub run_as: Option<String>,
}

impl From<&sandbox::Profile> for ProfileView {
    fn from(p: &sandbox::Profile) -> ProfileView {
        ProfileView {
            image: p.image.clone(),
            memory_bytes: p.memory_bytes.max(0),
            cpus: p.nano_cpus as f64 / 1e9,
            pids_limit: p.pids_limit.max(0),
            network: p.network.clone(),
            run_as: p.run_as.clone(),
        }
    }
}
