#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Runs as durable tasks end to end, against the real engine: delegation
//! that only narrows, what a parent and a child may reach, usage and
//! budgets, explicit completion, cancel, and the run's trace across a
//! restart.

use std::process::Command;
use std::time::Duration;

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel::surfaces::cli::client::Client;
use opkernel_tests::unique_run;
use reqwest::Method;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

async fn kernel(tag: &str, env: &[(&str, &str)]) -> KernelProcess {
    KernelProcess::start(&kernel_binary().unwrap(), tag, env)
        .await
        .unwrap()
}

/// Creates a run with `client`'s token (operator: top-level; run token: a
/// child) and returns the new run's client.
async fn create(k: &KernelProcess, client: &Client, body: Value) -> Client {
    let (s, v) = client
        .request(Method::POST, "/v1/runs", Some(&body), &[])
        .await
        .unwrap();
    assert_eq!(s, 200, "{v}");
    Client::new(
        k.client.base().to_owned(),
        v["token"].as_str().unwrap().to_owned(),
    )
}

async fn call(c: &Client, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    c.request(method, path, body.as_ref(), &[]).await.unwrap()
}

async fn start(c: &Client, run: &str, cmd: &[&str]) -> (u16, Value) {
    call(
        c,
        Method::POST,
        &format!("/v1/runs/{run}/tools/run_command"),
        Some(json!({"command": cmd, "background": true, "timeout_sec": 120})),
    )
    .await
}

async fn start_ok(c: &Client, run: &str, cmd: &[&str]) -> String {
    let (s, v) = start(c, run, cmd).await;
    assert_eq!(s, 200, "{v}");
    v["operation_id"].as_str().unwrap().to_owned()
}

async fn events(c: &Client, run: &str) -> Vec<Value> {
    let (s, v) = call(c, Method::GET, &format!("/v1/runs/{run}/events"), None).await;
    assert_eq!(s, 200, "{v}");
    v["events"].as_array().unwrap().clone()
}

fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect()
}

fn docker_inspect(container: &str, format: &str) -> String {
    let out = Command::new("docker")
        .args(["inspect", "-f", format, container])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test]
async fn a_child_narrows_its_parent_and_gets_its_own_narrowed_container() {
    let k = kernel("narrow", &[("OPKERNEL_MAX_DEPTH", "2")]).await;
    let p = unique_run("parent");
    let c = format!("{p}.child");
    let parent = create(
        &k,
        &k.client,
        json!({"run_id": p, "envelope": {"max_timeout_sec": 300, "memory_bytes": 1073741824, "pids_limit": 512},
               "budget": {"tokens": 10000}}),
    )
    .await;
    // every widening is refused with a 403 naming its field
    let wider = [
        (
            "envelope.max_timeout_sec",
            json!({"envelope": {"max_timeout_sec": 301}}),
        ),
        (
            "envelope.memory_bytes",
            json!({"envelope": {"memory_bytes": 1073741825u64}}),
        ),
        ("envelope.cpus", json!({"envelope": {"cpus": 64}})),
        (
            "envelope.pids_limit",
            json!({"envelope": {"pids_limit": 513}}),
        ),
        (
            "envelope.network",
            json!({"envelope": {"network": "bridge"}}),
        ),
        (
            "envelope.max_live_ops",
            json!({"envelope": {"max_live_ops": 100000}}),
        ),
        ("budget.tokens", json!({"budget": {"tokens": 10001}})),
    ];
    for (field, mut body) in wider {
        body["run_id"] = json!(unique_run("wide"));
        let (s, v) = call(&parent, Method::POST, "/v1/runs", Some(body)).await;
        assert_eq!(s, 403, "{field}: {v}");
        assert_eq!(v["error"]["code"], "envelope_exceeded", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().starts_with(field),
            "{v}"
        );
    }
    // a body cannot name a parent: it comes from the token
    let (s, _) = call(
        &parent,
        Method::POST,
        "/v1/runs",
        Some(json!({"run_id": unique_run("x"), "parent_run_id": "other"})),
    )
    .await;
    assert_eq!(s, 400);
    let child = create(
        &k,
        &parent,
        json!({"run_id": c, "envelope": {"memory_bytes": 268435456, "max_timeout_sec": 60, "pids_limit": 64},
               "budget": {"tokens": 5000}}),
    )
    .await;
    let (s, v) = call(&child, Method::GET, &format!("/v1/runs/{c}"), None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["parent_run_id"], json!(p));
    assert_eq!(v["chain"], json!([p]));
    assert_eq!(v["principal"], json!(format!("run:{p}")));
    assert_eq!(v["envelope"]["memory_bytes"], 268435456);
    // inherited where not narrowed
    assert_eq!(v["envelope"]["network"], "none");
    // a timeout over the child's envelope is refused, naming it
    let (s, v) = call(
        &child,
        Method::POST,
        &format!("/v1/runs/{c}/tools/run_command"),
        Some(json!({"command": ["true"], "background": true, "timeout_sec": 61})),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (403, Some("envelope_exceeded")),
        "{v}"
    );
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_timeout_sec 60"));
    // the default timeout fits the envelope instead of failing
    let (s, v) = call(
        &child,
        Method::POST,
        &format!("/v1/runs/{c}/tools/run_command"),
        Some(json!({"command": ["sleep", "30"], "background": true})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let op = v["operation_id"].as_str().unwrap().to_owned();
    let state = k
        .wait_state(&op, T, |s| s["pid"].is_number())
        .await
        .unwrap();
    assert_eq!(state["timeout_sec"], 60);
    let child_container = state["container_id"].as_str().unwrap().to_owned();
    assert_eq!(
        docker_inspect(&child_container, "{{.HostConfig.Memory}}"),
        "268435456"
    );
    assert_eq!(
        docker_inspect(&child_container, "{{.HostConfig.PidsLimit}}"),
        "64"
    );
    let parent_op = start_ok(&parent, &p, &["sleep", "30"]).await;
    let parent_container = k.container_of(&parent_op).await.unwrap();
    assert_ne!(
        parent_container, child_container,
        "the child has its own container"
    );
    assert_eq!(
        docker_inspect(&parent_container, "{{.HostConfig.Memory}}"),
        "1073741824"
    );
    // depth is bounded: OPKERNEL_MAX_DEPTH=2 allows a grandchild, no deeper
    let g = format!("{c}.grand");
    let grand = create(&k, &child, json!({"run_id": g})).await;
    let (s, v) = call(
        &grand,
        Method::POST,
        "/v1/runs",
        Some(json!({"run_id": unique_run("deep")})),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (403, Some("depth_exceeded")),
        "{v}"
    );
    let (_, v) = call(&k.client, Method::GET, "/v1/runs", None).await;
    let listed: Vec<&str> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert!(listed.contains(&g.as_str()) && listed.contains(&p.as_str()));
    // a run token lists its own subtree only
    let (_, v) = call(&child, Method::GET, "/v1/runs", None).await;
    let mine: Vec<&str> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(mine, [c.as_str(), g.as_str()]);
}

#[tokio::test]
async fn a_child_never_reaches_its_parent_or_a_sibling_and_a_parent_never_drains_a_child() {
    let k = kernel("reach", &[]).await;
    let p = unique_run("p");
    let (a, b) = (format!("{p}.a"), format!("{p}.b"));
    let parent = create(&k, &k.client, json!({ "run_id": p })).await;
    let child_a = create(&k, &parent, json!({ "run_id": a })).await;
    let child_b = create(&k, &parent, json!({ "run_id": b })).await;
    let p_op = start_ok(&parent, &p, &["sleep", "30"]).await;
    let b_op = start_ok(&child_b, &b, &["sh", "-c", "echo from-b"]).await;
    k.wait_terminal(&b_op, T).await.unwrap();
    for (target, op) in [(&p, &p_op), (&b, &b_op)] {
        for (method, path, body) in [
            (Method::GET, format!("/v1/runs/{target}"), None),
            (Method::GET, format!("/v1/runs/{target}/events"), None),
            (Method::GET, format!("/v1/runs/{target}/report"), None),
            (Method::POST, format!("/v1/runs/{target}/pause"), None),
            (Method::POST, format!("/v1/runs/{target}/cancel"), None),
            (
                Method::POST,
                format!("/v1/runs/{target}/tools/kill_operation"),
                Some(json!({"operation_id": op})),
            ),
            (
                Method::POST,
                format!("/v1/runs/{target}/tools/run_command"),
                Some(json!({"command": ["true"]})),
            ),
        ] {
            let (s, v) = call(&child_a, method.clone(), &path, body).await;
            assert_eq!(s, 403, "{method} {path}: {v}");
        }
        for path in [
            format!("/v1/operations/{op}"),
            format!("/v1/operations/{op}/log"),
        ] {
            let (s, _) = call(&child_a, Method::GET, &path, None).await;
            assert_eq!(s, 404, "{path}");
        }
    }
    // the parent sees its child's state, ops and trace ...
    let (s, v) = call(
        &parent,
        Method::GET,
        &format!("/v1/operations/{b_op}"),
        None,
    )
    .await;
    assert_eq!((s, v["status"].as_str()), (200, Some("completed")));
    assert_eq!(
        call(&parent, Method::GET, &format!("/v1/runs/{b}"), None)
            .await
            .0,
        200
    );
    assert!(!events(&parent, &b).await.is_empty());
    let (s, v) = call(&parent, Method::GET, &format!("/v1/ops?run={b}"), None).await;
    assert_eq!(
        (s, v["operations"].as_array().map(Vec::len)),
        (200, Some(1))
    );
    // ... but never drains or acks its reports, nor writes its notes
    for (method, path, body) in [
        (Method::GET, format!("/v1/runs/{b}/report"), None),
        (
            Method::POST,
            format!("/v1/runs/{b}/report/{}/ack", uuid::Uuid::new_v4()),
            None,
        ),
        (
            Method::POST,
            format!("/v1/runs/{b}/notes"),
            Some(json!({"text": "x"})),
        ),
        (Method::POST, format!("/v1/runs/{b}/finish"), None),
        (
            Method::POST,
            format!("/v1/runs/{b}/complete"),
            Some(json!({"summary": "x"})),
        ),
    ] {
        let (s, v) = call(&parent, method.clone(), &path, body).await;
        assert_eq!(s, 403, "{method} {path}: {v}");
    }
    // the child's result is still there for the child
    let delivered = {
        let (_, r) = call(&child_b, Method::GET, &format!("/v1/runs/{b}/report"), None).await;
        r["resolved"][0]["operation_id"].as_str().map(str::to_owned)
    };
    assert_eq!(delivered.as_deref(), Some(b_op.as_str()));
}

#[tokio::test]
async fn a_parent_kills_a_childs_op_and_cancels_the_child_run() {
    let k = kernel("parentkill", &[]).await;
    let p = unique_run("p");
    let c = format!("{p}.c");
    let parent = create(&k, &k.client, json!({ "run_id": p })).await;
    let child = create(&k, &parent, json!({ "run_id": c })).await;
    let first = start_ok(&child, &c, &["sleep", "300"]).await;
    k.container_of(&first).await.unwrap();
    let (s, v) = call(
        &parent,
        Method::POST,
        &format!("/v1/runs/{c}/tools/kill_operation"),
        Some(json!({"operation_id": first})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let s = k.wait_terminal(&first, T).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["killed"].as_bool()),
        (Some("completed"), Some(true))
    );
    let live: Vec<String> = {
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(start_ok(&child, &c, &["sleep", "300"]).await);
        }
        ids
    };
    for op in &live {
        k.container_of(op).await.unwrap();
    }
    let parent_op = start_ok(&parent, &p, &["sleep", "300"]).await;
    // running before the cancel: a cancel of the child must leave it so
    k.container_of(&parent_op).await.unwrap();
    let (s, v) = call(&parent, Method::POST, &format!("/v1/runs/{c}/cancel"), None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["run"]["state"], "cancelled");
    let mut asked: Vec<String> = v["kill_requested"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_owned())
        .collect();
    asked.sort();
    let mut want = live.clone();
    want.sort();
    assert_eq!(asked, want);
    for op in &live {
        let s = k.wait_terminal(op, T).await.unwrap();
        assert_eq!(s["status"], "completed", "{s}");
        assert_eq!(s["killed"], true, "{s}");
    }
    // the parent's own op runs on; nothing new is admitted in the child
    assert_eq!(k.state(&parent_op).await.unwrap()["status"], "running");
    let (s, v) = start(&child, &c, &["true"]).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("run_cancelled")),
        "{v}"
    );
    let (s, v) = call(&child, Method::POST, &format!("/v1/runs/{c}/resume"), None).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("run_cancelled")),
        "{v}"
    );
    // the child's report says why
    let (_, r) = call(
        &child,
        Method::GET,
        &format!("/v1/runs/{c}/report?wait=5"),
        None,
    )
    .await;
    let text = r["text"].as_str().unwrap();
    assert!(text.contains("killed (run cancelled)"), "{text}");
}

#[tokio::test]
async fn model_usage_and_op_seconds_both_count_and_admission_stops_at_the_limit() {
    let k = kernel("budget", &[]).await;
    let p = unique_run("p");
    let c = format!("{p}.c");
    let parent = create(
        &k,
        &k.client,
        json!({"run_id": p, "budget": {"tokens": 1000, "op_seconds": 3600}}),
    )
    .await;
    let child = create(&k, &parent, json!({"run_id": c, "budget": {"tokens": 600}})).await;
    let op = start_ok(&child, &c, &["sh", "-c", "sleep 1.2; echo done"]).await;
    k.wait_terminal(&op, T).await.unwrap();
    let usage = |run: &str, n: u64, key: &str| {
        let (run, key) = (run.to_owned(), key.to_owned());
        let client = if run == c {
            child.clone()
        } else {
            parent.clone()
        };
        async move {
            client
                .request(
                Method::POST,
                &format!("/v1/runs/{run}/usage"),
                Some(&json!({"model": "m-1", "input_tokens": n, "output_tokens": 0, "cost_micros": 5})),
                &[("Idempotency-Key", &key)],
            )
            .await
            .unwrap()
        }
    };
    let (s, v) = usage(&c, 399, "u1").await;
    assert_eq!((s, v["recorded"].as_bool()), (200, Some(true)), "{v}");
    // a retry records nothing more
    let (s, v) = usage(&c, 399, "u1").await;
    assert_eq!((s, v["recorded"].as_bool()), (200, Some(false)), "{v}");
    let (_, v) = call(&parent, Method::GET, &format!("/v1/runs/{p}"), None).await;
    assert_eq!(v["used"]["tokens"], 399);
    assert_eq!(v["used"]["cost_micros"], 5);
    let op_seconds = v["used"]["op_seconds"].as_f64().unwrap();
    assert!((1.2..10.0).contains(&op_seconds), "{v}");
    assert_eq!(v["remaining"]["tokens"], 601);
    assert!(v["used"]["cpu_seconds"].as_f64().is_some());
    let (_, v) = call(&child, Method::GET, &format!("/v1/runs/{c}"), None).await;
    assert_eq!(v["remaining"]["tokens"], 201);
    // one token short of the child's limit: still admitted
    usage(&c, 200, "u2").await;
    start_ok(&child, &c, &["true"]).await;
    // at the limit: refused, naming the limit, the used amount and the limit
    usage(&c, 1, "u3").await;
    let (s, v) = start(&child, &c, &["true"]).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("budget_exhausted")),
        "{v}"
    );
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("tokens used 600 of 600") && msg.contains(&c),
        "{msg}"
    );
    let (s, v) = call(
        &child,
        Method::POST,
        "/v1/runs",
        Some(json!({"run_id": unique_run("g")})),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("budget_exhausted")),
        "{v}"
    );
    // the parent has 400 left of its own: its ops still go
    let last = start_ok(&parent, &p, &["true"]).await;
    k.wait_terminal(&last, T).await.unwrap();
    usage(&p, 400, "u4").await;
    let (s, v) = start(&parent, &p, &["true"]).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("budget_exhausted")),
        "{v}"
    );
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("tokens used 1000 of 1000"));
    // the report ends with the budget line
    let (_, r) = call(
        &parent,
        Method::GET,
        &format!("/v1/runs/{p}/report?wait=5"),
        None,
    )
    .await;
    let text = r["text"].as_str().unwrap();
    let last_line = text.trim_end().lines().last().unwrap();
    assert!(
        last_line.starts_with("Budget: op_seconds ")
            && last_line.contains("tokens 1000/1000 used (0 left)"),
        "{text}"
    );
    // bad usage is a clear error and records nothing
    let (s, _) = call(
        &child,
        Method::POST,
        &format!("/v1/runs/{c}/usage"),
        Some(json!({"model": "", "input_tokens": 1})),
    )
    .await;
    assert_eq!(s, 400);
    let (s, _) = call(
        &child,
        Method::POST,
        &format!("/v1/runs/{c}/usage"),
        Some(json!({"model": "m", "input_tokens": -1})),
    )
    .await;
    assert_eq!(s, 400);
    let (_, v) = call(&parent, Method::GET, &format!("/v1/runs/{p}"), None).await;
    assert_eq!(v["used"]["tokens"], 1000);
}

#[tokio::test]
async fn complete_is_explicit_refused_while_ops_live_and_every_transition_is_an_event_across_a_restart(
) {
    let mut k = kernel("trace", &[]).await;
    let run = unique_run("trace");
    let c = create(&k, &k.client, json!({ "run_id": run })).await;
    let op = start_ok(&c, &run, &["sleep", "6"]).await;
    k.container_of(&op).await.unwrap();
    let (s, v) = call(
        &c,
        Method::POST,
        &format!("/v1/runs/{run}/complete"),
        Some(json!({"summary": "done early"})),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("ops_live")),
        "{v}"
    );
    let (s, _) = call(&c, Method::POST, &format!("/v1/runs/{run}/pause"), None).await;
    assert_eq!(s, 200);
    let (s, v) = start(&c, &run, &["true"]).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("run_paused")),
        "{v}"
    );
    // a paused run's running op goes on, across a kernel restart
    k.restart().await.unwrap();
    let c = Client::new(k.client.base().to_owned(), c.token().to_owned());
    let (s, _) = call(&c, Method::POST, &format!("/v1/runs/{run}/resume"), None).await;
    assert_eq!(s, 200);
    let (_, n) = call(
        &c,
        Method::POST,
        &format!("/v1/runs/{run}/notes"),
        Some(json!({"text": "hi"})),
    )
    .await;
    assert!(n["note_id"].is_number());
    k.wait_terminal(&op, T).await.unwrap();
    let (_, r) = call(
        &c,
        Method::GET,
        &format!("/v1/runs/{run}/report?wait=5"),
        None,
    )
    .await;
    call(
        &c,
        Method::POST,
        &format!(
            "/v1/runs/{run}/report/{}/ack",
            r["report_id"].as_str().unwrap()
        ),
        None,
    )
    .await;
    // the long poll wakes on the next event
    let after = events(&c, &run).await.last().unwrap()["seq"]
        .as_i64()
        .unwrap();
    let waiter = {
        let c = c.clone();
        let run = run.clone();
        tokio::spawn(async move {
            call(
                &c,
                Method::GET,
                &format!("/v1/runs/{run}/events?after={after}&wait=30"),
                None,
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, v) = call(
        &c,
        Method::POST,
        &format!("/v1/runs/{run}/complete"),
        Some(json!({"summary": "all done"})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["run"]["summary"], "all done");
    let (_, woke) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(woke["events"][0]["kind"], "run.completed");
    let all = events(&c, &run).await;
    assert_eq!(
        kinds(&all),
        [
            "tool.started",
            "run.paused",
            "run.resumed",
            "note.received",
            "tool.completed",
            "report.delivered",
            "run.completed",
        ]
    );
    let seqs: Vec<i64> = all.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(all[0]["operation_id"], json!(op));
    assert_eq!(all[4]["data"]["exit_code"], 0);
    // over: nothing new, no second completion event
    let (s, v) = start(&c, &run, &["true"]).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("run_completed")),
        "{v}"
    );
    let (s, _) = call(
        &c,
        Method::POST,
        &format!("/v1/runs/{run}/complete"),
        Some(json!({"summary": "again"})),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(events(&c, &run).await.len(), all.len());
    // the SSE stream replays from any point and carries each event's seq as its id
    let mut streamed = Vec::new();
    c.sse(
        &format!("/v1/runs/{run}/events/stream?after={}", seqs[3]),
        |_, data| {
            streamed.push(
                serde_json::from_str::<Value>(data).unwrap()["seq"]
                    .as_i64()
                    .unwrap(),
            );
            streamed.len() < 3
        },
    )
    .await
    .unwrap();
    assert_eq!(streamed, seqs[4..]);
}

#[tokio::test]
async fn a_pause_is_undone_only_from_above_and_a_childs_token_only_by_a_keyed_retry() {
    let k = kernel("held", &[]).await;
    let p = unique_run("p");
    let c = format!("{p}.c");
    let parent = create(&k, &k.client, json!({ "run_id": p })).await;
    let create_child = |key: Option<&'static str>| {
        let parent = parent.clone();
        let c = c.clone();
        async move {
            let headers: Vec<(&str, &str)> =
                key.map(|k| ("Idempotency-Key", k)).into_iter().collect();
            parent
                .request(
                    Method::POST,
                    "/v1/runs",
                    Some(&json!({"run_id": c})),
                    &headers,
                )
                .await
                .unwrap()
        }
    };
    let (s, first) = create_child(Some("make-c")).await;
    assert_eq!(s, 200, "{first}");
    // a retry under the same key re-keys (the first answer may be lost) ...
    let (s, again) = create_child(Some("make-c")).await;
    assert_eq!(s, 200, "{again}");
    assert_ne!(first["token"], again["token"]);
    // ... anything else cannot take the child's token
    for key in [None, Some("other")] {
        let (s, v) = create_child(key).await;
        assert_eq!(s, 409, "{v}");
    }
    let (s, v) = call(
        &k.client,
        Method::POST,
        "/v1/runs",
        Some(json!({"run_id": c})),
    )
    .await;
    assert_eq!(
        s, 409,
        "the operator cannot re-register a child as its own: {v}"
    );
    let child = Client::new(
        k.client.base().to_owned(),
        again["token"].as_str().unwrap().to_owned(),
    );
    let old = Client::new(
        k.client.base().to_owned(),
        first["token"].as_str().unwrap().to_owned(),
    );
    assert_eq!(
        call(&old, Method::GET, &format!("/v1/runs/{c}"), None)
            .await
            .0,
        401
    );
    // paused by its parent: the child cannot resume itself
    assert_eq!(
        call(&parent, Method::POST, &format!("/v1/runs/{c}/pause"), None)
            .await
            .0,
        200
    );
    let (s, v) = call(&child, Method::POST, &format!("/v1/runs/{c}/resume"), None).await;
    assert_eq!(s, 403, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains(&format!("paused by run:{p}")));
    assert_eq!(
        call(&parent, Method::POST, &format!("/v1/runs/{c}/resume"), None)
            .await
            .0,
        200
    );
    // paused by itself: it may resume; paused by the operator: only the operator
    assert_eq!(
        call(&child, Method::POST, &format!("/v1/runs/{c}/pause"), None)
            .await
            .0,
        200
    );
    assert_eq!(
        call(&child, Method::POST, &format!("/v1/runs/{c}/resume"), None)
            .await
            .0,
        200
    );
    assert_eq!(
        call(
            &k.client,
            Method::POST,
            &format!("/v1/runs/{c}/pause"),
            None
        )
        .await
        .0,
        200
    );
    assert_eq!(
        call(&parent, Method::POST, &format!("/v1/runs/{c}/resume"), None)
            .await
            .0,
        403
    );
    let (s, v) = call(
        &k.client,
        Method::POST,
        &format!("/v1/runs/{c}/resume"),
        None,
    )
    .await;
    assert_eq!(
        (s, v["run"]["state"].as_str()),
        (200, Some("active")),
        "{v}"
    );
}

/// Issue 22, defect 2: a pause from above is the pause of record; the
/// paused run cannot undo it (before: the child's resume answered 200).
#[tokio::test]
async fn a_pause_from_above_cannot_be_undone_below() {
    let k = kernel("pauses", &[]).await;
    let p = unique_run("p");
    let c = format!("{p}.c");
    let parent = create(&k, &k.client, json!({ "run_id": p })).await;
    let child = create(&k, &parent, json!({ "run_id": c })).await;
    let post = |who: &Client, verb: &str| {
        let (who, path) = (who.clone(), format!("/v1/runs/{c}/{verb}"));
        async move { call(&who, Method::POST, &path, None).await }
    };
    let (s, v) = post(&child, "pause").await;
    assert_eq!(
        (s, v["run"]["state"].as_str()),
        (200, Some("paused")),
        "{v}"
    );
    // the operator's pause takes the pause over
    let (s, v) = post(&k.client, "pause").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["changed"], json!([c]), "{v}");
    // neither the child nor its parent may resume it now
    for who in [&child, &parent] {
        let (s, v) = post(who, "resume").await;
        assert_eq!(s, 403, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("operator"));
    }
    let (s, v) = call(&child, Method::GET, &format!("/v1/runs/{c}"), None).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("paused")), "{v}");
    let kinds: Vec<Value> = events(&child, &c)
        .await
        .into_iter()
        .map(|e| e["data"].clone())
        .collect();
    assert!(
        kinds.iter().any(|d| d["over"] == json!(format!("run:{c}"))),
        "{kinds:?}"
    );
    let (s, v) = post(&k.client, "resume").await;
    assert_eq!(
        (s, v["run"]["state"].as_str()),
        (200, Some("active")),
        "{v}"
    );
}

/// Issue 22, defect 3: `max_live_ops` bounds a run and its descendants
/// together, and `max_children` bounds its unfinished children (before:
/// three children each ran an op in their own container, all 200).
#[tokio::test]
async fn envelope_limits_bound_a_run_with_its_children() {
    let k = kernel("subtree", &[]).await;
    let p = unique_run("p");
    let parent = create(
        &k,
        &k.client,
        json!({ "run_id": p, "envelope": {"max_live_ops": 1, "max_children": 3} }),
    )
    .await;
    let mut children = Vec::new();
    for name in ["a", "b", "c"] {
        let id = format!("{p}.{name}");
        children.push((create(&k, &parent, json!({ "run_id": id })).await, id));
    }
    let (s, v) = call(
        &parent,
        Method::POST,
        "/v1/runs",
        Some(json!({"run_id": "d"})),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (429, Some("limit_reached")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_children"),
        "{v}"
    );
    let first = start_ok(&children[0].0, &children[0].1, &["sleep", "30"]).await;
    for (client, id) in &children[1..] {
        let (s, v) = start(client, id, &["sleep", "30"]).await;
        assert_eq!(s, 429, "{id}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("run {p} ")),
            "{v}"
        );
    }
    let (s, v) = start(&parent, &p, &["true"]).await;
    assert_eq!(s, 429, "{v}");
    let (s, _) = call(
        &k.client,
        Method::POST,
        &format!("/v1/runs/{}/tools/kill_operation", children[0].1),
        Some(json!({"operation_id": first})),
    )
    .await;
    assert_eq!(s, 200);
    k.wait_terminal(&first, T).await.unwrap();
    start_ok(&children[1].0, &children[1].1, &["true"]).await;
}

/// Issue 22, defect 5: a run token's child lives in its parent's namespace,
/// so the operator's own `--run nightly` is a top-level run the agent can
/// neither read nor kill (before: the child took the id `nightly`).
#[tokio::test]
async fn a_child_cannot_squat_an_operator_run_id() {
    let k = kernel("squat", &[]).await;
    let p = unique_run("p");
    let nightly = unique_run("nightly");
    let parent = create(&k, &k.client, json!({ "run_id": p })).await;
    let (s, v) = call(
        &parent,
        Method::POST,
        "/v1/runs",
        Some(json!({"run_id": nightly})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["run_id"], json!(format!("{p}.{nightly}")), "{v}");
    let child = Client::new(
        k.client.base().to_owned(),
        v["token"].as_str().unwrap().to_owned(),
    );
    let op = start_ok(&k.client, &nightly, &["sh", "-c", "echo operator-secret"]).await;
    k.wait_terminal(&op, T).await.unwrap();
    let (s, v) = call(&k.client, Method::GET, &format!("/v1/runs/{nightly}"), None).await;
    assert_eq!((s, &v["parent_run_id"]), (200, &Value::Null), "{v}");
    for who in [&parent, &child] {
        let (s, _) = call(who, Method::GET, &format!("/v1/operations/{op}"), None).await;
        assert_eq!(s, 404);
        let (s, _) = call(who, Method::GET, &format!("/v1/operations/{op}/log"), None).await;
        assert_eq!(s, 404);
    }
    // a name too long for the namespace is a clear 400
    let (s, v) = call(
        &parent,
        Method::POST,
        "/v1/runs",
        Some(json!({"run_id": "x".repeat(60)})),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("<parent>.<name>"),
        "{v}"
    );
}

/// `GET /v1/runs/{run}/events?tail=N` (the panel's first trace): exactly
/// the last N events, oldest first, with the cursor at the newest one, so
/// reading on from it misses nothing and repeats nothing; N is clamped to
/// 1..=500.
#[tokio::test]
async fn an_events_tail_is_the_last_n_and_its_cursor_goes_on_from_there() {
    let k = kernel("events-tail", &[]).await;
    let run = unique_run("tail");
    let c = create(&k, &k.client, json!({"run_id": run})).await;
    let note = |i: usize| {
        let c = c.clone();
        let run = run.clone();
        async move {
            let (s, v) = call(
                &c,
                Method::POST,
                &format!("/v1/runs/{run}/notes"),
                Some(json!({"text": format!("note {i}")})),
            )
            .await;
            assert_eq!(s, 200, "{v}");
        }
    };
    for i in 0..12 {
        note(i).await;
    }
    let all = events(&c, &run).await;
    assert!(all.len() >= 12, "{all:?}");
    let seqs = |events: &[Value]| -> Vec<i64> {
        events.iter().map(|e| e["seq"].as_i64().unwrap()).collect()
    };
    let get = |query: String| {
        let c = c.clone();
        let run = run.clone();
        async move {
            let (s, v) = call(
                &c,
                Method::GET,
                &format!("/v1/runs/{run}/events?{query}"),
                None,
            )
            .await;
            assert_eq!(s, 200, "{v}");
            v
        }
    };
    let last = *seqs(&all).last().unwrap();
    let tail = get("tail=5".into()).await;
    let got = tail["events"].as_array().unwrap().clone();
    assert_eq!(seqs(&got), seqs(&all[all.len() - 5..]), "{tail}");
    assert_eq!(got, all[all.len() - 5..].to_vec());
    assert_eq!(
        (tail["last_seq"].as_i64(), tail["next_after"].as_i64()),
        (Some(last), Some(last))
    );
    // clamped: at least one, at most 500
    let one = get("tail=0".into()).await;
    assert_eq!(seqs(one["events"].as_array().unwrap()), vec![last], "{one}");
    let whole = get("tail=100000".into()).await;
    assert_eq!(whole["events"].as_array().unwrap(), &all);
    // what arrives after the tail comes from its cursor, once
    note(12).await;
    note(13).await;
    let next = get(format!("after={last}")).await;
    let new = next["events"].as_array().unwrap();
    assert_eq!(kinds(new), vec!["note.received", "note.received"], "{next}");
    assert!(seqs(new).iter().all(|&s| s > last), "{next}");
    let tail = get("tail=2".into()).await;
    assert_eq!(tail["events"], next["events"]);
}
