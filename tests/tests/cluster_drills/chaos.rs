//! Drill `cluster-chaos` (SPEC §24): three nodes with the defaults on (the
//! warm pool, short retentions, webhooks to a receiver of the drill's own,
//! a schedule, an approval rule), a steady workload of background and
//! foreground ops whose commands record their own execution (their op id,
//! from the kernel's marker, appended to the run's `ran` file), and for a
//! given time random faults one after another: node kill, node pause and
//! network cut shorter and longer than the lease, kernel SIGKILL and
//! SIGTERM restarts inside a node, a store stop. Then everything heals and
//! the invariants are checked (see [`check`]); the figures are printed.
//! `OPKERNEL_CHAOS_SECONDS` sets the time (CI: a short run).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opkernel_tests::cluster::{docker, timed, Cluster};
use opkernel_tests::unique_run;
use serde_json::{json, Value};

use super::{all_active, TTL};

/// The webhook posts the drill's receiver took (each body, as it came).
pub type Posts = Arc<Mutex<Vec<Value>>>;

/// The drill's webhook receiver, listening before the cluster starts
/// (the nodes reach it through their network's gateway); its port.
pub async fn receiver(posts: Posts) -> u16 {
    use axum::routing::post;
    async fn take(
        axum::extract::State(posts): axum::extract::State<Posts>,
        body: axum::Json<Value>,
    ) -> &'static str {
        posts.lock().unwrap().push(body.0);
        "ok"
    }
    let app = axum::Router::new()
        .route("/hook", post(take))
        .with_state(posts);
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// What the workload started: op id → (run, background).
type Started = Arc<Mutex<BTreeMap<String, (String, bool)>>>;

/// A small deterministic generator (the seed is printed: a failing run
/// can be replayed with `OPKERNEL_CHAOS_SEED`).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The command every op runs: its own record, then a short wait.
fn command(extra: &str) -> Vec<String> {
    let script = format!(
        "echo \"$__OPKERNEL_OP\" >> /scratch/ran; sleep 0.{}",
        3 + extra.len() % 5
    );
    let mut argv = vec!["sh".to_owned(), "-c".to_owned(), script];
    if !extra.is_empty() {
        argv.push(extra.to_owned());
    }
    argv
}

/// Starts one op through `via` with a key of its own, sent again with the
/// same key until it is answered (the answer after a cut may be an op
/// that committed): at most once whatever the faults.
async fn start_once(
    c: &Cluster,
    via: usize,
    run: &str,
    background: bool,
    extra: &str,
) -> Option<Value> {
    let key = uuid::Uuid::new_v4().to_string();
    let body = json!({"command": command(extra), "background": background, "timeout_sec": 120});
    let path = format!("/v1/runs/{run}/tools/run_command");
    let headers = [("Idempotency-Key", key.as_str())];
    for attempt in 0..40 {
        let node = &c.nodes[(via + attempt) % c.nodes.len()];
        let sent = node
            .client
            .request(reqwest::Method::POST, &path, Some(&body), &headers);
        match tokio::time::timeout(Duration::from_secs(10), sent).await {
            Ok(Ok((200, v))) => return Some(v),
            // refused for good (a limit): nothing was admitted
            Ok(Ok((s, _))) if (400..500).contains(&s) => return None,
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    panic!("a start with key {key} was never answered");
}

/// The workload: a start every ~250 ms through a node in turn, mostly in
/// the background, some in the foreground, some held for approval (and
/// approved a moment later), until `stop`.
async fn workload(c: Arc<Cluster>, runs: Vec<String>, started: Started, stop: Arc<AtomicBool>) {
    let mut held: Vec<(String, Instant)> = Vec::new();
    let mut i = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let run = &runs[i % runs.len()];
        let (background, extra) = match i % 10 {
            0 => (false, ""),
            5 => (true, "needs-approval"),
            _ => (true, ""),
        };
        if let Some(v) = start_once(&c, i, run, background, extra).await {
            let id = v["operation_id"].as_str().unwrap_or_default().to_owned();
            if v["status"] == "awaiting_approval" {
                held.push((id.clone(), Instant::now()));
            }
            started
                .lock()
                .unwrap()
                .insert(id, (run.clone(), background));
        }
        approve_due(&c, &mut held, i, Duration::from_secs(1)).await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // every held op approved before the checks (a node may be down now)
    let deadline = Instant::now() + Duration::from_secs(120);
    while !held.is_empty() && Instant::now() < deadline {
        approve_due(&c, &mut held, i, Duration::ZERO).await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(held.is_empty(), "held ops never approved: {held:?}");
    // an op the workload did not see held (its start's answer was a
    // retry's) or whose approval a fault refused is still waiting: the
    // operator's list names it, and it is approved from there
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let node = &c.nodes[i % c.nodes.len()];
        i += 1;
        let Ok(waiting) = timed(node.client.get("/v1/approvals")).await else {
            assert!(Instant::now() < deadline, "no node lists the waiting ops");
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let ids: Vec<String> = waiting["operations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o["operation_id"].as_str().map(str::to_owned))
            .collect();
        if ids.is_empty() {
            break;
        }
        eprintln!(
            "chaos: {} op(s) still waiting for approval: {ids:?}",
            ids.len()
        );
        assert!(
            Instant::now() < deadline,
            "ops left waiting for approval: {ids:?}"
        );
        held.extend(ids.into_iter().map(|id| (id, Instant::now())));
        approve_due(&c, &mut held, i, Duration::ZERO).await;
        held.clear();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Approves the held ops older than `after` (through a node in turn);
/// those not answered stay held for the next call.
async fn approve_due(c: &Cluster, held: &mut Vec<(String, Instant)>, i: usize, after: Duration) {
    let mut still = Vec::new();
    for (id, since) in held.drain(..) {
        if since.elapsed() < after {
            still.push((id, since));
            continue;
        }
        let node = &c.nodes[i % c.nodes.len()];
        let path = format!("/v1/operations/{id}/approve");
        match timed(node.client.post(&path, &json!({}))).await {
            Ok(_) => {}
            Err(e) if format!("{e:#}").contains("409") => {}
            Err(_) => still.push((id, since)),
        }
    }
    *held = still;
}

/// One random fault on a random node, healed before it returns; its name.
async fn fault(c: &Cluster, rng: &mut Rng, faulted: &mut HashSet<String>) -> &'static str {
    let node = c.nodes[rng.below(c.nodes.len() as u64) as usize]
        .name
        .clone();
    let container = c.node(&node).container.clone();
    let lease = Duration::from_secs(TTL);
    let kind = match rng.below(8) {
        0 => {
            docker(&["kill", &container]).unwrap();
            faulted.insert(node.clone());
            tokio::time::sleep(lease * 2).await;
            docker(&["start", &container]).unwrap();
            "node-kill"
        }
        1 | 2 => {
            let long = rng.below(2) == 1;
            docker(&["pause", &container]).unwrap();
            tokio::time::sleep(if long {
                lease + lease / 2
            } else {
                lease * 2 / 5
            })
            .await;
            docker(&["unpause", &container]).unwrap();
            if long {
                faulted.insert(node.clone());
            }
            if long {
                "node-pause-long"
            } else {
                "node-pause-short"
            }
        }
        3 | 4 => {
            let long = rng.below(2) == 1;
            let ip = docker(&[
                "inspect",
                "-f",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                &container,
            ])
            .unwrap();
            docker(&["network", "disconnect", &c.network, &container]).unwrap();
            tokio::time::sleep(if long {
                lease + lease / 2
            } else {
                lease * 2 / 5
            })
            .await;
            docker(&[
                "network",
                "connect",
                "--ip",
                ip.trim(),
                "--alias",
                &node,
                &c.network,
                &container,
            ])
            .unwrap();
            if long {
                faulted.insert(node.clone());
            }
            if long {
                "partition-long"
            } else {
                "partition-short"
            }
        }
        5 => {
            c.on_node(&node, "pkill -KILL -x opkernel || true").unwrap();
            "kernel-sigkill"
        }
        6 => {
            c.restart_kernel(&node).await.unwrap();
            "kernel-sigterm"
        }
        _ => {
            docker(&["stop", "-t", "1", &c.store_container()]).unwrap();
            tokio::time::sleep(Duration::from_secs(4)).await;
            docker(&["start", &c.store_container()]).unwrap();
            "store-stop"
        }
    };
    // a lapsed lease may be swept as the fault heals: a node cut off for
    // about a lease counts as faulted whatever the draw said
    for n in &c.nodes {
        c.wait_answers(&n.name).await.unwrap();
    }
    kind
}

/// Runs the drill for `seconds`, then checks it.
pub async fn cluster_chaos(c: Arc<Cluster>, seconds: u64, posts: Posts) {
    let seed = std::env::var("OPKERNEL_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::process::id() as u64 * 7919 + 17);
    eprintln!("cluster-chaos: {seconds} s, seed {seed}");
    let mut rng = Rng(seed.max(1));
    let runs: Vec<String> = (0..6).map(|_| unique_run("chaos")).collect();
    let sched_run = unique_run("chaos-sched");
    let n1 = &c.node("n1").client;
    let body = json!({"command": command(""), "every_sec": 2});
    let schedule = timed(n1.post(&format!("/v1/runs/{sched_run}/schedules"), &body))
        .await
        .unwrap();
    let started: Started = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(workload(
        c.clone(),
        runs.clone(),
        started.clone(),
        stop.clone(),
    ));
    let (mut faults, mut faulted): (BTreeMap<&str, usize>, HashSet<String>) = Default::default();
    let until = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(2 + rng.below(3))).await;
        *faults
            .entry(fault(&c, &mut rng, &mut faulted).await)
            .or_default() += 1;
    }
    stop.store(true, Ordering::SeqCst);
    load.await.unwrap();
    let id = schedule["schedule_id"].as_str().unwrap();
    let pause = format!("/v1/runs/{sched_run}/schedules/{id}/pause");
    timed(n1.post(&pause, &json!({}))).await.unwrap();
    all_active(&c, "n1").await;
    let mut ops = started.lock().unwrap().clone();
    let fired = timed(n1.get(&format!("/v1/ops?run={sched_run}&limit=1000")))
        .await
        .unwrap();
    for op in fired["operations"].as_array().unwrap() {
        ops.insert(
            op["operation_id"].as_str().unwrap().to_owned(),
            (sched_run.clone(), true),
        );
    }
    let lost = super::chaos_check::check(&c, &ops, &faulted, &posts).await;
    eprintln!(
        "cluster-chaos: {} ops ({} scheduled), faults {faults:?} on {faulted:?}, lost {lost}, webhook posts {}",
        ops.len(),
        fired["operations"].as_array().unwrap().len(),
        posts.lock().unwrap().len()
    );
}
