#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The store-failover drills (SPEC §31) on a real cluster whose store is
//! replicated: `scripts/cluster.sh up 3 --store ha` (three Docker-in-Docker
//! nodes; Debian's pg_auto_failover: a monitor and two PostgreSQL servers
//! in synchronous replication), with the pool on and short retention.
//! Faults come from the host's engine:
//!
//! - the primary killed (`docker kill`) under 100 live ops on 3 nodes:
//!   afterwards every op settled once with its real code, nothing run
//!   twice, every result delivered once, no node declared dead (no sweep
//!   in any node's log), a start meanwhile refused as a store outage
//!   or admitted once; then the killed primary started again rejoins as a
//!   standby and never takes a write (it is polled all along);
//! - the standby killed: the primary goes on once its monitor relaxes
//!   synchronous commit (no standby left to wait for);
//! - both data nodes stopped: a clear outage, nothing lost once they return.
//!
//! The failover round runs twice (each data node is killed once), or for
//! `OPKERNEL_FAILOVER_MINUTES` of repeated rounds by hand; the time from
//! the kill to the first admission is printed per round, with p50 and max.

use std::time::{Duration, Instant};

use opkernel::surfaces::cli::client::Client;
use opkernel_tests::cluster::{docker, timed, Cluster};
use opkernel_tests::unique_run;
use serde_json::{json, Value};

#[path = "cluster_drills/common.rs"]
mod common;
use common::*;

/// Live ops each failover round holds across the switch.
const LIVE: usize = 100;
/// Runs per node the live ops are spread over (a container each).
const RUNS_PER_NODE: usize = 3;

/// A gate looked at once a second: 100 of them at once stay light on a
/// small machine. Appends `tag` to the run's `ran` file, waits for `go`,
/// exits 7.
fn slow_gated(tag: &str) -> Vec<String> {
    let script =
        format!("echo {tag} >> /scratch/ran; while [ ! -e /scratch/go ]; do sleep 1; done; exit 7");
    vec!["sh".into(), "-c".into(), script]
}

/// Starts a background op through `client`; its id. Sent again (same
/// key) while the store is away, as an agent's client would.
async fn start_op(c: &Cluster, via: &str, run: &str, command: &[String]) -> String {
    let body = json!({"command": command, "background": true, "timeout_sec": 900});
    let path = format!("/v1/runs/{run}/tools/run_command");
    let v: Value = c
        .node(via)
        .client
        .start_once(&path, &body, None)
        .await
        .unwrap();
    v["operation_id"].as_str().unwrap().to_owned()
}

/// `ops` gated ops over `RUNS_PER_NODE` fresh runs placed on `node`.
async fn place_many(c: &Cluster, node: &str, ops: usize) -> Vec<Work> {
    let client = &c.node(node).client;
    let others: Vec<&str> = c
        .nodes
        .iter()
        .map(|n| n.name.as_str())
        .filter(|n| *n != node)
        .collect();
    for other in &others {
        timed(client.post(&format!("/v1/nodes/{other}/drain"), &json!({})))
            .await
            .unwrap();
    }
    let runs: Vec<String> = (0..RUNS_PER_NODE).map(|_| unique_run("fo")).collect();
    let mut work = Vec::new();
    let placed = ops.min(runs.len());
    for i in 0..ops {
        let (run, tag) = (runs[i % runs.len()].clone(), tag());
        let op = start_op(c, node, &run, &slow_gated(&tag)).await;
        let node = node.to_owned();
        work.push(Work { run, op, tag, node });
        if i + 1 == placed {
            // every run is placed: the other nodes take starts again
            for other in &others {
                timed(client.post(&format!("/v1/nodes/{other}/activate"), &json!({})))
                    .await
                    .unwrap();
            }
        }
    }
    work
}

/// Ends the gated ops of `work`: one `docker exec` per node.
fn release_all(c: &Cluster, work: &[Work]) {
    for n in &c.nodes {
        let mut runs: Vec<&str> = work
            .iter()
            .filter(|w| w.node == n.name)
            .map(|w| w.run.as_str())
            .collect();
        runs.sort_unstable();
        runs.dedup();
        c.release(&n.name, &runs).unwrap();
    }
}

/// `LIVE` gated ops spread over the three nodes, every one running.
async fn live_ops(c: &Cluster) -> Vec<Work> {
    let mut work = Vec::new();
    let names: Vec<String> = c.nodes.iter().map(|n| n.name.clone()).collect();
    for (i, node) in names.iter().enumerate() {
        let share = LIVE / names.len() + usize::from(i < LIVE % names.len());
        work.extend(place_many(c, node, share).await);
    }
    for w in &work {
        wait_op(c, &w.node, &w.op, |s| s["status"] == "running").await;
    }
    work
}

/// How many times each node's kernel declared another dead (its log's
/// sweep lines). A node whose own lease lapsed while the store was away
/// joins again with a new epoch, as after any outage longer than its TTL
/// (SPEC §19): that is not a node declared dead, and loses nothing.
fn declared_dead(c: &Cluster) -> Vec<usize> {
    c.nodes
        .iter()
        .map(|n| {
            let script = "grep -c 'declared dead' /var/lib/opkernel/serve.out || true";
            let out = c.on_node(&n.name, script).unwrap_or_default();
            out.trim().parse().unwrap_or(0)
        })
        .collect()
}

/// The data node of `role` now (waited for up to `within`).
async fn with_role(c: &Cluster, role: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let roles = c.store_roles().unwrap_or_default();
        if let Some((name, _)) = roles.iter().find(|(_, r)| r == role) {
            return name.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no {role} after {within:?}: {roles:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One SQL answer of the data node `container` (as its superuser, over
/// its socket), or the error psql gave.
fn psql(container: &str, sql: &str) -> Result<String, String> {
    let args = [
        "exec",
        container,
        "runuser",
        "-u",
        "postgres",
        "--",
        "psql",
        "-h",
        "/var/run/postgresql",
        "-d",
        "opkernel",
        "-Atc",
        sql,
    ];
    docker(&args)
        .map(|s| s.trim().to_owned())
        .map_err(|e| e.to_string())
}

/// One start of a `true` op on a fresh run: its run, and its HTTP status
/// (`None`: no answer within 15 s).
async fn probe(client: Client, run: String) -> (String, Option<u16>) {
    let body = json!({"command": ["true"], "background": true});
    let path = format!("/v1/runs/{run}/tools/run_command");
    let key = uuid::Uuid::new_v4().to_string();
    let headers = [("Idempotency-Key", key.as_str())];
    let sent = client.request(reqwest::Method::POST, &path, Some(&body), &headers);
    match tokio::time::timeout(Duration::from_secs(15), sent).await {
        Ok(Ok((status, v))) => {
            // refused: the store away, or back while no node has joined
            // it again yet (their leases lapsed meanwhile)
            let code = v["error"]["code"].as_str().unwrap_or_default();
            let refused = status == 503 && matches!(code, "store_unavailable" | "no_node");
            assert!(
                (200..300).contains(&status) || refused,
                "a start during the switch: {status} {v}"
            );
            (run, Some(status))
        }
        Ok(Err(_)) | Err(_) => (run, None),
    }
}

/// Starts (each on a fresh run, through the nodes in turn) sent every
/// 500 ms until one is admitted: the time from `from` to that answer.
/// Each start refused (`503 store_unavailable` or `no_node`) left no op; each admitted
/// one ran once and completed; one not answered ran at most once.
async fn admitted_after(c: &Cluster, from: Instant, what: &str) -> Duration {
    let mut tries = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut answers = Vec::new();
    let mut sent = 0usize;
    let took = loop {
        tokio::select! {
            _ = tick.tick() => {
                assert!(from.elapsed() < Duration::from_secs(180), "{what}: no admission in 180 s");
                let client = c.nodes[sent % c.nodes.len()].client.clone();
                sent += 1;
                tries.spawn(probe(client, unique_run("fo-probe")));
            }
            Some(done) = tries.join_next() => {
                let (run, status) = done.unwrap();
                answers.push((run, status));
                if status.is_some_and(|s| (200..300).contains(&s)) {
                    break from.elapsed();
                }
            }
        }
    };
    while let Some(done) = tries.join_next().await {
        answers.push(done.unwrap());
    }
    let refused = answers.iter().filter(|(_, s)| *s == Some(503)).count();
    eprintln!("{what}: {sent} starts sent, {refused} refused, admitted after {took:.1?}");
    for (run, status) in &answers {
        let ops = timed(c.node("n1").client.get(&format!("/v1/ops?run={run}")))
            .await
            .unwrap();
        let list = ops["operations"].as_array().cloned().unwrap_or_default();
        let expected = match status {
            Some(503) => 0..=0,
            Some(_) => 1..=1,
            None => 0..=1,
        };
        assert!(
            expected.contains(&list.len()),
            "{what}: {status:?} left {ops}"
        );
        for op in &list {
            let id = op["operation_id"].as_str().unwrap();
            let s = wait_op(c, "n1", id, |s| s["status"] == "completed").await;
            assert_eq!(s["exit_code"], 0, "{s}");
        }
    }
    took
}

/// Polls the restarted data node `container` until it is a standby in
/// sync: it must never answer as a server taking writes meanwhile.
async fn rejoins_as_standby(c: &Cluster, container: &str) -> Duration {
    let since = Instant::now();
    let query = "SELECT pg_is_in_recovery(), (SELECT status FROM pg_stat_wal_receiver)";
    loop {
        let answer = psql(container, query).unwrap_or_default();
        assert!(
            answer.is_empty() || answer.starts_with('t'),
            "{container} came back taking writes: split brain ({answer})"
        );
        let roles = c.store_roles().unwrap_or_default();
        let secondary = roles
            .iter()
            .any(|(n, r)| n == container && r == "secondary");
        if secondary && answer == "t|streaming" {
            break;
        }
        assert!(
            since.elapsed() < Duration::from_secs(180),
            "{container} not a standby after 180 s: {roles:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let refused = psql(container, "CREATE TABLE split_brain_probe (x int)");
    let err = refused.expect_err("a write to the standby was taken");
    assert!(err.contains("read-only"), "{err}");
    since.elapsed()
}

/// The primary killed under `LIVE` live ops; then it rejoins. Returns the
/// time from the kill to the first admission.
async fn failover_round(c: &Cluster, round: usize) -> Duration {
    let before = declared_dead(c);
    let work = live_ops(c).await;
    let primary = with_role(c, "primary", Duration::from_secs(60)).await;
    let killed_at = Instant::now();
    docker(&["kill", &primary]).unwrap();
    // the ops of half the runs end while the store switches (a run's ops
    // share its gate), the others after
    let mut runs: Vec<&str> = work.iter().map(|w| w.run.as_str()).collect();
    runs.sort_unstable();
    runs.dedup();
    let half = &runs[..runs.len() / 2];
    let (early, late): (Vec<Work>, Vec<Work>) = work
        .iter()
        .cloned()
        .partition(|w| half.contains(&w.run.as_str()));
    release_all(c, &early);
    let took = admitted_after(c, killed_at, "store-failover").await;
    eprintln!("store-failover: round {round}: {primary} killed, admissions again after {took:?}");
    release_all(c, &late);
    ends(c, "n1", &work, "completed", json!(7)).await;
    all_delivered_once(c, "n2", &work).await;
    started(c, &work, 1);
    all_active(c, "n3").await;
    assert_eq!(
        declared_dead(c),
        before,
        "a node was declared dead for the switch"
    );
    docker(&["start", &primary]).unwrap();
    let back = rejoins_as_standby(c, &primary).await;
    eprintln!("store-failover: round {round}: {primary} a standby again after {back:?}");
    took
}

/// The standby killed: starts go on once the primary stops waiting for it.
async fn standby_lost(c: &Cluster) {
    let standby = with_role(c, "secondary", Duration::from_secs(60)).await;
    let killed_at = Instant::now();
    docker(&["kill", &standby]).unwrap();
    let took = admitted_after(c, killed_at, "standby-lost").await;
    eprintln!("store-failover: standby {standby} killed, admissions go on after {took:?}");
    docker(&["start", &standby]).unwrap();
    rejoins_as_standby(c, &standby).await;
}

/// Both data nodes stopped 20 s with ops running: a start meanwhile is
/// refused and never runs; the ops end; nothing is lost once they return.
async fn both_lost(c: &Cluster) {
    let before = declared_dead(c);
    let mut work = Vec::new();
    for n in ["n1", "n2", "n3"] {
        work.extend(place_many(c, n, 2).await);
    }
    for w in &work {
        wait_op(c, &w.node, &w.op, |s| s["status"] == "running").await;
    }
    let standby = with_role(c, "secondary", Duration::from_secs(60)).await;
    let primary = with_role(c, "primary", Duration::from_secs(60)).await;
    let stopped_at = Instant::now();
    docker(&["stop", "-t", "5", &standby, &primary]).unwrap();
    let run = refused_start(c, "n1").await;
    release_all(c, &work);
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(stopped_at.elapsed())).await;
    docker(&["start", &primary, &standby]).unwrap();
    let took = admitted_after(c, stopped_at, "both-lost").await;
    eprintln!("store-failover: both data nodes back, admissions after {took:?} (20 s stopped)");
    ends(c, "n1", &work, "completed", json!(7)).await;
    all_delivered_once(c, "n2", &work).await;
    started(c, &work, 1);
    never_recorded(c, "n2", &run).await;
    assert_eq!(
        declared_dead(c),
        before,
        "a node was declared dead for the outage"
    );
    with_role(c, "secondary", Duration::from_secs(180)).await;
}

#[tokio::test]
async fn the_cluster_drills_on_a_replicated_store() {
    let ttl = format!("{TTL}s");
    let env = [
        ("OPKERNEL_NODE_TTL", ttl.as_str()),
        ("OPKERNEL_OP_FILES_RETENTION", "1m"),
        ("OPKERNEL_RETENTION", "10m"),
    ];
    let c = Cluster::up_replicated(3, &env).unwrap();
    let roles: Vec<&str> = c.store_nodes.iter().map(|(_, r)| r.as_str()).collect();
    assert_eq!(roles, ["primary", "secondary"], "{:?}", c.store_nodes);
    all_active(&c, "n1").await;
    let minutes: u64 = std::env::var("OPKERNEL_FAILOVER_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    let began = Instant::now();
    let mut took = Vec::new();
    while took.len() < 2 || began.elapsed() < Duration::from_secs(minutes * 60) {
        took.push(failover_round(&c, took.len() + 1).await);
    }
    took.sort();
    eprintln!(
        "store-failover: {} rounds, admissions again after p50 {:.1?}, max {:.1?} (all: {took:.1?})",
        took.len(),
        took[(took.len() - 1) / 2],
        took[took.len() - 1]
    );
    standby_lost(&c).await;
    both_lost(&c).await;
}
