//! What the run tests share: a kernel, clients made by creating runs,
//! calls, starts and a run's events.
#![allow(dead_code)]

use std::process::Command;
use std::time::Duration;

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel::surfaces::cli::client::Client;
use reqwest::Method;
use serde_json::{json, Value};

pub(crate) const T: Duration = Duration::from_secs(60);

pub(crate) async fn kernel(tag: &str, env: &[(&str, &str)]) -> KernelProcess {
    KernelProcess::start(&kernel_binary().unwrap(), tag, env)
        .await
        .unwrap()
}

/// Creates a run with `client`'s token (operator: top-level; run token: a
/// child) and returns the new run's client.
pub(crate) async fn create(k: &KernelProcess, client: &Client, body: Value) -> Client {
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

pub(crate) async fn call(
    c: &Client,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    c.request(method, path, body.as_ref(), &[]).await.unwrap()
}

pub(crate) async fn start(c: &Client, run: &str, cmd: &[&str]) -> (u16, Value) {
    call(
        c,
        Method::POST,
        &format!("/v1/runs/{run}/tools/run_command"),
        Some(json!({"command": cmd, "background": true, "timeout_sec": 120})),
    )
    .await
}

pub(crate) async fn start_ok(c: &Client, run: &str, cmd: &[&str]) -> String {
    let (s, v) = start(c, run, cmd).await;
    assert_eq!(s, 200, "{v}");
    v["operation_id"].as_str().unwrap().to_owned()
}

pub(crate) async fn events(c: &Client, run: &str) -> Vec<Value> {
    let (s, v) = call(c, Method::GET, &format!("/v1/runs/{run}/events"), None).await;
    assert_eq!(s, 200, "{v}");
    v["events"].as_array().unwrap().clone()
}

pub(crate) fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect()
}

pub(crate) fn docker_inspect(container: &str, format: &str) -> String {
    let out = Command::new("docker")
        .args(["inspect", "-f", format, container])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
