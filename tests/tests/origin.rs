#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Trusted origin (SPEC §28, seeds 000 and 003): every run and op records
//! where it came from at admission, from the call's context: the HTTP
//! client's `User-Agent`, the CLI's version, a schedule's id, the token's
//! principal. No request field can set any of it. (MCP's and the panel's
//! are checked by their own tests, with the official client and a real
//! browser.)

use std::process::Command;
use std::time::Duration;

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::{unique_run, wait_for};
use reqwest::Method;
use serde_json::{json, Value};

async fn kernel(tag: &str) -> KernelProcess {
    KernelProcess::start(&kernel_binary().unwrap(), tag, &[])
        .await
        .unwrap()
}

/// A call with a `User-Agent` and extra headers: status and body.
async fn call(
    k: &KernelProcess,
    method: Method,
    path: &str,
    token: &str,
    headers: &[(&str, &str)],
    body: Value,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{path}", k.client.base()))
        .bearer_auth(token)
        .header("user-agent", "agent-platform/7.1 (\tred)")
        .json(&body);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let answer = req.send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

fn origin(surface: &str, channel: &str, principal: &str, route: &str) -> Value {
    json!({"surface": surface, "channel": channel, "principal": principal, "route": route})
}

const START: &str = "POST /v1/runs/{run}/tools/run_command";

/// The `tool.started` event of `op` in `run`'s trace.
async fn started_event(k: &KernelProcess, run: &str, op: &str) -> Value {
    let page = k
        .client
        .get(&format!("/v1/runs/{run}/events?limit=500"))
        .await
        .unwrap();
    let events = page["events"].as_array().unwrap().clone();
    events
        .into_iter()
        .find(|e| e["kind"] == "tool.started" && e["operation_id"] == op)
        .unwrap()
}

#[tokio::test]
async fn http_and_a_run_token_record_their_origin_and_no_field_forges_it() {
    let k = kernel("origin-http").await;
    let op_token = k.client.token().to_owned();
    let run = unique_run("orig");
    let (s, made) = call(
        &k,
        Method::POST,
        "/v1/runs",
        &op_token,
        &[],
        json!({"run_id": run}),
    )
    .await;
    assert_eq!(s, 200, "{made}");
    let http = origin(
        "http",
        "agent-platform/7.1 (?red)",
        "operator",
        "POST /v1/runs",
    );
    let run_view = k.client.get(&format!("/v1/runs/{run}")).await.unwrap();
    assert_eq!(run_view["origin"], http, "{run_view}");
    // a run token's op: its principal; the command says what it likes
    let token = made["token"].as_str().unwrap().to_owned();
    let forged_argv =
        json!({"command": ["echo", "{\"origin\": {\"surface\": \"schedule\"}}", "--surface=cli"]});
    let path = format!("/v1/runs/{run}/tools/run_command");
    let (s, op) = call(&k, Method::POST, &path, &token, &[], forged_argv).await;
    assert_eq!(s, 200, "{op}");
    let as_run = origin(
        "http",
        "agent-platform/7.1 (?red)",
        &format!("run:{run}"),
        START,
    );
    assert_eq!(op["origin"], as_run, "{op}");
    let id = op["operation_id"].as_str().unwrap();
    assert_eq!(started_event(&k, &run, id).await["data"]["origin"], as_run);
    // each fact as a body field: an unknown field, refused
    for field in ["origin", "surface", "channel", "principal", "route"] {
        let body = json!({"command": ["true"], field: "cli"});
        let (s, v) = call(&k, Method::POST, &path, &token, &[], body).await;
        assert_eq!(s, 400, "{field}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(field),
            "{v}"
        );
        let body = json!({"run_id": unique_run("f"), field: {"surface": "cli"}});
        let (s, v) = call(&k, Method::POST, "/v1/runs", &op_token, &[], body).await;
        assert_eq!(s, 400, "run creation with {field}: {v}");
    }
    // `schedule` is the kernel's own, never a client's
    let claim = [("x-opkernel-surface", "schedule")];
    let (s, v) = call(
        &k,
        Method::POST,
        &path,
        &token,
        &claim,
        json!({"command": ["true"]}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    // a child made with the run token: its principal is the parent run
    let (s, child) = call(
        &k,
        Method::POST,
        "/v1/runs",
        &token,
        &[],
        json!({"run_id": "c"}),
    )
    .await;
    assert_eq!(s, 200, "{child}");
    let child_view = k.client.get(&format!("/v1/runs/{run}.c")).await.unwrap();
    assert_eq!(child_view["origin"]["principal"], format!("run:{run}"));
    // listed by surface
    let listed = k
        .client
        .get(&format!("/v1/ops?run={run}&surface=http"))
        .await
        .unwrap();
    assert_eq!(
        listed["operations"].as_array().unwrap().len(),
        1,
        "{listed}"
    );
    let (s, _) = call(
        &k,
        Method::GET,
        "/v1/ops?surface=bogus",
        &op_token,
        &[],
        Value::Null,
    )
    .await;
    assert_eq!(s, 400);
}

#[tokio::test]
async fn the_cli_and_a_schedule_record_theirs() {
    let k = kernel("origin-cli").await;
    let run = unique_run("cli");
    let out = Command::new(kernel_binary().unwrap())
        .args(["run", "--run", &run, "--json", "--", "true"])
        .env("OPKERNEL_URL", k.client.base())
        .env("OPKERNEL_HOME", &k.home)
        .env_remove("OPKERNEL_TOKEN")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let op: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cli = origin(
        "cli",
        &format!("opkernel {}", env!("CARGO_PKG_VERSION")),
        "operator",
        START,
    );
    assert_eq!(op["origin"], cli, "{op}");
    let run_view = k.client.get(&format!("/v1/runs/{run}")).await.unwrap();
    assert_eq!(run_view["origin"], cli, "the run the CLI's first op made");
    let id = op["operation_id"].as_str().unwrap();
    let state = Command::new(kernel_binary().unwrap())
        .args(["state", id])
        .env("OPKERNEL_URL", k.client.base())
        .env("OPKERNEL_HOME", &k.home)
        .env_remove("OPKERNEL_TOKEN")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&state.stdout);
    assert!(said.contains("origin: cli (opkernel "), "{said}");
    // a schedule's fire: the scheduler's own origin, as its run
    let body = json!({"command": ["true"], "every_sec": 1, "timeout_sec": 30});
    let made = k
        .client
        .post(&format!("/v1/runs/{run}/schedules"), &body)
        .await
        .unwrap();
    let schedule = made["schedule_id"].as_str().unwrap().to_owned();
    let fired = wait_for(
        "the schedule's first fire",
        Duration::from_secs(30),
        || async {
            let path = format!("/v1/ops?run={run}&surface=schedule");
            let list = k.client.get(&path).await.ok()?;
            list["operations"].as_array()?.first().cloned()
        },
    )
    .await;
    let expected = origin("schedule", &schedule, &format!("run:{run}"), "scheduler");
    assert_eq!(fired["origin"], expected, "{fired}");
    assert_eq!(fired["schedule_id"], schedule.as_str());
}
