//! `--cluster`: the cluster's figures on the harness of `scripts/cluster.sh`
//! (Docker-in-Docker nodes sharing one PostgreSQL container): an op's start
//! on its run's node vs through another node; the aggregate throughput of
//! many ops over 30 runs on 1 node vs 3 (the nodes share this machine's
//! cores); `docker kill` → `dead`; the ops a node kill loses against that
//! node's claimed live ops; PostgreSQL commits per op.

use std::time::{Duration, Instant};

use opkernel::surfaces::cli::client::Client;
use opkernel_tests::cluster::{docker, start, timed, Cluster};
use serde_json::{json, Value};

use crate::{pct, Checks};

/// The figures of one `--cluster` run.
#[derive(Default)]
pub struct Figures {
    pub start_local_ms: Vec<f64>,
    pub start_remote_ms: Vec<f64>,
    pub ops_per_sec_1: f64,
    pub ops_per_sec_3: f64,
    pub ops_per_sec_3_routed: f64,
    pub commits_per_op: f64,
    pub kill_to_dead_s: Vec<f64>,
    pub lost_on_kill: usize,
    pub claimed_on_kill: usize,
    pub throughput_ops: usize,
    pub ttl_sec: u64,
}

/// Unix ms now (the containers share this host's clock).
fn now_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or_default()
}

/// An RFC 3339 time of the API as unix ms.
fn api_ms(v: &Value) -> anyhow::Result<f64> {
    let text = v.as_str().ok_or_else(|| anyhow::anyhow!("no time: {v}"))?;
    let t = chrono::DateTime::parse_from_rfc3339(text)?;
    Ok(t.timestamp_millis() as f64)
}

/// Waits until `op` (seen through `client`) is terminal; its state.
async fn terminal(client: &Client, op: &str) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = timed(client.get(&format!("/v1/operations/{op}"))).await?;
        let status = s["status"].as_str().unwrap_or_default();
        if !matches!(status, "starting" | "running" | "awaiting_approval") {
            return Ok(s);
        }
        anyhow::ensure!(Instant::now() < deadline, "op {op} not terminal: {s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// From the start call to the command's start (`started_at`), `samples`
/// times, for a run on `c`'s first node, started through `via`.
async fn start_latency(
    c: &Cluster,
    run: &str,
    via: usize,
    samples: usize,
) -> anyhow::Result<Vec<f64>> {
    let client = &c.nodes[via].client;
    let mut out = Vec::new();
    for _ in 0..samples {
        let sent = now_ms();
        let op = start(client, run, &["true".to_owned()]).await?;
        let s = terminal(client, &op).await?;
        anyhow::ensure!(s["status"] == "completed", "{s}");
        out.push(api_ms(&s["started_at"])? - sent);
    }
    Ok(out)
}

/// The local vs remote start figures on a 3-node cluster (runs placed on
/// n1 by draining the others meanwhile).
async fn starts(c: &Cluster, samples: usize, f: &mut Figures) -> anyhow::Result<()> {
    let n1 = &c.nodes[0].client;
    for other in ["n2", "n3"] {
        timed(n1.post(&format!("/v1/nodes/{other}/drain"), &json!({}))).await?;
    }
    let run = format!(
        "bench-start-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    start_latency(c, &run, 0, 3).await?;
    for other in ["n2", "n3"] {
        timed(n1.post(&format!("/v1/nodes/{other}/activate"), &json!({}))).await?;
    }
    let placed = timed(n1.get(&format!("/v1/runs/{run}"))).await?;
    anyhow::ensure!(placed["node"] == "n1", "placed: {placed}");
    for _ in 0..samples {
        f.start_local_ms.extend(start_latency(c, &run, 0, 1).await?);
        f.start_remote_ms
            .extend(start_latency(c, &run, 1, 1).await?);
    }
    Ok(())
}

/// One count of the store, asked on `c` (one connection for a whole
/// measurement: measuring does not load the store).
async fn count(c: &deadpool_postgres::Object, sql: &str) -> anyhow::Result<i64> {
    Ok(c.query_one(sql, &[]).await?.get::<_, i64>(0))
}

/// The store's committed transactions so far.
const COMMITS: &str = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";
/// How many ops of the store are not terminal.
const UNSETTLED: &str = "SELECT COUNT(*) FROM ops WHERE status IN ('starting', 'running')";

/// `ops` background `true` ops over 30 runs, each run's ops started back
/// to back by a client of its own (through the nodes in turn; `routed`:
/// after its first op, through the node its run was placed on), until all
/// have ended: ops per second, and the store's commits per op.
async fn throughput(c: &Cluster, ops: usize, routed: bool) -> anyhow::Result<(f64, f64)> {
    const RUNS: usize = 30;
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let pool = opkernel::store::db::pgpool::pool(&c.store, 1)?;
    let asking = opkernel::store::db::pgpool::connection(&pool).await?;
    let before = count(&asking, COMMITS).await?;
    let began = Instant::now();
    let mut tasks = Vec::new();
    let clients: Vec<(String, Client)> = c
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.client.clone()))
        .collect();
    for r in 0..RUNS {
        let clients = clients.clone();
        let run = format!("bench-tp-{tag}-{r}");
        let each = ops / RUNS;
        tasks.push(tokio::spawn(async move {
            let mut client = clients[r % clients.len()].1.clone();
            for i in 0..each {
                start(&client, &run, &["true".to_owned()]).await?;
                if routed && i == 0 {
                    let placed = timed(client.get(&format!("/v1/runs/{run}"))).await?;
                    if let Some((_, home)) =
                        clients.iter().find(|(n, _)| placed["node"] == n.as_str())
                    {
                        client = home.clone();
                    }
                }
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while count(&asking, UNSETTLED).await? > 0 {
        anyhow::ensure!(Instant::now() < deadline, "ops still unsettled after 600 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let secs = began.elapsed().as_secs_f64();
    // the server's statistics are flushed at most once a second
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let per_op = (count(&asking, COMMITS).await? - before) as f64 / ops as f64;
    Ok(((ops / RUNS * RUNS) as f64 / secs, per_op))
}

/// `trials` × (`docker kill` of n3 → n1 lists it `dead`; started again);
/// the first trial with gated ops on every node, counting what is lost.
async fn kills(c: &Cluster, trials: usize, f: &mut Figures) -> anyhow::Result<()> {
    for trial in 0..trials {
        let claimed = if trial == 0 {
            Some(spread_gated(c).await?)
        } else {
            None
        };
        let before = c.members("n1").await?;
        let epoch = before
            .iter()
            .find(|m| m["name"] == "n3")
            .map(|m| m["epoch"].clone());
        let killed = Instant::now();
        docker(&["kill", &c.node("n3").container])?;
        let dead = |m: &Value| m["state"] == "dead";
        c.wait_member("n1", "n3", dead, Duration::from_secs(120))
            .await?;
        f.kill_to_dead_s.push(killed.elapsed().as_secs_f64());
        if let Some((claimed, ops)) = claimed {
            f.claimed_on_kill = claimed;
            f.lost_on_kill = count_lost(c, &ops).await?;
        }
        docker(&["start", &c.node("n3").container])?;
        let back = |m: &Value| m["state"] == "active" && Some(m["epoch"].clone()) != epoch;
        c.wait_member("n1", "n3", back, Duration::from_secs(120))
            .await?;
        c.wait_answers("n3").await?;
    }
    Ok(())
}

/// Two gated ops on runs of each node (placed by draining the others),
/// each running; how many of them n3 had claimed, and all their ids.
async fn spread_gated(c: &Cluster) -> anyhow::Result<(usize, Vec<String>)> {
    let gate = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        "while [ ! -e /scratch/go ]; do sleep 0.2; done".to_owned(),
    ];
    let names = ["n1", "n2", "n3"];
    let mut ops = Vec::new();
    for node in names {
        let client = &c.node(node).client;
        for other in names.into_iter().filter(|o| *o != node) {
            timed(client.post(&format!("/v1/nodes/{other}/drain"), &json!({}))).await?;
        }
        for _ in 0..2 {
            let run = format!(
                "bench-kill-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            );
            ops.push((start(client, &run, &gate).await?, run));
        }
        for other in names.into_iter().filter(|o| *o != node) {
            timed(client.post(&format!("/v1/nodes/{other}/activate"), &json!({}))).await?;
        }
    }
    let n1 = &c.nodes[0].client;
    let mut claimed = 0;
    for (op, run) in &ops {
        let deadline = Instant::now() + Duration::from_secs(60);
        while timed(n1.get(&format!("/v1/operations/{op}"))).await?["status"] != "running" {
            anyhow::ensure!(Instant::now() < deadline, "op {op} not running");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        claimed += usize::from(timed(n1.get(&format!("/v1/runs/{run}"))).await?["node"] == "n3");
    }
    Ok((claimed, ops.into_iter().map(|(op, _)| op).collect()))
}

/// How many of `ops` ended `lost` (waited for: the sweep settles them).
async fn count_lost(c: &Cluster, ops: &[String]) -> anyhow::Result<usize> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut lost = 0;
    for op in ops {
        let s = timed(c.nodes[0].client.get(&format!("/v1/operations/{op}"))).await?;
        lost += usize::from(s["status"] == "lost");
    }
    Ok(lost)
}

/// The whole `--cluster` run; the JSON of its figures.
pub async fn measure(quick: bool, checks: &mut Checks) -> anyhow::Result<Value> {
    // whole seconds (`10s`), as the harness sets it
    let ttl = std::env::var("OPKERNEL_NODE_TTL")
        .ok()
        .and_then(|v| v.trim().trim_end_matches('s').parse().ok())
        .unwrap_or(10u64);
    let mut f = Figures {
        ttl_sec: ttl,
        ..Figures::default()
    };
    let (samples, ops, trials) = if quick { (15, 600, 2) } else { (50, 3000, 10) };
    f.throughput_ops = ops;
    let one = Cluster::up(1, &[])?;
    f.ops_per_sec_1 = throughput(&one, ops, false).await?.0;
    one.down();
    drop(one);
    let c = Cluster::up(3, &[])?;
    starts(&c, samples, &mut f).await?;
    (f.ops_per_sec_3, f.commits_per_op) = throughput(&c, ops, false).await?;
    f.ops_per_sec_3_routed = throughput(&c, ops, true).await?.0;
    kills(&c, trials, &mut f).await?;
    drop(c);
    checks.want(
        "cluster_lost_on_kill",
        f.lost_on_kill,
        &format!("{} (the killed node's claimed ops)", f.claimed_on_kill),
        f.lost_on_kill == f.claimed_on_kill,
    );
    Ok(f.json())
}

impl Figures {
    fn json(&self) -> Value {
        let p50 = |v: &[f64]| (pct(v, 50.0) * 10.0).round() / 10.0;
        json!({
            "cluster": {
                "start_p50_ms_on_run_node": p50(&self.start_local_ms),
                "start_p50_ms_through_other_node": p50(&self.start_remote_ms),
                "start_p90_ms_on_run_node": (pct(&self.start_local_ms, 90.0) * 10.0).round() / 10.0,
                "start_p90_ms_through_other_node": (pct(&self.start_remote_ms, 90.0) * 10.0).round() / 10.0,
                "start_samples": self.start_local_ms.len(),
                "throughput_ops": self.throughput_ops,
                "throughput_runs": 30,
                "ops_per_sec_1_node": (self.ops_per_sec_1 * 10.0).round() / 10.0,
                "ops_per_sec_3_nodes": (self.ops_per_sec_3 * 10.0).round() / 10.0,
                "throughput_ratio_3_to_1": ((self.ops_per_sec_3 / self.ops_per_sec_1) * 100.0).round() / 100.0,
                "ops_per_sec_3_nodes_routed": (self.ops_per_sec_3_routed * 10.0).round() / 10.0,
                "throughput_ratio_3_routed_to_1": ((self.ops_per_sec_3_routed / self.ops_per_sec_1) * 100.0).round() / 100.0,
                "pg_commits_per_op": (self.commits_per_op * 100.0).round() / 100.0,
                "lease_ttl_sec": self.ttl_sec,
                "kill_to_dead_sec": self.kill_to_dead_s.iter().map(|s| (s * 100.0).round() / 100.0).collect::<Vec<_>>(),
                "kill_to_dead_p50_sec": (pct(&self.kill_to_dead_s, 50.0) * 100.0).round() / 100.0,
                "kill_to_dead_max_sec": (pct(&self.kill_to_dead_s, 100.0) * 100.0).round() / 100.0,
                "lost_on_kill": self.lost_on_kill,
                "claimed_live_on_killed_node": self.claimed_on_kill,
            }
        })
    }
}
