#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A run asks for gVisor in its envelope on a kernel whose default is runc
//! (SPEC §30): its commands run under runsc, its children stay there (runc
//! is wider, refused), and a network asked for with runsc is a clear 400.
//! `scripts/test.sh` registers runsc before any test runs.

mod workspace_helpers;

use opkernel::drills::harness::KernelProcess;
use opkernel_tests::unique_run;
use reqwest::Method;
use serde_json::{json, Value};
use workspace_helpers::{create, json_call, kernel};

fn runtime_of(container: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.HostConfig.Runtime}}", container])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

async fn command(k: &KernelProcess, run: &str, token: Option<&str>) -> Value {
    let body = json!({"command": ["sh", "-c", "echo under $(uname -s)"], "timeout_sec": 60});
    let path = format!("/v1/runs/{run}/tools/run_command");
    let (status, v) = json_call(k, Method::POST, &path, token, body).await;
    assert_eq!(status, 200, "{v}");
    v
}

#[tokio::test]
async fn an_envelope_asks_for_gvisor_and_its_children_stay_in_it() {
    let k = kernel("gv-env", &[("OPKERNEL_RUNTIME", "runc")]).await;
    // runc by default
    let plain = unique_run("plain");
    create(&k, None, json!({"run_id": plain})).await;
    let v = command(&k, &plain, None).await;
    assert_eq!(runtime_of(v["container_id"].as_str().unwrap()), "runc");
    // asked for: runsc, and the command runs there with its output
    let gv = unique_run("gv");
    let envelope = json!({"runtime": "runsc", "network": "none"});
    let (status, parent) = create(&k, None, json!({"run_id": gv, "envelope": envelope})).await;
    assert_eq!(status, 200, "{parent}");
    assert_eq!(parent["envelope"]["runtime"], "runsc", "{parent}");
    let v = command(&k, &gv, None).await;
    assert_eq!(
        (v["exit_code"].as_i64(), v["output"].as_str()),
        (Some(0), Some("under Linux\n"))
    );
    assert_eq!(runtime_of(v["container_id"].as_str().unwrap()), "runsc");
    // a child inherits it and may not widen to runc
    let token = parent["token"].as_str().unwrap();
    let wider = json!({"run_id": unique_run("wider"), "envelope": {"runtime": "runc"}});
    let (status, v) = json_call(&k, Method::POST, "/v1/runs", Some(token), wider).await;
    assert_eq!(
        (status.as_u16(), &v["error"]["code"]),
        (403, &json!("envelope_exceeded")),
        "{v}"
    );
    let child = unique_run("child");
    let (status, v) = json_call(
        &k,
        Method::POST,
        "/v1/runs",
        Some(token),
        json!({"run_id": child}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["envelope"]["runtime"], "runsc", "{v}");
    // a child's id is under its parent's
    let child = v["run_id"].as_str().unwrap();
    let out = command(&k, child, v["token"].as_str()).await;
    assert_eq!(runtime_of(out["container_id"].as_str().unwrap()), "runsc");
    // runsc with a network: refused with its reason, never dropped
    let open =
        json!({"run_id": unique_run("open"), "envelope": {"runtime": "runsc", "network": "open"}});
    let (status, v) = create(&k, None, open).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("none"),
        "{v}"
    );
}
