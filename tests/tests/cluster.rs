#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Two cluster nodes (SPEC §20) sharing one PostgreSQL control plane on
//! this host: two kernel processes, each with its own home, scratch dirs
//! and containers (on the one Docker engine; each home owns only its
//! own). Any node answers any call; runs are spread over the nodes; a
//! killed node's lease lapses and a live node settles its ops: claimed
//! ones `lost`, and the next op of its runs runs on a live node. (The
//! Docker-in-Docker harness of separate engines is SPEC §20's next step.)

use std::time::{Duration, Instant};

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::unique_run;
use serde_json::{json, Value};

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A node on the control plane at `store`, with `token` as its operator
/// token when given (a cluster shares one: each node's home holds it).
async fn node(name: &str, store: &str, token: Option<&str>) -> KernelProcess {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let url = format!("http://{listen}");
    let env = [
        ("OPKERNEL_STORE", store),
        ("OPKERNEL_NODE", name),
        ("OPKERNEL_ADVERTISE", url.as_str()),
        ("OPKERNEL_NODE_TTL_SEC", "3"),
        ("OPKERNEL_TEST_LISTEN", listen.as_str()),
    ];
    let mut k = KernelProcess::start(&kernel_binary().unwrap(), name, &env)
        .await
        .unwrap();
    if let Some(token) = token {
        k.sigkill();
        std::fs::write(k.home.join("operator.token"), token).unwrap();
        k.spawn().await.unwrap();
    }
    k
}

async fn cluster_store() -> String {
    let server = std::env::var("OPKERNEL_TEST_PG").expect(
        "the cluster tests need a PostgreSQL server: OPKERNEL_TEST_PG (scripts/pg.sh start)",
    );
    opkernel::store::db::pgpool::create_test_database(&server)
        .await
        .unwrap()
}

async fn nodes(k: &KernelProcess) -> Vec<Value> {
    let list = k.client.get("/v1/nodes").await.unwrap();
    list["nodes"].as_array().cloned().unwrap()
}

/// Waits until `pred` holds for the op as `k` sees it.
async fn wait_op(k: &KernelProcess, op: &str, pred: impl Fn(&Value) -> bool) -> Value {
    k.wait_state(op, Duration::from_secs(60), pred)
        .await
        .unwrap()
}

#[tokio::test]
async fn two_nodes_share_the_work_and_a_killed_nodes_ops_are_settled_by_the_other() {
    let store = cluster_store().await;
    let n1 = node("n1", &store, None).await;
    let token = std::fs::read_to_string(n1.home.join("operator.token")).unwrap();
    let mut n2 = node("n2", &store, Some(token.trim())).await;
    let listed = nodes(&n2).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().all(|n| n["state"] == "active"), "{listed:?}");
    // the operator drains a node (no new runs there) and lets it take runs again
    let drained = n1
        .client
        .post("/v1/nodes/n2/drain", &json!({}))
        .await
        .unwrap();
    assert_eq!(drained["state"], "draining", "{drained}");
    let back = n2
        .client
        .post("/v1/nodes/n2/activate", &json!({}))
        .await
        .unwrap();
    assert_eq!(back["state"], "active", "{back}");
    let metrics = String::from_utf8(n1.client.get_bytes("/metrics").await.unwrap()).unwrap();
    assert!(
        metrics.contains("opkernel_node_lease_age_seconds{node=\"n2\"}"),
        "{metrics}"
    );
    // four runs, every start sent to n1: two are placed on each node
    let runs: Vec<String> = (0..4).map(|i| unique_run(&format!("c{i}"))).collect();
    // each op runs until a file appears in its run's scratch: the test
    // decides when it ends (also while its node is down)
    let gated = [
        "sh",
        "-c",
        "while [ ! -e /scratch/go ]; do sleep 0.2; done; exit 7",
    ];
    let mut ops = Vec::new();
    for run in &runs {
        ops.push(n1.start_bg(run, &gated, 600).await.unwrap());
    }
    let mut on_n2 = Vec::new();
    for (run, op) in runs.iter().zip(&ops) {
        let placed = n1.client.get(&format!("/v1/runs/{run}")).await.unwrap()["node"].clone();
        // running, whichever node runs it, seen from either node
        wait_op(&n2, op, |s| s["status"] == "running").await;
        if placed == "n2" {
            on_n2.push((run.clone(), op.clone()));
        }
    }
    assert_eq!(on_n2.len(), 2, "runs are spread over both nodes");
    // a foreground command through n1 for a run on n2: answered by n1
    let (run2, _) = &on_n2[0];
    let fg = n1
        .client
        .post(
            &format!("/v1/runs/{run2}/tools/run_command"),
            &json!({"command": ["sh", "-c", "echo from-n2"]}),
        )
        .await
        .unwrap();
    assert_eq!(fg["exit_code"], 0, "{fg}");
    assert_eq!(fg["output"], "from-n2\n", "{fg}");
    // its log lives on n2: read through n1, forwarded with the caller's token
    let fg_id = fg["operation_id"].as_str().unwrap();
    let log = n1
        .client
        .get_bytes(&format!("/v1/operations/{fg_id}/log"))
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&log), "from-n2\n");
    // a kill taken by n1 reaches the op on n2
    let (_, killed) = &on_n2[1];
    n1.client
        .post(
            &format!("/v1/runs/{}/tools/kill_operation", on_n2[1].0),
            &json!({ "operation_id": killed }),
        )
        .await
        .unwrap();
    let k = wait_op(&n1, killed, |s| s["status"] == "completed").await;
    assert_eq!(k["killed"], true, "{k}");
    // n2 dies: n1 declares it dead within the lease, its running op lost
    let (run_a, op_a) = on_n2[0].clone();
    let killed_at = Instant::now();
    n2.sigkill();
    let lost = wait_op(&n1, &op_a, |s| s["status"] == "lost").await;
    let detected = killed_at.elapsed();
    assert_eq!(lost["effect"], "uncertain");
    assert!(
        lost["message"]
            .as_str()
            .unwrap_or_default()
            .contains("node n2 lost")
            || lost.to_string().contains("node n2 lost"),
        "{lost}"
    );
    assert!(
        detected < Duration::from_secs(10),
        "dead after {detected:?}"
    );
    // its logs went with it: a clear 503, not an empty log
    let gone = n1
        .client
        .get_bytes(&format!("/v1/operations/{fg_id}/log"))
        .await;
    let why = format!("{:#}", gone.unwrap_err());
    assert!(
        why.contains("node_unavailable") || why.contains("503"),
        "{why}"
    );
    let dead = nodes(&n1).await;
    assert_eq!(
        dead.iter().find(|n| n["name"] == "n2").unwrap()["state"],
        "dead"
    );
    // n1's own ops run on
    for (run, op) in runs.iter().zip(&ops) {
        if !on_n2.iter().any(|(r, _)| r == run) {
            assert_eq!(n1.state(op).await.unwrap()["status"], "running");
        }
    }
    // the dead node's run goes on, on a live node
    let next = n1.start_bg(&run_a, &["true"], 60).await.unwrap();
    let done = n1
        .wait_terminal(&next, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    let placed = n1.client.get(&format!("/v1/runs/{run_a}")).await.unwrap();
    assert_eq!(placed["node"], "n1", "{placed}");
    // the lost op is reported once, like every result
    let delivered = n1
        .collect_deliveries(&run_a, 2, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(delivered.len(), 2, "{delivered:?}");
    // the lost op ends for real while n2 is down; n2 comes back with a new
    // epoch, claims nothing of what was settled, and records the real end
    // as tool.late_result: the op stays lost
    let go = n2
        .home
        .join("scratch")
        .join(sandbox::profile::scratch_key(&run_a))
        .join("go");
    std::fs::write(&go, b"").unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    n2.spawn().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let late = loop {
        let page = n1
            .client
            .get(&format!("/v1/runs/{run_a}/events?limit=500"))
            .await
            .unwrap();
        let found = page["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "tool.late_result")
            .cloned();
        if let Some(e) = found {
            break e;
        }
        assert!(Instant::now() < deadline, "no late result: {page}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(late["operation_id"], op_a.as_str(), "{late}");
    assert_eq!(late["data"]["exit_code"], 7, "{late}");
    assert_eq!(late["data"]["node"], "n2", "{late}");
    let back = nodes(&n1).await;
    let n2row = back.iter().find(|n| n["name"] == "n2").unwrap();
    assert_eq!(n2row["state"], "active", "{n2row}");
    assert!(n2row["epoch"].as_i64().unwrap() >= 3, "{n2row}");
    assert_eq!(n1.state(&op_a).await.unwrap()["status"], "lost");
}

/// The op's state through `k`, waiting out the store's 503s.
async fn state_through_outage(k: &KernelProcess, op: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match k.state(op).await {
            Ok(s) => return s,
            Err(e) => assert!(Instant::now() < deadline, "{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_store_outage_longer_than_the_lease_loses_nothing() {
    let pg = opkernel::drills::pgserver::PgServer::start().unwrap();
    let store = pg.url();
    let n1 = node("n1", &store, None).await;
    let token = std::fs::read_to_string(n1.home.join("operator.token")).unwrap();
    let n2 = node("n2", &store, Some(token.trim())).await;
    let gated = [
        "sh",
        "-c",
        "while [ ! -e /scratch/go ]; do sleep 0.2; done; exit 7",
    ];
    let mut ops = Vec::new();
    for i in 0..4 {
        let run = unique_run(&format!("o{i}"));
        let op = n1.start_bg(&run, &gated, 600).await.unwrap();
        wait_op(&n1, &op, |s| s["status"] == "running").await;
        let placed = n1.client.get(&format!("/v1/runs/{run}")).await.unwrap()["node"].clone();
        ops.push((run, op, placed));
    }
    // the database gone for more than twice the lease: every node finds
    // its lease lapsed, joins again, and none is declared dead for it
    pg.kill().unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    pg.resume().unwrap();
    // a few lease rounds after the return: every op still runs
    tokio::time::sleep(Duration::from_secs(6)).await;
    for (_, op, _) in &ops {
        let s = state_through_outage(&n2, op).await;
        assert_eq!(s["status"], "running", "{s}");
    }
    let listed = nodes(&n1).await;
    assert!(listed.iter().all(|n| n["state"] == "active"), "{listed:?}");
    // each ends with its real code, on its own node
    for (run, op, placed) in &ops {
        let home = if placed == "n1" { &n1.home } else { &n2.home };
        let go = home
            .join("scratch")
            .join(sandbox::profile::scratch_key(run))
            .join("go");
        std::fs::write(go, b"").unwrap();
        let done = n1.wait_terminal(op, Duration::from_secs(60)).await.unwrap();
        assert_eq!(
            (done["status"].clone(), done["exit_code"].clone()),
            (json!("completed"), json!(7)),
            "{done}"
        );
    }
}
