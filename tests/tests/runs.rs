#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Runs as durable tasks end to end, against the real engine: delegation
//! that only narrows, what a parent and a child may reach, a parent's
//! kills and cancels, usage and budgets (states and the trace are in
//! `run_states.rs`).

use opkernel_tests::unique_run;
use reqwest::Method;
use serde_json::json;

mod run_helpers;
use run_helpers::*;

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
