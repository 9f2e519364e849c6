//! The invariants `cluster-chaos` checks once every fault healed: every op
//! settled once, with no false exit code; no command ran twice (its own
//! record); only claimed ops of faulted nodes `lost`; every background
//! result delivered once; every resolution posted to the webhook at least
//! once (duplicates counted); no process of a settled op still running;
//! no container beyond the pool and the runs on any node; bindings, nodes
//! and ops rows consistent.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use opkernel_tests::cluster::{docker, timed, Cluster};
use serde_json::{json, Value};

use super::chaos::Posts;

/// Op id → (run, background), as the drill started them.
type Ops = BTreeMap<String, (String, bool)>;

/// Waits until every op is terminal; their final views.
async fn settled(c: &Cluster, ops: &Ops) -> HashMap<String, Value> {
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut done = HashMap::new();
    while done.len() < ops.len() {
        for (i, id) in ops.keys().enumerate() {
            if done.contains_key(id) {
                continue;
            }
            let via = &c.nodes[i % c.nodes.len()].client;
            if let Ok(v) = timed(via.get(&format!("/v1/operations/{id}"))).await {
                if v["live"] == false {
                    done.insert(id.clone(), v);
                }
            }
        }
        if Instant::now() > deadline {
            let mut left = Vec::new();
            for id in ops.keys().filter(|id| !done.contains_key(*id)) {
                let via = &c.nodes[0].client;
                left.push(timed(via.get(&format!("/v1/operations/{id}"))).await.ok());
            }
            panic!("not settled: {left:#?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    done
}

/// Drains every run's reports (acking each) until each background op was
/// seen, then a few more rounds: how many times each was delivered.
async fn delivered(c: &Cluster, ops: &Ops) -> HashMap<String, usize> {
    let runs: HashSet<&String> = ops.values().map(|(r, _)| r).collect();
    let want = ops.values().filter(|(_, bg)| *bg).count();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let (deadline, mut extra) = (Instant::now() + Duration::from_secs(120), 0);
    while extra < 3 && Instant::now() < deadline {
        if seen.len() >= want {
            extra += 1;
        }
        for run in &runs {
            let client = &c.nodes[extra % c.nodes.len()].client;
            let Ok(r) = timed(client.get(&format!("/v1/runs/{run}/report?wait=0"))).await else {
                continue;
            };
            for item in r["resolved"].as_array().into_iter().flatten() {
                let id = item["operation_id"].as_str().unwrap_or_default().to_owned();
                *seen.entry(id).or_default() += 1;
            }
            if let Some(report) = r["report_id"].as_str() {
                let ack = format!("/v1/runs/{run}/report/{report}/ack");
                let _ = timed(client.post(&ack, &json!({}))).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    seen
}

/// The ids of marked processes (`__OPKERNEL_OP=` in their environment)
/// still running on `node`.
fn marked_on(c: &Cluster, node: &str) -> HashSet<String> {
    let script = "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f 2>/dev/null \
                  | sed -n 's/^__OPKERNEL_OP=//p'; done | sort -u";
    let out = c.on_node(node, script).unwrap_or_default();
    out.lines().map(str::to_owned).collect()
}

/// One SQL answer of the store (through its container's `psql`).
fn sql(c: &Cluster, query: &str) -> String {
    docker(&[
        "exec",
        &c.store_container(),
        "psql",
        "-h",
        "127.0.0.1",
        "-U",
        "opkernel",
        "-d",
        "opkernel",
        "-Atc",
        query,
    ])
    .unwrap()
    .trim()
    .to_owned()
}

/// Checks every invariant; the number of ops `lost`.
pub async fn check(c: &Cluster, ops: &Ops, faulted: &HashSet<String>, posts: &Posts) -> usize {
    let views = settled(c, ops).await;
    // executions by the commands' own records, on every node
    let mut ran: HashMap<String, usize> = HashMap::new();
    for run in ops.values().map(|(r, _)| r).collect::<HashSet<_>>() {
        for line in c.ran_lines(run).unwrap() {
            *ran.entry(line).or_default() += 1;
        }
    }
    let mut lost = 0;
    for (id, v) in &views {
        let times = ran.get(id).copied().unwrap_or(0);
        match v["status"].as_str().unwrap() {
            "completed" => {
                assert_eq!((v["exit_code"].clone(), times), (json!(0), 1), "{v}");
            }
            "lost" => {
                lost += 1;
                assert!(times <= 1, "ran {times} times: {v}");
                let why = v["message"].as_str().unwrap_or_default();
                let on_faulted = faulted
                    .iter()
                    .any(|n| why.contains(&format!("node {n} lost")));
                assert!(
                    on_faulted,
                    "lost but its node was not faulted ({faulted:?}): {v}"
                );
                assert_eq!(v["exit_code"], Value::Null, "{v}");
            }
            "failed" | "denied" => assert_eq!(times, 0, "ran though {v}"),
            other => panic!("an op ended {other}: {v}"),
        }
    }
    let seen = delivered(c, ops).await;
    for (id, (_, background)) in ops {
        let want = usize::from(*background);
        assert_eq!(
            seen.get(id).copied().unwrap_or(0),
            want,
            "{id} delivered wrongly"
        );
    }
    webhooks(ops, &views, posts).await;
    for n in &c.nodes {
        let marked = marked_on(c, &n.name);
        let settled: Vec<&String> = marked.iter().filter(|id| views.contains_key(*id)).collect();
        assert!(
            settled.is_empty(),
            "settled ops still running on {}: {settled:?}",
            n.name
        );
        let containers = c
            .on_node(
                &n.name,
                "docker ps -q --filter label=opkernel.managed=true | wc -l",
            )
            .unwrap();
        // at most the pool (2), a container per run that ever ran there
        // (no run of the drills finished), and one being made
        let count: usize = containers.trim().parse().unwrap();
        let runs = format!(
            "SELECT COUNT(DISTINCT run_id) FROM ops WHERE node = '{}'",
            n.name
        );
        let runs: usize = sql(c, &runs).parse().unwrap();
        assert!(
            count <= 3 + runs,
            "{count} containers on {} for {runs} runs",
            n.name
        );
    }
    let orphans = sql(
        c,
        "SELECT COUNT(*) FROM container_bindings b WHERE b.node IS NULL \
                          OR NOT EXISTS (SELECT 1 FROM nodes n WHERE n.name = b.node)",
    );
    assert_eq!(orphans, "0", "bindings of no node");
    let live = sql(
        c,
        "SELECT COUNT(*) FROM ops WHERE status IN ('starting', 'running')",
    );
    assert_eq!(live, "0", "live ops after the drill");
    let dead = sql(c, "SELECT COUNT(*) FROM nodes WHERE state <> 'active'");
    assert_eq!(dead, "0", "a node not active at the end");
    lost
}

/// Every background op's resolution reached the receiver at least once;
/// duplicates (the same delivery id again) are counted and printed.
async fn webhooks(ops: &Ops, views: &HashMap<String, Value>, posts: &Posts) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let taken = posts.lock().unwrap().clone();
        let resolved: HashSet<&str> = taken
            .iter()
            .filter(|p| matches!(p["type"].as_str(), Some("tool.completed" | "tool.failed")))
            .filter_map(|p| p["operation_id"].as_str())
            .collect();
        let missing: Vec<&String> = ops
            .iter()
            .filter(|(id, (_, bg))| *bg && views[*id]["status"] != "denied")
            .map(|(id, _)| id)
            .filter(|id| !resolved.contains(id.as_str()))
            .collect();
        if missing.is_empty() {
            let mut ids: HashMap<&str, usize> = HashMap::new();
            for p in &taken {
                *ids.entry(p["id"].as_str().unwrap_or_default()).or_default() += 1;
            }
            let duplicated = ids.values().filter(|&&n| n > 1).count();
            eprintln!(
                "cluster-chaos: {} webhook posts, {duplicated} duplicated",
                taken.len()
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "resolutions never posted: {missing:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
