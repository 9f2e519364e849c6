//! Views of the operator's containers and of the reaper's decisions.

use serde::{Deserialize, Serialize};

/// A managed container as the operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerView {
    /// Docker's id of the container.
    pub container_id: String,
    /// Docker's name of the container.
    pub name: String,
    /// Docker's state (`running`, `exited`, ...).
    pub state: String,
    /// Its `opkernel.run_id` label: the run it serves; null when unlabelled
    /// (a pool container).
    pub run_id: Option<String>,
    /// Its `opkernel.scratch_key` label: whose scratch dir it mounts.
    pub scratch_key: Option<String>,
    /// Its `opkernel.run_fingerprint` label: sha256 over the run id and
    /// its profile.
    pub run_fingerprint: Option<String>,
    /// Its `opkernel.created_at` label: creation time in unix seconds.
    pub created_at: Option<String>,
    /// In this kernel's registry of run containers.
    pub registered: bool,
}

/// `GET /v1/containers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerList {
    /// Every container labelled `opkernel.managed`.
    pub containers: Vec<ContainerView>,
}

/// `POST /v1/reap`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReapList {
    /// The decisions were only shown: nothing was removed.
    pub dry_run: bool,
    /// The reaper's verdict on every managed container, with its reason.
    pub decisions: Vec<crate::runtime::reaper::ReapDecision>,
}
