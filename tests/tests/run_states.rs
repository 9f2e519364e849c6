#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A run's states end to end, against the real engine: explicit
//! completion, pause and resume from above, envelope limits, run ids a
//! child cannot take, and the run's trace across a restart.

use std::time::Duration;

use opkernel::surfaces::cli::client::Client;
use opkernel_tests::unique_run;
use reqwest::Method;
use serde_json::{json, Value};

mod run_helpers;
use run_helpers::*;

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
