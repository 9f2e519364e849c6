//! What the cluster drills share (tests/tests/cluster_drills.rs and
//! tests/tests/store_failover.rs): gated ops placed on a node, their ends
//! waited for, and each delivered and started exactly once.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use opkernel_tests::cluster::{gated, start, timed, Cluster};
use opkernel_tests::unique_run;
use serde_json::{json, Value};

/// The drills' lease (the default is 10 s): short, so detection is quick.
pub const TTL: u64 = 5;

/// A gated op the drill started: its run, id, side-effect tag and node.
#[derive(Debug, Clone)]
pub struct Work {
    pub run: String,
    pub op: String,
    pub tag: String,
    pub node: String,
}

pub fn tag() -> String {
    format!("op-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// The op as node `via` sees it.
pub async fn state(c: &Cluster, via: &str, op: &str) -> anyhow::Result<Value> {
    timed(c.node(via).client.get(&format!("/v1/operations/{op}"))).await
}

/// Waits until `pred` holds for the op as `via` sees it (errors of a
/// store that is away are waited out).
pub async fn wait_op(c: &Cluster, via: &str, op: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let last = match state(c, via, op).await {
            Ok(s) if pred(&s) => return s,
            Ok(s) => s.to_string(),
            Err(e) => format!("{e:#}"),
        };
        assert!(Instant::now() < deadline, "op {op} through {via}: {last}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `k` gated ops on fresh runs placed on `node` (every other node drained
/// meanwhile, then active again), each running.
pub async fn place_on(c: &Cluster, node: &str, k: usize) -> Vec<Work> {
    let client = &c.node(node).client;
    let others: Vec<String> = c
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .filter(|n| n != node)
        .collect();
    for other in &others {
        timed(client.post(&format!("/v1/nodes/{other}/drain"), &json!({})))
            .await
            .unwrap();
    }
    let mut work = Vec::new();
    for _ in 0..k {
        let (run, tag) = (unique_run("cl"), tag());
        let op = start(client, &run, &gated(&tag)).await.unwrap();
        let node = node.to_owned();
        work.push(Work { run, op, tag, node });
    }
    for other in &others {
        timed(client.post(&format!("/v1/nodes/{other}/activate"), &json!({})))
            .await
            .unwrap();
    }
    for w in &work {
        wait_op(c, node, &w.op, |s| s["status"] == "running").await;
        let run = timed(client.get(&format!("/v1/runs/{}", w.run)))
            .await
            .unwrap();
        assert_eq!(run["node"], node, "{run}");
    }
    work
}

/// Ends the gated ops of `work` (on the node each runs on).
pub fn release(c: &Cluster, work: &[Work]) {
    for w in work {
        c.release(&w.node, &[w.run.as_str()]).unwrap();
    }
}

/// Waits until each op of `work` is `status` with `code`.
pub async fn ends(c: &Cluster, via: &str, work: &[Work], status: &str, code: Value) {
    for w in work {
        let s = wait_op(c, via, &w.op, |s| s["status"] == status).await;
        assert_eq!(s["exit_code"], code, "{s}");
    }
}

/// Drains `run`'s reports through `via` (acking each) until every op of
/// `ops` was delivered, then once more: each delivered exactly once.
pub async fn delivered_once(c: &Cluster, via: &str, run: &str, ops: &[&str]) {
    let client = &c.node(via).client;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen: Vec<String> = Vec::new();
    let mut extra_round = false;
    loop {
        let done = ops.iter().all(|op| seen.iter().any(|s| s == op));
        if done && extra_round {
            break;
        }
        extra_round |= done;
        assert!(
            Instant::now() < deadline,
            "run {run}: delivered {seen:?} of {ops:?}"
        );
        let path = format!("/v1/runs/{run}/report?wait={}", if done { 1 } else { 2 });
        let Ok(report) = timed(client.get(&path)).await else {
            continue;
        };
        for item in report["resolved"].as_array().into_iter().flatten() {
            seen.push(item["operation_id"].as_str().unwrap_or_default().to_owned());
        }
        if let Some(id) = report["report_id"].as_str() {
            let ack = format!("/v1/runs/{run}/report/{id}/ack");
            timed(client.post(&ack, &json!({}))).await.unwrap();
        }
    }
    for op in ops {
        let times = seen.iter().filter(|s| s == op).count();
        assert_eq!(
            times, 1,
            "run {run}: op {op} delivered {times} times: {seen:?}"
        );
    }
}

/// Each op of `work` was delivered exactly once (through `via`).
pub async fn all_delivered_once(c: &Cluster, via: &str, work: &[Work]) {
    let mut runs: Vec<&str> = work.iter().map(|w| w.run.as_str()).collect();
    runs.sort_unstable();
    runs.dedup();
    for run in runs {
        let ops: Vec<&str> = work
            .iter()
            .filter(|w| w.run == run)
            .map(|w| w.op.as_str())
            .collect();
        delivered_once(c, via, run, &ops).await;
    }
}

/// Each op of `work` started `times` times (its side-effect file).
pub fn started(c: &Cluster, work: &[Work], times: usize) {
    let mut lines: std::collections::HashMap<&str, Vec<String>> = Default::default();
    for w in work {
        if !lines.contains_key(w.run.as_str()) {
            lines.insert(&w.run, c.ran_lines(&w.run).unwrap());
        }
        let n = lines[w.run.as_str()]
            .iter()
            .filter(|l| **l == w.tag)
            .count();
        assert_eq!(n, times, "op {} ({}) started {n} times", w.op, w.tag);
    }
}

/// The `tool.late_result` event of `op` in `run`, waited for.
pub async fn late_result(c: &Cluster, via: &str, run: &str, op: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let path = format!("/v1/runs/{run}/events?limit=500");
        if let Ok(page) = timed(c.node(via).client.get(&path)).await {
            let events = page["events"].as_array().cloned().unwrap_or_default();
            let mine = |e: &&Value| e["kind"] == "tool.late_result" && e["operation_id"] == op;
            if let Some(e) = events.iter().find(mine) {
                return e.clone();
            }
        }
        assert!(Instant::now() < deadline, "no tool.late_result for {op}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A short op on `run` started through `via`: it completes on a live node
/// other than `not_on`; the op (its delivery is checked with the rest).
pub async fn next_op_runs_live(c: &Cluster, via: &str, run: &str, not_on: &str) -> Work {
    let command = vec!["true".to_owned()];
    let op = start(&c.node(via).client, run, &command).await.unwrap();
    let s = wait_op(c, via, &op, |s| s["status"] == "completed").await;
    assert_eq!(s["exit_code"], 0, "{s}");
    let placed = timed(c.node(via).client.get(&format!("/v1/runs/{run}")))
        .await
        .unwrap();
    assert_ne!(placed["node"], not_on, "{placed}");
    let node = placed["node"].as_str().unwrap_or_default().to_owned();
    Work {
        run: run.to_owned(),
        op,
        tag: String::new(),
        node,
    }
}

/// Waits until every node is an active member, as `via` sees it.
pub async fn all_active(c: &Cluster, via: &str) {
    for n in &c.nodes {
        let active = |m: &Value| m["state"] == "active";
        c.wait_member(via, &n.name, active, Duration::from_secs(90))
            .await
            .unwrap();
    }
}

/// A node's current epoch, as `via` sees it.
pub async fn epoch(c: &Cluster, via: &str, node: &str) -> i64 {
    let row = c
        .wait_member(via, node, |_| true, Duration::from_secs(30))
        .await
        .unwrap();
    row["epoch"].as_i64().unwrap()
}

/// A start through `via` while the store is away: refused as a store
/// outage (answered within 30 s). Its run, for [`never_recorded`].
pub async fn refused_start(c: &Cluster, via: &str) -> String {
    let run = unique_run("refused");
    let body = json!({"command": gated("refused"), "background": true, "timeout_sec": 600});
    let path = format!("/v1/runs/{run}/tools/run_command");
    let sent = c
        .node(via)
        .client
        .request(reqwest::Method::POST, &path, Some(&body), &[]);
    let (status, v) = tokio::time::timeout(Duration::from_secs(30), sent)
        .await
        .expect("a start without the store is answered")
        .unwrap();
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (503, Some("store_unavailable")),
        "a start without the store: {v}"
    );
    run
}

/// The refused start of `run` left no op (as `via` sees it).
pub async fn never_recorded(c: &Cluster, via: &str, run: &str) {
    let ops = timed(c.node(via).client.get(&format!("/v1/ops?run={run}")))
        .await
        .unwrap();
    assert_eq!(
        ops["operations"],
        json!([]),
        "the refused start was recorded: {ops}"
    );
}
