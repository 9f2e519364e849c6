#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Behaviour the seeds require that had no test of its own: `finish`
//! waits for a running background op and starts nothing (force-final); a
//! console followed across a kernel SIGKILL ends with `done` and the real
//! exit code; a background one-shot (no run) is refused.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opkernel::drills::harness::{docker_exec, kernel_binary, KernelProcess};
use opkernel_tests::unique_run;
use reqwest::Method;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

async fn kernel(tag: &str) -> KernelProcess {
    KernelProcess::start(&kernel_binary().unwrap(), tag, &[])
        .await
        .unwrap()
}

#[tokio::test]
async fn finish_waits_for_a_running_background_op_and_starts_nothing() {
    let k = kernel("final").await;
    let run = unique_run("final");
    let op = k
        .start_bg(
            &run,
            &["sh", "-c", "echo ran >> /scratch/count; sleep 3; exit 2"],
            60,
        )
        .await
        .unwrap();
    let running = k
        .wait_state(&op, T, |s| s["pid"].is_number())
        .await
        .unwrap();
    assert_eq!(running["status"], "running");
    let began = Instant::now();
    let finish = k
        .client
        .post(&format!("/v1/runs/{run}/finish"), &json!({}))
        .await
        .unwrap();
    let waited = began.elapsed();
    // it blocked until the op ended (about 3 s after its start), and
    // returned it terminal with its code
    assert!(
        waited >= Duration::from_millis(1500),
        "finish returned after {waited:?}"
    );
    let ops = finish["operations"].as_array().unwrap();
    assert_eq!(ops.len(), 1, "finish started nothing: {finish}");
    assert_eq!(
        (
            ops[0]["operation_id"].as_str(),
            ops[0]["status"].as_str(),
            ops[0]["exit_code"].as_i64()
        ),
        (Some(op.as_str()), Some("completed"), Some(2)),
        "{finish}"
    );
    // the outcome came back in finish's report, exactly once
    let text = finish["report"]["text"].as_str().unwrap();
    assert_eq!(text.matches(&op).count(), 1, "{text}");
    let (s, v) = k
        .client
        .request(
            Method::GET,
            &format!("/v1/runs/{run}/report?wait=0"),
            None,
            &[],
        )
        .await
        .unwrap();
    assert_eq!(s, 200);
    // the unacked report is served again as it was, nothing new in it
    assert_eq!(v["report_id"], finish["report"]["report_id"], "{v}");
    let container = running["container_id"].as_str().unwrap();
    assert_eq!(
        docker_exec(container, "cat /scratch/count").unwrap(),
        "ran\n"
    );
}

#[tokio::test]
async fn a_console_followed_across_a_kernel_restart_ends_with_done_and_the_code() {
    let mut k = kernel("console-restart").await;
    let run = unique_run("console");
    let script = "for i in 1 2 3 4 5 6; do echo line$i; sleep 0.5; done; exit 6";
    let op = k.start_bg(&run, &["sh", "-c", script], 60).await.unwrap();
    let text = Arc::new(Mutex::new(String::new()));
    let follower = {
        let (client, text, path) = (
            k.client.clone(),
            text.clone(),
            format!("/v1/operations/{op}/console"),
        );
        tokio::spawn(async move {
            client
                .sse(&path, |event, data| {
                    if event == "output" {
                        let v: Value = serde_json::from_str(data).unwrap();
                        text.lock().unwrap().push_str(v["text"].as_str().unwrap());
                        true
                    } else {
                        false
                    }
                })
                .await
        })
    };
    let until = Instant::now() + T;
    while !text.lock().unwrap().contains("line2") {
        assert!(Instant::now() < until, "no output before the restart");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // the kernel dies under the open stream
    k.sigkill();
    let _ = tokio::time::timeout(Duration::from_secs(10), follower).await;
    let seen = text.lock().unwrap().clone();
    assert!(
        !seen.contains("line6"),
        "the op ended before the kill: {seen:?}"
    );
    k.spawn().await.unwrap();
    // the follower resumes from the bytes it has
    let mut rest = String::new();
    let mut done = Value::Null;
    k.client
        .sse(
            &format!("/v1/operations/{op}/console?offset={}", seen.len()),
            |event, data| {
                let v: Value = serde_json::from_str(data).unwrap();
                if event == "output" {
                    rest.push_str(v["text"].as_str().unwrap());
                    true
                } else {
                    done = v;
                    false
                }
            },
        )
        .await
        .unwrap();
    assert_eq!(
        format!("{seen}{rest}"),
        "line1\nline2\nline3\nline4\nline5\nline6\n"
    );
    assert_eq!(
        (done["status"].as_str(), done["exit_code"].as_i64()),
        (Some("completed"), Some(6)),
        "{done}"
    );
}

#[tokio::test]
async fn a_background_one_shot_is_refused() {
    let k = kernel("oneshot").await;
    let (s, v) = k
        .client
        .request(
            Method::POST,
            "/v1/tools/run_command",
            Some(&json!({"command": ["sh", "-c", "echo x"], "background": true})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("need a run"),
        "{v}"
    );
    // nothing was recorded or started for it
    let (_, ops) = k
        .client
        .request(Method::GET, "/v1/ops", None, &[])
        .await
        .unwrap();
    assert_eq!(ops["operations"].as_array().map(Vec::len), Some(0), "{ops}");
    // the foreground one-shot still works
    let (s, v) = k
        .client
        .request(
            Method::POST,
            "/v1/tools/run_command",
            Some(&json!({"command": ["sh", "-c", "echo fg; exit 3"]})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!((s, v["exit_code"].as_i64()), (200, Some(3)), "{v}");
}
