//! What the workspace tests share: a kernel with a second image, raw and
//! JSON calls, run creation and foreground commands.
#![allow(dead_code)]

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

pub async fn kernel(tag: &str, env: &[(&str, &str)]) -> KernelProcess {
    let bin = kernel_binary().unwrap();
    let mut all = vec![("OPKERNEL_IMAGES", "deb=opkernel-sandbox:debian")];
    all.extend_from_slice(env);
    KernelProcess::start(&bin, tag, &all).await.unwrap()
}

/// A raw call with `token` (the operator's when `None`).
pub async fn call(
    k: &KernelProcess,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, Vec<u8>) {
    let url = format!("{}{path}", k.client.base());
    let json = body.first() == Some(&b'{');
    let answer = reqwest::Client::new()
        .request(method, url)
        .bearer_auth(token.unwrap_or(k.client.token()))
        .header(
            "content-type",
            if json {
                "application/json"
            } else {
                "application/octet-stream"
            },
        )
        .body(body)
        .send()
        .await
        .unwrap();
    let status = answer.status();
    (status, answer.bytes().await.unwrap().to_vec())
}

pub async fn json_call(
    k: &KernelProcess,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Value,
) -> (StatusCode, Value) {
    let (status, bytes) = call(k, method, path, token, serde_json::to_vec(&body).unwrap()).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

pub async fn create(k: &KernelProcess, token: Option<&str>, body: Value) -> (StatusCode, Value) {
    json_call(k, Method::POST, "/v1/runs", token, body).await
}

/// A foreground command's exit code and output.
pub async fn run(k: &KernelProcess, run: &str, token: Option<&str>, cmd: &[&str]) -> (i64, String) {
    let body = json!({"command": cmd, "timeout_sec": 60});
    let (status, v) = json_call(
        k,
        Method::POST,
        &format!("/v1/runs/{run}/tools/run_command"),
        token,
        body,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    (
        v["exit_code"].as_i64().unwrap_or(-1),
        v["output"].as_str().unwrap_or_default().to_owned(),
    )
}
