#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Approval gates end to end against the real engine: a held op survives a
//! restart, only the operator decides, approve runs it with its timeout
//! from its start, deny and timeout-deny deliver `denied`, escalation keeps
//! it waiting, and a kill withdraws it. Nothing is ever approved by itself.

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

/// A run whose envelope holds commands matching `^gated`, with its token.
async fn gated_run(k: &KernelProcess, approval: Value) -> (String, Client) {
    let run = unique_run("gated");
    let v = k
        .client
        .post(
            "/v1/runs",
            &json!({"run_id": run, "envelope": {"approval": approval}}),
        )
        .await
        .unwrap();
    let token = v["token"].as_str().unwrap().to_owned();
    (run, Client::new(k.client.base().to_owned(), token))
}

async fn start(c: &Client, run: &str, cmd: &[&str], timeout: u64) -> Value {
    let (s, v) = c
        .request(
            Method::POST,
            &format!("/v1/runs/{run}/tools/run_command"),
            Some(&json!({"command": cmd, "background": true, "timeout_sec": timeout})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(s, 200, "{v}");
    v
}

async fn event_kinds(k: &KernelProcess, run: &str, op: &str) -> Vec<String> {
    let v = k
        .client
        .get(&format!("/v1/runs/{run}/events?limit=500"))
        .await
        .unwrap();
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["operation_id"] == op)
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_held_op_survives_a_restart_and_only_the_operator_approves_it() {
    let mut k = kernel("approve", &[]).await;
    let (run, agent) = gated_run(&k, json!({"match": ["echo done$"]})).await;
    // the command sleeps 1 s with a 2 s timeout: counted from the request,
    // the 2.5 s wait below would time it out; counted from its start, it ends 0
    let v = start(&agent, &run, &["sh", "-c", "sleep 1; echo done"], 2).await;
    let op = v["operation_id"].as_str().unwrap().to_owned();
    assert_eq!(v["status"], "awaiting_approval");
    assert!(v["message"]
        .as_str()
        .unwrap()
        .starts_with(&format!("Awaiting operator approval as operation {op}.")));
    // reports list it as waiting, not as running
    let r = agent
        .get(&format!("/v1/runs/{run}/report?wait=0"))
        .await
        .unwrap();
    assert_eq!(r["running"][0]["awaiting_approval"], true);
    assert!(
        r["text"].as_str().unwrap().contains("awaiting approval"),
        "{r}"
    );
    k.restart().await.unwrap();
    let agent = Client::new(k.client.base().to_owned(), agent.token().to_owned());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let s = k.state(&op).await.unwrap();
    assert_eq!(s["status"], "awaiting_approval", "nothing approves it: {s}");
    assert!(
        s["container_id"].is_null() && s["started_at"].is_null(),
        "nothing ran: {s}"
    );
    // an agent cannot approve itself, not even its own op
    for path in [
        format!("/v1/operations/{op}/approve"),
        format!("/v1/operations/{op}/deny"),
    ] {
        let (s, _) = agent
            .request(Method::POST, &path, Some(&json!({})), &[])
            .await
            .unwrap();
        assert_eq!(s, 403, "{path}");
    }
    let waiting = k.client.get("/v1/approvals").await.unwrap();
    assert_eq!(waiting["operations"][0]["operation_id"], json!(op));
    // an approval starts the op: a paused run refuses it, as it would a new op
    k.client
        .post(&format!("/v1/runs/{run}/pause"), &json!({}))
        .await
        .unwrap();
    let (s, v) = k
        .client
        .request(
            Method::POST,
            &format!("/v1/operations/{op}/approve"),
            None,
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("run_paused")),
        "{v}"
    );
    k.client
        .post(&format!("/v1/runs/{run}/resume"), &json!({}))
        .await
        .unwrap();
    let (s, v) = k
        .client
        .request(
            Method::POST,
            &format!("/v1/operations/{op}/approve"),
            None,
            &[],
        )
        .await
        .unwrap();
    assert_eq!(s, 200, "{v}");
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["exit_code"].as_i64()),
        (Some("completed"), Some(0)),
        "{s}"
    );
    assert_eq!(s["output_tail"], "done\n");
    assert_eq!(s["approval"]["decided_by"], "operator");
    // approving twice is a conflict, not a second run
    let (s, _) = k
        .client
        .request(
            Method::POST,
            &format!("/v1/operations/{op}/approve"),
            None,
            &[],
        )
        .await
        .unwrap();
    assert_eq!(s, 409);
    assert_eq!(
        event_kinds(&k, &run, &op).await,
        [
            "tool.started",
            "approval.requested",
            "approval.granted",
            "tool.completed"
        ]
    );
}

#[tokio::test]
async fn deny_timeout_deny_escalation_and_kill() {
    let k = kernel("deny", &[("OPKERNEL_APPROVAL_MATCH", "^rm -rf")]).await;
    let (run, agent) = gated_run(&k, json!({"match": ["^gated"]})).await;
    // a kernel-wide rule holds it too
    let denied = start(&agent, &run, &["rm", "-rf", "/scratch/x"], 60).await;
    let denied = denied["operation_id"].as_str().unwrap().to_owned();
    let (s, _) = k
        .client
        .request(
            Method::POST,
            &format!("/v1/operations/{denied}/deny"),
            Some(&json!({"reason": "not on prod"})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(s, 200);
    let killed = start(&agent, &run, &["gated", "one"], 60).await;
    let killed = killed["operation_id"].as_str().unwrap().to_owned();
    let (s, v) = agent
        .request(
            Method::POST,
            &format!("/v1/runs/{run}/tools/kill_operation"),
            Some(&json!({"operation_id": killed})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!((s, v["status"].as_str()), (200, Some("denied")), "{v}");
    let r = agent
        .get(&format!("/v1/runs/{run}/report?wait=5"))
        .await
        .unwrap();
    let text = r["text"].as_str().unwrap();
    assert!(
        text.contains(&format!("- {denied} denied by operator: not on prod")),
        "{text}"
    );
    assert!(
        text.contains(&format!("- {killed} denied: cancelled before approval")),
        "{text}"
    );
    for op in [&denied, &killed] {
        let s = k.state(op).await.unwrap();
        assert_eq!(s["status"], "denied");
        assert!(s["started_at"].is_null() && s["exit_code"].is_null());
    }

    // on_timeout deny: denied once the timeout passes
    let (run2, agent2) = gated_run(
        &k,
        json!({"all": true, "timeout_sec": 1, "on_timeout": "deny"}),
    )
    .await;
    let op = start(&agent2, &run2, &["true"], 60).await;
    let op = op["operation_id"].as_str().unwrap().to_owned();
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["message"].as_str()),
        (Some("denied"), Some("approval timed out"))
    );
    let r = agent2
        .get(&format!("/v1/runs/{run2}/report?wait=5"))
        .await
        .unwrap();
    assert!(r["text"]
        .as_str()
        .unwrap()
        .contains("denied: approval timed out"));

    // escalate (the default): recorded once, and it keeps waiting
    let (run3, agent3) = gated_run(&k, json!({"all": true, "timeout_sec": 1})).await;
    let op = start(&agent3, &run3, &["true"], 60).await;
    let op = op["operation_id"].as_str().unwrap().to_owned();
    k.wait_state(&op, T, |s| s["approval"]["escalated_at"].is_string())
        .await
        .unwrap();
    // a later pass of the timeout sweep (one transaction over every
    // waiting op) ends a witness with on_timeout deny: that pass saw the
    // escalated op too, and left it as it was
    let witness = start(&agent2, &run2, &["true"], 60).await;
    let witness = witness["operation_id"].as_str().unwrap().to_owned();
    let w = k.wait_terminal(&witness, T).await.unwrap();
    assert_eq!(w["message"], "approval timed out", "{w}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let s = k.state(&op).await.unwrap();
    assert_eq!(s["status"], "awaiting_approval", "{s}");
    assert!(s["approval"]["escalated_at"].is_string(), "{s}");
    assert_eq!(
        event_kinds(&k, &run3, &op).await,
        ["tool.started", "approval.requested", "approval.escalated"]
    );
    // a cancel of the run denies it
    let v = k
        .client
        .post(&format!("/v1/runs/{run3}/cancel"), &json!({}))
        .await
        .unwrap();
    assert_eq!(v["denied"], json!([op]));
    assert_eq!(k.state(&op).await.unwrap()["status"], "denied");
}

/// A held op is live: its run's idle container is kept by the reaper's
/// first look (a dry run says so, naming the op), not only by the re-check
/// under the run's gate.
#[tokio::test(flavor = "multi_thread")]
async fn a_held_op_keeps_its_runs_container_from_the_reaper() {
    let k = kernel("held-reap", &[("OPKERNEL_REAP_TTL", "1s")]).await;
    let (run, c) = gated_run(&k, json!({"match": ["^gated"]})).await;
    // the container exists (an ordinary op ran and ended), then an op waits
    let first = start(&c, &run, &["true"], 30).await;
    let first_id = first["operation_id"].as_str().unwrap();
    let done = k.wait_terminal(first_id, T).await.unwrap();
    let container = done["container_id"].as_str().unwrap().to_owned();
    let held = start(&c, &run, &["gated", "thing"], 30).await;
    assert_eq!(held["status"], "awaiting_approval", "{held}");
    let held_id = held["operation_id"].as_str().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = k
        .client
        .post("/v1/reap?dry_run=true", &json!({}))
        .await
        .unwrap();
    let d = v["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["container_id"] == container.as_str())
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(d["action"], "keep", "{v}");
    assert!(d["reason"].as_str().unwrap_or("").contains(held_id), "{d}");
    k.client
        .post(
            &format!("/v1/operations/{held_id}/deny"),
            &json!({"reason": "test"}),
        )
        .await
        .unwrap();
}
