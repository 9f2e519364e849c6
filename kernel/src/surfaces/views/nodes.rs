//! Views of the cluster's nodes (SPEC §20).

use serde::{Deserialize, Serialize};

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeView {
    /// Its name (`serve --node`).
    pub name: String,
    /// `active`, `draining` (no new placement) or `dead` (its lease lapsed).
    pub state: String,
    /// Where the other nodes reach its API.
    pub advertise_url: String,
    /// Its membership's epoch: bumped at each join and when declared dead.
    pub epoch: i64,
    /// Milliseconds since its lease was last renewed (the database's clock).
    pub lease_age_ms: i64,
    /// Its ops not yet terminal.
    pub live_ops: i64,
    /// Its managed containers, as counted at its last renewal.
    pub containers: i64,
}

impl From<crate::store::NodeRow> for NodeView {
    fn from(n: crate::store::NodeRow) -> NodeView {
        NodeView {
            name: n.name,
            state: n.state,
            advertise_url: n.advertise_url,
            epoch: n.epoch,
            lease_age_ms: n.lease_age_ms,
            live_ops: n.live_ops,
            containers: n.containers,
        }
    }
}

/// `GET /v1/nodes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeList {
    /// Every node that ever joined, by name (empty for a single kernel).
    pub nodes: Vec<NodeView>,
}

/// `POST /v1/nodes/{name}/drain` and `/activate`: the node's state now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeDrained {
    /// The node.
    pub name: String,
    /// `draining` (no new run is placed there; its ops finish where they
    /// are) or `active`.
    pub state: String,
}
