//! This kernel as a cluster node (SPEC §20): its settings and the epoch it
//! holds now, which fences every exec claim it makes.

use std::sync::atomic::{AtomicI64, Ordering};

use super::Kernel;
use crate::config::NodeConfig;

/// A node's identity in the cluster.
#[derive(Debug)]
pub struct NodeState {
    /// Its settings (name, advertised URL, lease TTL).
    pub config: NodeConfig,
    /// The epoch of its current membership (0 until it joined, and while
    /// it knows itself fenced: no claim can match 0).
    epoch: AtomicI64,
}

impl NodeState {
    /// A node not yet joined.
    pub fn new(config: NodeConfig) -> NodeState {
        NodeState {
            config,
            epoch: AtomicI64::new(0),
        }
    }

    /// The epoch it holds (0: none).
    pub fn epoch(&self) -> i64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Records the epoch of a join; 0 when the lease is found lapsed (no
    /// claim is tried until the next join).
    pub fn set_epoch(&self, epoch: i64) {
        self.epoch.store(epoch, Ordering::SeqCst)
    }
}

impl Kernel {
    /// The fence of this kernel's exec claims: its node and epoch (`None`
    /// for a single kernel).
    pub fn fence(&self) -> Option<(String, i64)> {
        self.node
            .as_ref()
            .map(|n| (n.config.name.clone(), n.epoch()))
    }

    /// Whether an op placed on `node` is this kernel's to run (always, for
    /// a single kernel).
    pub fn runs_here(&self, node: Option<&str>) -> bool {
        match (&self.node, node) {
            (Some(me), Some(node)) => me.config.name == node,
            (Some(_), None) => false,
            (None, _) => true,
        }
    }
}
