#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The cluster drills (SPEC §20) against a real cluster on this machine:
//! `scripts/cluster.sh up 3` (three Docker-in-Docker nodes, each with its
//! own engine, sharing one PostgreSQL container on a private network), and
//! real faults from the host's engine: `docker kill` of a node, `docker
//! pause` shorter and longer than the lease, a `docker network disconnect`
//! shorter and longer than the lease, PostgreSQL stopped 20 s, and every
//! node's kernel restarted in turn under load. Each drill checks: every op
//! settled and delivered exactly once; only the lost node's claimed ops are
//! `lost`; nothing ran twice (each command's own side-effect file); no
//! false exit code; an affected run's next op runs on a live node; a
//! fenced node claims nothing once it is back; a late real end is recorded
//! as `tool.late_result`.

use opkernel_tests::cluster::Cluster;

#[path = "cluster_drills/common.rs"]
mod common;
use common::*;

#[path = "cluster_drills/chaos.rs"]
mod chaos;
#[path = "cluster_drills/chaos_check.rs"]
mod chaos_check;
#[path = "cluster_drills/egress.rs"]
mod egress;
#[path = "cluster_drills/faults.rs"]
mod faults;
#[path = "cluster_drills/workspaces.rs"]
mod workspaces;

/// The webhook's signing secret of every node.
const SECRET: &str = "cluster-drills-webhook-secret";

#[tokio::test]
async fn the_cluster_drills_on_three_docker_in_docker_nodes() {
    let ttl = format!("{TTL}s");
    // the defaults on, and every feature beside them (SPEC §24): webhooks
    // to the drills' own receiver (reached through the network's gateway),
    // an approval rule, short op-file retention; the pool is on by default
    let posts = chaos::Posts::default();
    let port = chaos::receiver(posts.clone()).await;
    let subnet = std::env::var("OPKERNEL_CLUSTER_SUBNET").unwrap_or_else(|_| "10.213.7".into());
    let hook = format!("http://{subnet}.1:{port}/hook");
    // egress allow lists served by each node's proxy, to an outside of the
    // drills' own on the host, named without DNS
    let outside = egress::outside().await;
    let egress_hosts = egress::hosts(&subnet);
    let env = [
        ("OPKERNEL_NODE_TTL", ttl.as_str()),
        ("OPKERNEL_WEBHOOK_URL", hook.as_str()),
        ("OPKERNEL_WEBHOOK_SECRET", SECRET),
        ("OPKERNEL_APPROVAL_MATCH", "needs-approval"),
        ("OPKERNEL_OP_FILES_RETENTION", "1m"),
        ("OPKERNEL_RETENTION", "10m"),
        ("OPKERNEL_EGRESS_HOSTS", egress_hosts.as_str()),
    ];
    let c = std::sync::Arc::new(Cluster::up(3, &env).unwrap());
    all_active(&c, "n1").await;
    faults::any_node_serves(&c).await;
    workspaces::through_any_node(&c).await;
    egress::through_its_node(&c, outside).await;
    faults::node_kill(&c).await;
    faults::cut(&c, faults::Cut::Pause, "n1", false).await;
    faults::cut(&c, faults::Cut::Pause, "n1", true).await;
    faults::cut(&c, faults::Cut::Partition, "n2", false).await;
    faults::cut(&c, faults::Cut::Partition, "n2", true).await;
    faults::store_outage(&c).await;
    faults::rolling_restart(&c).await;
    let seconds = std::env::var("OPKERNEL_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    chaos::cluster_chaos(c.clone(), seconds, posts).await;
}
