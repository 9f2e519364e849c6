//! `opkernel nodes` and `opkernel node drain NAME` (SPEC §20).

use clap::Subcommand;

use super::client::Client;
use super::print_json;
use crate::surfaces::views::{NodeDrained, NodeList};

/// What `opkernel node` does to one node.
#[derive(Debug, Subcommand)]
pub enum NodeAction {
    /// Stop placing new runs on the node; its ops finish where they are
    Drain {
        /// The node's name
        name: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Let new runs be placed on a drained node again
    Activate {
        /// The node's name
        name: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
}

/// `opkernel nodes`: every node, its state, lease age and load.
pub(super) async fn list(client: &Client, json: bool) -> anyhow::Result<i32> {
    let list: NodeList = client.get_as("/v1/nodes").await?;
    if json {
        print_json(&list);
        return Ok(0);
    }
    if list.nodes.is_empty() {
        println!("no nodes: this kernel runs alone (serve --node makes a cluster node)");
    }
    for n in &list.nodes {
        println!(
            "{:<16} {:<9} epoch={} lease_age={}ms live_ops={} containers={} {}",
            n.name, n.state, n.epoch, n.lease_age_ms, n.live_ops, n.containers, n.advertise_url
        );
    }
    Ok(0)
}

/// `opkernel node ACTION`.
pub(super) async fn act(client: &Client, action: NodeAction) -> anyhow::Result<i32> {
    let (name, json, verb) = match action {
        NodeAction::Drain { name, json } => (name, json, "drain"),
        NodeAction::Activate { name, json } => (name, json, "activate"),
    };
    let now: NodeDrained = client
        .post_empty_as(&format!("/v1/nodes/{name}/{verb}"))
        .await?;
    if json {
        print_json(&now);
    } else if now.state == "draining" {
        println!("node {} is draining: no new run is placed there", now.name);
    } else {
        println!(
            "node {} is {}: new runs may be placed there",
            now.name, now.state
        );
    }
    Ok(0)
}
