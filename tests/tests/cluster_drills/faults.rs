//! The drills themselves: each leaves every node active again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{
    all_active, all_delivered_once, ends, epoch, late_result, never_recorded, next_op_runs_live,
    place_on, refused_start, release, started, state, wait_op, Work, TTL,
};
use opkernel_tests::cluster::{docker, gated, start, timed, Cluster};
use opkernel_tests::unique_run;

/// Any node answers any call: the member list, a foreground command and its
/// log for a run on another node, a kill taken by one node for an op on
/// another, drain and activate, the lease-age metric.
pub async fn any_node_serves(c: &Cluster) {
    for n in &c.nodes {
        let members = c.members(&n.name).await.unwrap();
        assert_eq!(members.len(), 3, "{members:?}");
    }
    let on_n2 = place_on(c, "n2", 1).await;
    let on_n3 = place_on(c, "n3", 1).await;
    let n1 = &c.node("n1").client;
    let body = json!({"command": ["sh", "-c", "echo from-n2"]});
    let path = format!("/v1/runs/{}/tools/run_command", on_n2[0].run);
    let fg = timed(n1.post(&path, &body)).await.unwrap();
    assert_eq!(
        (fg["exit_code"].clone(), fg["output"].clone()),
        (json!(0), json!("from-n2\n")),
        "{fg}"
    );
    assert_eq!(fg["node"], "n2", "an op's view names its node: {fg}");
    let log_path = format!(
        "/v1/operations/{}/log",
        fg["operation_id"].as_str().unwrap()
    );
    let log = timed(n1.get_bytes(&log_path)).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&log), "from-n2\n");
    // its console too, with the answer's own headers
    let console = format!(
        "{}/v1/operations/{}/console",
        n1.base(),
        fg["operation_id"].as_str().unwrap()
    );
    let sse = opkernel::base::tls::client()
        .build()
        .unwrap()
        .get(&console)
        .bearer_auth(n1.token())
        .send();
    let sse = tokio::time::timeout(Duration::from_secs(10), sse)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sse.status(), 200);
    assert_eq!(sse.headers()["content-type"], "text/event-stream");
    assert_eq!(sse.headers()["cache-control"], "no-cache");
    let first = tokio::time::timeout(Duration::from_secs(10), sse.text())
        .await
        .unwrap()
        .unwrap();
    assert!(first.contains("from-n2"), "{first}");
    interactive_through_any_node(c, &on_n2[0].run).await;
    // a one-shot runs on the node that took it, which removes its container
    one_shot_leaves_nothing(c, "n3").await;
    // a draining node too: it runs it itself (SPEC §24), never leaving its
    // container to another node's reaper
    let n3 = &c.node("n3").client;
    timed(n3.post("/v1/nodes/n3/drain", &json!({})))
        .await
        .unwrap();
    one_shot_leaves_nothing(c, "n3").await;
    timed(n3.post("/v1/nodes/n3/activate", &json!({})))
        .await
        .unwrap();
    let kill = format!("/v1/runs/{}/tools/kill_operation", on_n3[0].run);
    timed(n1.post(&kill, &json!({"operation_id": on_n3[0].op})))
        .await
        .unwrap();
    let killed = wait_op(c, "n2", &on_n3[0].op, |s| s["status"] == "completed").await;
    assert_eq!(killed["killed"], true, "{killed}");
    let metrics = timed(n1.get_bytes("/metrics")).await.unwrap();
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("opkernel_node_lease_age_seconds{node=\"n3\"}"),
        "{metrics}"
    );
    operator_views_cover_the_cluster(c, &on_n2[0].run).await;
    release(c, &on_n2);
    ends(c, "n3", &on_n2, "completed", json!(7)).await;
    all_delivered_once(c, "n1", &[on_n2, on_n3].concat()).await;
}

/// An op with stdin on n2 (its run's node), talked to through n1 and n3
/// (SPEC §25): each call is forwarded to n2, whose FIFO and log they are.
async fn interactive_through_any_node(c: &Cluster, run: &str) {
    let (n1, n3) = (&c.node("n1").client, &c.node("n3").client);
    let path = |tool: &str| format!("/v1/runs/{run}/tools/{tool}");
    let body = json!({"command": ["cat"], "background": true, "stdin": true});
    let started = timed(n1.post(&path("run_command"), &body)).await.unwrap();
    let op = started["operation_id"].as_str().unwrap().to_owned();
    let body = json!({"operation_id": op, "text": "via-n3\n", "yield_ms": 5000});
    let written = timed(n3.post(&path("write_stdin"), &body)).await.unwrap();
    assert_eq!(written["output"], "via-n3\n", "{written}");
    let body = json!({"operation_id": op});
    let read = timed(n1.post(&path("read_output"), &body)).await.unwrap();
    assert_eq!(read["output"], "via-n3\n", "{read}");
    let body = json!({"operation_id": op, "eof": true, "yield_ms": 5000});
    let closed = timed(n1.post(&path("write_stdin"), &body)).await.unwrap();
    assert_eq!(closed["status"], "completed", "{closed}");
}

/// A one-shot taken by `node` runs there and leaves no container on any
/// node.
async fn one_shot_leaves_nothing(c: &Cluster, node: &str) {
    let once = timed(c.node(node).client.post(
        "/v1/tools/run_command",
        &json!({"command": ["echo", "once"]}),
    ))
    .await
    .unwrap();
    assert_eq!(once["output"], "once\n", "{once}");
    assert_eq!(once["node"], node, "{once}");
    let label = format!("label=opkernel.run_id={}", once["run_id"].as_str().unwrap());
    for n in &c.nodes {
        let left = c
            .on_node(&n.name, &format!("docker ps -aq --filter {label}"))
            .unwrap();
        assert_eq!(left.trim(), "", "a one-shot container left on {}", n.name);
    }
}

/// SPEC §24: containers, inspect and reap through any node answer for
/// every node, each container and decision naming its node; an op's view
/// names its node too.
async fn operator_views_cover_the_cluster(c: &Cluster, run_on_n2: &str) {
    let n1 = &c.node("n1").client;
    let list = timed(n1.get("/v1/containers")).await.unwrap();
    let containers = list["containers"].as_array().unwrap();
    let on_n2: Vec<&Value> = containers
        .iter()
        .filter(|x| x["run_id"] == run_on_n2)
        .collect();
    assert_eq!(
        on_n2.len(),
        1,
        "n2's run container listed through n1: {list}"
    );
    assert_eq!(on_n2[0]["node"], "n2", "{list}");
    for node in ["n1", "n2", "n3"] {
        assert!(
            containers.iter().any(|x| x["node"] == node),
            "no container of {node} listed: {list}"
        );
    }
    assert!(list.get("unreachable").is_none(), "{list}");
    let id = on_n2[0]["container_id"].as_str().unwrap();
    let inspected = timed(n1.get(&format!("/v1/containers/{id}")))
        .await
        .unwrap();
    assert_eq!(inspected["run_id"], run_on_n2, "{inspected}");
    let reap = timed(n1.post("/v1/reap?dry_run=true", &json!({})))
        .await
        .unwrap();
    let decided: Vec<&Value> = reap["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["container_id"] == id)
        .collect();
    assert_eq!(decided.len(), 1, "{reap}");
    assert_eq!(
        (decided[0]["node"].clone(), decided[0]["action"].clone()),
        (json!("n2"), json!("keep")),
        "{reap}"
    );
}

/// `docker kill` of a node with live ops spread over all nodes: it is
/// declared dead within the lease, only its claimed ops are `lost`, the
/// others end with their real code, its runs go on elsewhere, and it comes
/// back with a new epoch.
pub async fn node_kill(c: &Cluster) {
    let victim = "n3";
    let mut work = place_on(c, "n1", 1).await;
    work.extend(place_on(c, "n2", 1).await);
    let theirs = place_on(c, victim, 2).await;
    let fg = format!("/v1/runs/{}/tools/run_command", theirs[0].run);
    let fg = timed(c.node("n1").client.post(&fg, &json!({"command": ["true"]})))
        .await
        .unwrap();
    let before = epoch(c, "n1", victim).await;
    let killed_at = Instant::now();
    docker(&["kill", &c.node(victim).container]).unwrap();
    let dead = |m: &Value| m["state"] == "dead";
    c.wait_member("n1", victim, dead, Duration::from_secs(3 * TTL + 10))
        .await
        .unwrap();
    eprintln!(
        "node-kill: {victim} declared dead {:?} after docker kill (lease {TTL} s)",
        killed_at.elapsed()
    );
    for w in &theirs {
        let s = wait_op(c, "n1", &w.op, |s| s["status"] == "lost").await;
        assert_eq!(
            (s["effect"].clone(), s["exit_code"].clone()),
            (json!("uncertain"), Value::Null),
            "{s}"
        );
        assert!(s.to_string().contains("node n3 lost"), "{s}");
    }
    // its logs went with it: a clear 503, not an empty log
    let log = format!(
        "/v1/operations/{}/log",
        fg["operation_id"].as_str().unwrap()
    );
    let gone = timed(c.node("n1").client.get_bytes(&log))
        .await
        .unwrap_err();
    assert!(format!("{gone:#}").contains("503"), "{gone:#}");
    for w in &work {
        assert_eq!(state(c, "n2", &w.op).await.unwrap()["status"], "running");
    }
    release(c, &work);
    ends(c, "n1", &work, "completed", json!(7)).await;
    let mut next = Vec::new();
    for w in &theirs {
        next.push(next_op_runs_live(c, "n2", &w.run, victim).await);
    }
    all_delivered_once(c, "n2", &[work.clone(), theirs.clone(), next].concat()).await;
    docker(&["start", &c.node(victim).container]).unwrap();
    let back = |m: &Value| m["state"] == "active" && m["epoch"].as_i64() > Some(before);
    c.wait_member("n1", victim, back, Duration::from_secs(120))
        .await
        .unwrap();
    c.wait_answers(victim).await.unwrap();
    for w in &theirs {
        assert_eq!(state(c, "n3", &w.op).await.unwrap()["status"], "lost");
    }
    // counted once the victim is back: its return ran nothing again
    tokio::time::sleep(Duration::from_secs(2)).await;
    started(c, &[work, theirs.clone()].concat(), 1);
}

/// How a node is cut off: frozen whole, or its network disconnected.
#[derive(Debug, Clone, Copy)]
pub enum Cut {
    Pause,
    Partition,
}

impl Cut {
    fn name(self) -> &'static str {
        match self {
            Cut::Pause => "node-pause",
            Cut::Partition => "partition",
        }
    }

    /// Cuts `node` off; the address to heal it with.
    fn apply(self, c: &Cluster, node: &str) -> String {
        let container = &c.node(node).container;
        let ip = docker(&[
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            container,
        ])
        .unwrap();
        match self {
            Cut::Pause => docker(&["pause", container]),
            Cut::Partition => docker(&["network", "disconnect", &c.network, container]),
        }
        .unwrap();
        ip.trim().to_owned()
    }

    fn heal(self, c: &Cluster, node: &str, ip: &str) {
        let container = &c.node(node).container;
        match self {
            Cut::Pause => docker(&["unpause", container]),
            Cut::Partition => docker(&[
                "network", "connect", "--ip", ip, "--alias", node, &c.network, container,
            ]),
        }
        .unwrap();
    }
}

/// `victim` cut off shorter than the lease (`long` false: nothing is lost,
/// it keeps its epoch, a start handed to it meanwhile runs once it is
/// back) or longer (its claimed ops `lost`, the start handed to it `failed`
/// and never run, its runs go on elsewhere; back, it is fenced, rejoins
/// with a new epoch and records its ops' real ends as `tool.late_result`).
pub async fn cut(c: &Cluster, kind: Cut, victim: &str, long: bool) {
    let drill = format!("{}-{}", kind.name(), if long { "long" } else { "short" });
    let other = c
        .nodes
        .iter()
        .find(|n| n.name != victim)
        .unwrap()
        .name
        .clone();
    let theirs = place_on(c, victim, 2).await;
    let bystander = place_on(c, &other, 1).await;
    let before = epoch(c, &other, victim).await;
    let cut_at = Instant::now();
    let ip = kind.apply(c, victim);
    let mut next = None;
    let tag = super::tag();
    let handed = Work {
        op: start(&c.node(&other).client, &theirs[0].run, &gated(&tag))
            .await
            .unwrap(),
        tag,
        ..theirs[0].clone()
    };
    if long {
        let dead = |m: &Value| m["state"] == "dead";
        c.wait_member(&other, victim, dead, Duration::from_secs(3 * TTL + 10))
            .await
            .unwrap();
        eprintln!(
            "{drill}: {victim} declared dead {:?} after the cut",
            cut_at.elapsed()
        );
        ends(c, &other, &theirs, "lost", Value::Null).await;
        let failed = wait_op(c, &other, &handed.op, |s| s["status"] == "failed").await;
        assert!(
            failed.to_string().contains("node lost before start"),
            "{failed}"
        );
        next = Some(next_op_runs_live(c, &other, &theirs[1].run, victim).await);
    } else {
        // two fifths of the lease: with a renewal every fifth, at least two
        // fifths of it are left to spare on a loaded machine
        let short = Duration::from_millis(TTL * 1000 * 2 / 5);
        tokio::time::sleep(short.saturating_sub(cut_at.elapsed())).await;
    }
    kind.heal(c, victim, &ip);
    let lasted = cut_at.elapsed();
    eprintln!("{drill}: healed after {lasted:?}");
    // the short cut's premise checked, not assumed: shorter than the lease
    // by a margin (else what follows would judge the wrong case)
    assert!(
        long || lasted < Duration::from_millis(TTL * 1000 * 3 / 5),
        "{drill}: the cut lasted {lasted:?}, too close to the {TTL} s lease for a short cut"
    );
    let back = |m: &Value| m["state"] == "active" && (m["epoch"].as_i64() > Some(before)) == long;
    c.wait_member(&other, victim, back, Duration::from_secs(60))
        .await
        .unwrap();
    // after a long cut the victim's lost ops are never released: the node
    // must stop them itself on its return
    match long {
        true => release(c, &bystander),
        false => release(c, &[theirs.clone(), bystander.clone()].concat()),
    }
    ends(c, &other, &bystander, "completed", json!(7)).await;
    if long {
        after_long_cut(c, &other, &theirs, &handed, next).await;
        // the bystander on the other side of the cut: delivered once
        all_delivered_once(c, &other, &bystander).await;
    } else {
        let mut all = theirs.clone();
        all.push(handed);
        ends(c, &other, &all, "completed", json!(7)).await;
        started(c, &all, 1);
        all_delivered_once(c, &other, &[all, bystander.clone()].concat()).await;
    }
    started(c, &bystander, 1);
    all_active(c, &other).await;
}

/// After a long cut: the lost ops' real ends are late results (the ops
/// stay lost), the start settled as failed never ran, everything was
/// delivered once.
async fn after_long_cut(
    c: &Cluster,
    via: &str,
    theirs: &[Work],
    handed: &Work,
    next: Option<Work>,
) {
    // back, the node stopped what its lost ops still ran before it
    // started anything (SPEC §24): their real ends are the stop's
    for w in theirs {
        let late = late_result(c, via, &w.run, &w.op).await;
        let code = late["data"]["exit_code"].as_i64();
        assert!(
            matches!(code, Some(143 | 137)),
            "stopped, not run on: {late}"
        );
        assert_eq!(late["data"]["stopped_on_rejoin"], true, "{late}");
        assert_eq!(state(c, via, &w.op).await.unwrap()["status"], "lost");
    }
    // a fenced node claims nothing once it is back
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(state(c, via, &handed.op).await.unwrap()["status"], "failed");
    started(c, std::slice::from_ref(handed), 0);
    started(c, theirs, 1);
    let delivered = [
        theirs.to_vec(),
        vec![handed.clone()],
        next.into_iter().collect(),
    ]
    .concat();
    all_delivered_once(c, via, &delivered).await;
}

/// PostgreSQL stopped 20 s with ops running on every node: the ops end
/// meanwhile, their ends are recorded once it is back, nothing is lost, no
/// node is declared dead for it.
pub async fn store_outage(c: &Cluster) {
    let mut work = Vec::new();
    for n in ["n1", "n2", "n3"] {
        work.extend(place_on(c, n, 1).await);
    }
    let stopped_at = Instant::now();
    docker(&["stop", "-t", "5", &c.store_container()]).unwrap();
    // a start meanwhile is refused as a store outage, and never runs
    let refused_run = refused_start(c, "n1").await;
    release(c, &work);
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(stopped_at.elapsed())).await;
    docker(&["start", &c.store_container()]).unwrap();
    eprintln!(
        "store-outage: PostgreSQL back after {:?}",
        stopped_at.elapsed()
    );
    ends(c, "n1", &work, "completed", json!(7)).await;
    all_active(c, "n2").await;
    all_delivered_once(c, "n3", &work).await;
    started(c, &work, 1);
    never_recorded(c, "n2", &refused_run).await;
}

/// Every node's kernel restarted in turn (SIGTERM, started again by its
/// node) while ops are started through every node: each started op
/// completes, exactly once, and none is lost.
pub async fn rolling_restart(c: &Cluster) {
    // long ops on every node, kept running across every restart
    let mut long = Vec::new();
    for n in ["n1", "n2", "n3"] {
        long.extend(place_on(c, n, 1).await);
    }
    let runs: Vec<String> = (0..6).map(|_| unique_run("roll")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        let clients: Vec<_> = c.nodes.iter().map(|n| n.client.clone()).collect();
        let runs = runs.clone();
        tokio::spawn(async move { load(&clients, &runs, &stop).await })
    };
    for n in &c.nodes {
        tokio::time::sleep(Duration::from_secs(1)).await;
        c.restart_kernel(&n.name).await.unwrap();
        all_active(c, &n.name).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let (work, refused) = load.await.unwrap();
    eprintln!(
        "rolling-restart: {} ops started, {refused} starts refused by a restarting node",
        work.len()
    );
    assert!(work.len() >= 20, "too little load: {}", work.len());
    ends(c, "n1", &work, "completed", json!(0)).await;
    for w in &long {
        assert_eq!(state(c, "n2", &w.op).await.unwrap()["status"], "running");
    }
    release(c, &long);
    ends(c, "n3", &long, "completed", json!(7)).await;
    all_delivered_once(c, "n2", &[work.clone(), long.clone()].concat()).await;
    started(c, &[work, long].concat(), 1);
}

/// Starts short ops on `runs` through each node in turn (one every 100 ms,
/// at most 400) until `stop`; the started ones, and how many starts failed.
async fn load(
    clients: &[opkernel::surfaces::cli::client::Client],
    runs: &[String],
    stop: &AtomicBool,
) -> (Vec<Work>, usize) {
    let (mut work, mut refused) = (Vec::new(), 0);
    for i in 0..400 {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let run = &runs[i % runs.len()];
        let tag = format!("roll-{i}");
        let command = vec![
            "sh".into(),
            "-c".into(),
            format!("echo {tag} >> /scratch/ran"),
        ];
        match start(&clients[i % clients.len()], run, &command).await {
            Ok(op) => work.push(Work {
                run: run.clone(),
                op,
                tag,
                node: String::new(),
            }),
            Err(_) => refused += 1,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (work, refused)
}
