//! Views of the operator's containers and of the reaper's decisions.

use serde::{Deserialize, Serialize};

/// A managed container as the operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerView {
    pub container_id: String,
    pub name: String,
    pub state: String,
    pub run_id: Option<String>,
    pub scratch_key: Option<String>,
    pub run_fingerprint: Option<String>,
    pub created_at: Option<String>,
    /// In this kernel's registry of run containers.
    pub registered: bool,
}

/// `GET /v1/containers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerList {
    pub containers: Vec<ContainerView>,
}

/// `POST /v1/reap`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReapList {
    pub dry_run: bool,
    pub decisions: Vec<crate::reaper::ReapDecision>,
}
