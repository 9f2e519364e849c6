#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Background operations end to end: a real `opkernel serve` process, real
//! containers. Every status is reached for real, results are delivered
//! exactly once, reports are re-served until acked, notes wake waiters and
//! consoles end with `done`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use opkernel::drills::harness::{docker_exec, kernel_binary, KernelProcess};
use opkernel_tests::{
    assert_only_init_and_launcher, docker_top, image_tests, unique_run, wait_for, Image,
};
use reqwest::Method;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

async fn kernel(tag: &str) -> KernelProcess {
    KernelProcess::start(&kernel_binary().unwrap(), tag, &[])
        .await
        .unwrap()
}

// the op lifecycle, on each run image
image_tests!(
    completed_ops_keep_their_real_exit_codes,
    kill_ends_with_143_or_137_and_killed_true,
    timeout_kills_and_reports_timed_out,
    vanished_process_is_lost_never_zero,
    instant_exit_and_kill_racing_completion_settle_once,
    twenty_ops_ending_together_are_each_delivered_once,
    console_streams_output_and_ends_with_done,
);

async fn completed_ops_keep_their_real_exit_codes(image: Image) {
    let k = image.kernel("codes").await.unwrap();
    let run = unique_run("codes");
    let ok = k.start_bg(&run, &["true"], 60).await.unwrap();
    let three = k
        .start_bg(&run, &["sh", "-c", "echo out; echo err >&2; exit 3"], 60)
        .await
        .unwrap();
    let s = k.wait_terminal(&ok, T).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["exit_code"].as_i64()),
        (Some("completed"), Some(0)),
        "{s}"
    );
    assert_eq!(s["attempt"], 1);
    let s = k.wait_terminal(&three, T).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["exit_code"].as_i64()),
        (Some("completed"), Some(3)),
        "{s}"
    );
    assert_eq!(s["output_tail"], "out\nerr\n");
    assert_eq!(s["log_size"], 8);
    assert_eq!(s["killed"], false);
    assert!(s["log_sha256"].as_str().unwrap().len() == 64);
}

async fn kill_ends_with_143_or_137_and_killed_true(image: Image) {
    let k = image.kernel("kill").await.unwrap();
    let run = unique_run("kill");
    let polite = k.start_bg(&run, &["sleep", "300"], 600).await.unwrap();
    let stubborn = k
        .start_bg(
            &run,
            &["bash", "-c", "trap '' TERM; sleep 300 & sleep 301 & wait"],
            600,
        )
        .await
        .unwrap();
    let container = k.container_of(&stubborn).await.unwrap();
    k.container_of(&polite).await.unwrap();
    // bash installs its trap before it forks the sleeps: once its last
    // child shows in the container's process table, the trap is in place
    wait_for("the stubborn op's children", T, || async {
        docker_top(&container)
            .iter()
            .any(|r| r.args == "sleep 301")
            .then_some(())
    })
    .await;
    for op in [&polite, &stubborn] {
        let (status, body) = k
            .client
            .request(
                Method::POST,
                &format!("/v1/runs/{run}/tools/kill_operation"),
                Some(&json!({"operation_id": op})),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
    }
    let p = k.wait_terminal(&polite, T).await.unwrap();
    assert_eq!(
        (
            p["status"].as_str(),
            p["exit_code"].as_i64(),
            p["killed"].as_bool()
        ),
        (Some("completed"), Some(143), Some(true)),
        "{p}"
    );
    let s = k.wait_terminal(&stubborn, T).await.unwrap();
    assert_eq!(
        (
            s["status"].as_str(),
            s["exit_code"].as_i64(),
            s["killed"].as_bool()
        ),
        (Some("completed"), Some(137), Some(true)),
        "{s}"
    );
    // the full process table (every user's: the ops ran as uid 1000) holds
    // nothing of either op
    let top = docker_top(&container);
    assert!(
        !top.iter().any(|r| r.args.contains("sleep 30")),
        "a process of the ops is left: {top:#?}"
    );
    assert_only_init_and_launcher(&container, Duration::from_secs(2)).await;
    // killing an ended op answers its terminal state
    let (status, body) = k
        .client
        .request(
            Method::POST,
            &format!("/v1/runs/{run}/tools/kill_operation"),
            Some(&json!({"operation_id": polite})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!((status, body["status"].as_str()), (200, Some("completed")));
    let delivered = k.collect_deliveries(&run, 2, T).await.unwrap();
    assert_eq!(delivered.len(), 2);
}

/// The harness's `docker exec` never reads a failed exec as an empty answer
/// (a check on its output would pass on nothing).
#[test]
fn a_failed_docker_exec_is_an_error() {
    let err = docker_exec("opkernel-no-such-container", "true").unwrap_err();
    assert!(err.to_string().contains("No such container"), "{err:#}");
}

async fn timeout_kills_and_reports_timed_out(image: Image) {
    let k = image.kernel("timeout").await.unwrap();
    let run = unique_run("timeout");
    let op = k.start_bg(&run, &["sleep", "300"], 2).await.unwrap();
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(s["status"], "timed_out", "{s}");
    assert_eq!(s["killed"], true, "a signal reached it");
    // cut off mid-work: what it did is uncertain (seed 002)
    assert_eq!(s["effect"], "uncertain", "{s}");
    let dur = s["duration_sec"].as_f64().unwrap();
    assert!((2.0..10.0).contains(&dur), "{dur}");
    let report = k
        .client
        .get(&format!("/v1/runs/{run}/report?wait=5"))
        .await
        .unwrap();
    assert!(
        report["text"]
            .as_str()
            .unwrap()
            .contains(&format!("- {op} timed out after 2s (killed)")),
        "{report}"
    );
}

async fn vanished_process_is_lost_never_zero(image: Image) {
    let k = image.kernel("lost").await.unwrap();
    let run = unique_run("lost");
    let op = k
        .start_bg(&run, &["sh", "-c", "exec sleep 301"], 600)
        .await
        .unwrap();
    let container = k.container_of(&op).await.unwrap();
    let wrapper = k.state(&op).await.unwrap()["pid"].as_u64().unwrap();
    // kill the wrapper first (so no code can be written), then the command
    docker_exec(
        &container,
        &format!("kill -9 {wrapper} || exit 1; for p in /proc/[0-9]*; do [ ${{p#/proc/}} = $$ ] && continue; grep -qa 'sleep.301' $p/cmdline 2>/dev/null && kill -9 ${{p#/proc/}}; done; exit 0"),
    )
    .unwrap();
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(s["status"], "lost", "{s}");
    assert_eq!(s["exit_code"], Value::Null);
    assert_eq!(s["effect"], "uncertain");
}

#[tokio::test]
async fn refused_start_is_failed_and_reported() {
    let bin = kernel_binary().unwrap();
    // a listed image the engine lacks stops the kernel at start, named
    let missing = KernelProcess::start(
        &bin,
        "missing",
        &[("OPKERNEL_IMAGE", "opkernel-no-such-image:never")],
    )
    .await
    .err()
    .expect("a kernel with a missing image must not start")
    .to_string();
    assert!(
        missing.contains("default=opkernel-no-such-image:never"),
        "{missing}"
    );
    // an image gone after the start: the op is refused and reported failed
    let doomed = format!("opkernel-test-doomed:{}", uuid::Uuid::new_v4().simple());
    let tag = std::process::Command::new("docker")
        .args(["tag", &opkernel_tests::image(), &doomed])
        .status()
        .unwrap();
    assert!(tag.success());
    let images = format!("doomed={doomed}");
    let k = KernelProcess::start(&bin, "failed", &[("OPKERNEL_IMAGES", &images)])
        .await
        .unwrap();
    let untag = std::process::Command::new("docker")
        .args(["rmi", &doomed])
        .output()
        .unwrap();
    assert!(untag.status.success());
    let run = unique_run("failed");
    let made = k
        .client
        .post("/v1/runs", &json!({"run_id": run, "image": "doomed"}))
        .await
        .unwrap();
    assert_eq!(made["image"], "doomed");
    let op = k.start_bg(&run, &["true"], 60).await.unwrap();
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(s["status"], "failed", "{s}");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("opkernel-test-doomed"),
        "{s}"
    );
    let report = k
        .client
        .get(&format!("/v1/runs/{run}/report?wait=5"))
        .await
        .unwrap();
    assert!(
        report["text"].as_str().unwrap().contains("failed to start"),
        "{report}"
    );
}

async fn instant_exit_and_kill_racing_completion_settle_once(image: Image) {
    let k = image.kernel("race").await.unwrap();
    let run = unique_run("race");
    let fast = k.start_bg(&run, &["true"], 60).await.unwrap();
    let racing = k.start_bg(&run, &["sleep", "0.3"], 60).await.unwrap();
    k.container_of(&racing).await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let (status, _) = k
        .client
        .request(
            Method::POST,
            &format!("/v1/runs/{run}/tools/kill_operation"),
            Some(&json!({"operation_id": racing})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    let s = k.wait_terminal(&racing, T).await.unwrap();
    let outcome = (
        s["status"].as_str().unwrap().to_owned(),
        s["exit_code"].as_i64(),
    );
    assert!(
        outcome == ("completed".into(), Some(0)) || outcome == ("completed".into(), Some(143)),
        "{s}"
    );
    assert_eq!(k.wait_terminal(&fast, T).await.unwrap()["exit_code"], 0);
    let delivered = k
        .collect_deliveries(&run, 2, Duration::from_secs(20))
        .await
        .unwrap();
    let mut sorted = delivered.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), delivered.len(), "duplicates: {delivered:?}");
    assert_eq!(delivered.len(), 2);
    // nothing else comes
    assert!(k
        .collect_deliveries(&run, 1, Duration::from_secs(1))
        .await
        .unwrap()
        .is_empty());
}

async fn twenty_ops_ending_together_are_each_delivered_once(image: Image) {
    let k = image.kernel("twenty").await.unwrap();
    let run = unique_run("twenty");
    let mut ids = HashSet::new();
    for _ in 0..20 {
        ids.insert(k.start_bg(&run, &["sleep", "1"], 60).await.unwrap());
    }
    let delivered = k.collect_deliveries(&run, 20, T).await.unwrap();
    assert_eq!(delivered.len(), 20, "{delivered:?}");
    assert_eq!(delivered.iter().cloned().collect::<HashSet<_>>(), ids);
    assert!(k
        .collect_deliveries(&run, 1, Duration::from_secs(1))
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn unacked_report_is_served_again_identically_and_running_list_is_right() {
    let k = kernel("reserve").await;
    let run = unique_run("reserve");
    let long = k.start_bg(&run, &["sleep", "300"], 600).await.unwrap();
    let short = k
        .start_bg(&run, &["sh", "-c", "echo hi"], 60)
        .await
        .unwrap();
    let first = k
        .client
        .get(&format!("/v1/runs/{run}/report?wait=30"))
        .await
        .unwrap();
    assert_eq!(
        first["resolved"][0]["operation_id"],
        short.as_str(),
        "{first}"
    );
    assert_eq!(first["running"][0]["operation_id"], long.as_str());
    assert!(first["text"]
        .as_str()
        .unwrap()
        .contains("Still running in the background:"));
    let again = k
        .client
        .get(&format!("/v1/runs/{run}/report"))
        .await
        .unwrap();
    assert_eq!(first, again);
    let id = first["report_id"].as_str().unwrap();
    k.client
        .post(&format!("/v1/runs/{run}/report/{id}/ack"), &json!({}))
        .await
        .unwrap();
    let empty = k
        .client
        .get(&format!("/v1/runs/{run}/report?wait=1"))
        .await
        .unwrap();
    assert_eq!(empty["report_id"], Value::Null);
    assert_eq!(empty["resolved"], json!([]));
    assert_eq!(empty["running"][0]["operation_id"], long.as_str());
}

#[tokio::test]
async fn a_note_wakes_a_waiting_report() {
    let k = kernel("note").await;
    let run = unique_run("note");
    k.start_bg(&run, &["sleep", "300"], 600).await.unwrap();
    let client = k.client.base().to_owned();
    let waiter = {
        let c = opkernel::surfaces::cli::client::Client::new(
            client,
            std::fs::read_to_string(k.home.join("operator.token"))
                .unwrap()
                .trim()
                .into(),
        );
        let run = run.clone();
        tokio::spawn(async move {
            let began = Instant::now();
            let r = c
                .get(&format!("/v1/runs/{run}/report?wait=60"))
                .await
                .unwrap();
            (began.elapsed(), r)
        })
    };
    let delay = Duration::from_millis(500);
    tokio::time::sleep(delay).await;
    // the waiter is still waiting: nothing else ended its wait
    assert!(!waiter.is_finished(), "the wait ended before the note");
    k.client
        .post(
            &format!("/v1/runs/{run}/notes"),
            &json!({"text": "switch to the staging db"}),
        )
        .await
        .unwrap();
    let (took, report) = waiter.await.unwrap();
    // it was woken: it had been waiting since before the note (a wait
    // started after the note would answer at once)
    assert!(
        took >= delay,
        "the wait lasted {took:?}, less than the {delay:?} before the note"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(report["notes"], json!(["switch to the staging db"]));
    assert!(report["text"]
        .as_str()
        .unwrap()
        .contains("switch to the staging db"));
}

async fn console_streams_output_and_ends_with_done(image: Image) {
    let k = image.kernel("console").await.unwrap();
    let run = unique_run("console");
    let op = k
        .start_bg(
            &run,
            &[
                "sh",
                "-c",
                "for i in 1 2 3; do echo line$i; sleep 0.2; done; exit 4",
            ],
            60,
        )
        .await
        .unwrap();
    let mut text = String::new();
    let mut done = Value::Null;
    k.client
        .sse(&format!("/v1/operations/{op}/console"), |event, data| {
            let v: Value = serde_json::from_str(data).unwrap();
            if event == "output" {
                text.push_str(v["text"].as_str().unwrap());
                true
            } else {
                done = v;
                false
            }
        })
        .await
        .unwrap();
    assert_eq!(text, "line1\nline2\nline3\n");
    assert_eq!(
        (done["status"].as_str(), done["exit_code"].as_i64()),
        (Some("completed"), Some(4)),
        "{done}"
    );
    // an op that ended long ago still gets its done event, and offsets resume
    let mut events = Vec::new();
    k.client
        .sse(
            &format!("/v1/operations/{op}/console?offset=6"),
            |event, data| {
                events.push((event.to_owned(), data.to_owned()));
                true
            },
        )
        .await
        .unwrap();
    assert!(events[0].1.contains("line2"), "{events:?}");
    assert_eq!(events.last().unwrap().0, "done");
}

#[tokio::test]
async fn idempotency_key_makes_retries_safe() {
    let k = kernel("idem").await;
    let run = unique_run("idem");
    let body = json!({"command": ["sh", "-c", "echo once >> /scratch/count"], "background": true});
    let path = format!("/v1/runs/{run}/tools/run_command");
    let (s1, a) = k
        .client
        .request(
            Method::POST,
            &path,
            Some(&body),
            &[("Idempotency-Key", "k-1")],
        )
        .await
        .unwrap();
    let (s2, b) = k
        .client
        .request(
            Method::POST,
            &path,
            Some(&body),
            &[("Idempotency-Key", "k-1")],
        )
        .await
        .unwrap();
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(a["operation_id"], b["operation_id"]);
    let other = json!({"command": ["true"], "background": true});
    let (s3, c) = k
        .client
        .request(
            Method::POST,
            &path,
            Some(&other),
            &[("Idempotency-Key", "k-1")],
        )
        .await
        .unwrap();
    assert_eq!(s3, 409, "{c}");
    let id = a["operation_id"].as_str().unwrap();
    k.wait_terminal(id, T).await.unwrap();
    let finish = k
        .client
        .post(&format!("/v1/runs/{run}/finish"), &json!({}))
        .await
        .unwrap();
    assert_eq!(
        finish["operations"].as_array().unwrap().len(),
        1,
        "the retry started nothing"
    );
    let ops = k.state(id).await.unwrap();
    let container = ops["container_id"].as_str().unwrap();
    assert_eq!(
        docker_exec(container, "cat /scratch/count").unwrap(),
        "once\n"
    );
}

#[tokio::test]
async fn start_message_and_limits_are_exact() {
    let k = kernel("limits").await;
    let run = unique_run("limits");
    let path = format!("/v1/runs/{run}/tools/run_command");
    let began = Instant::now();
    let (s, body) = k
        .client
        .request(
            Method::POST,
            &path,
            Some(&json!({"command": ["true"], "background": true, "timeout_sec": 30})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(s, 200);
    assert!(began.elapsed() < Duration::from_secs(2));
    let id = body["operation_id"].as_str().unwrap();
    assert_eq!(
        body["message"],
        format!("Started in background as operation {id}. Do not wait idle: continue with other work, and the result (exit code + output tail) will arrive automatically as a follow-up message. The operation times out after 30 s. Use kill_operation to cancel it.")
    );
    for (req, needle) in [
        (
            json!({"command": ["true"], "background": true, "timeout_sec": 3601}),
            "3600",
        ),
        (json!({"command": ["true"], "timeout_sec": 901}), "900"),
        (json!({"command": ["true"], "timeout_sec": 0}), "between 1"),
    ] {
        let (s, body) = k
            .client
            .request(Method::POST, &path, Some(&req), &[])
            .await
            .unwrap();
        assert_eq!(s, 400, "{req} -> {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(needle),
            "{body}"
        );
    }
    let tools = k.client.get("/v1/tools").await.unwrap();
    let desc = tools["tools"][0]["description"].as_str().unwrap();
    assert!(
        desc.contains("3600") && desc.contains("900") && desc.contains("300"),
        "{desc}"
    );
}

#[tokio::test]
async fn console_output_is_live_not_buffered_until_exit() {
    let k = kernel("live").await;
    let run = unique_run("live");
    let op = k
        .start_bg(&run, &["sh", "-c", "echo first; sleep 3; echo second"], 60)
        .await
        .unwrap();
    let began = Instant::now();
    let mut first_at = None;
    let mut done_at = None;
    k.client
        .sse(&format!("/v1/operations/{op}/console"), |event, _| {
            if event == "output" && first_at.is_none() {
                first_at = Some(began.elapsed());
            }
            if event == "done" {
                done_at = Some(began.elapsed());
                return false;
            }
            true
        })
        .await
        .unwrap();
    let (first, done) = (first_at.unwrap(), done_at.unwrap());
    assert!(
        done >= first + Duration::from_secs(2),
        "first output at {first:?}, done at {done:?}"
    );
}
