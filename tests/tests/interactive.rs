#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Interactive operations against the real engine (SPEC §25): stdin
//! pipes and terminals driven over `write_stdin`, `read_output`,
//! `resize_tty`, nudges and single signals; `yield_ms` handing a
//! foreground call over to a report exactly once.

use std::time::Duration;

use base64::Engine;
use opkernel::drills::harness::KernelProcess;
use opkernel::surfaces::cli::client::Client;
use opkernel_tests::{unique_run, Image};
use reqwest::Method;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const T: Duration = Duration::from_secs(60);

/// Starts a background op with `extra` fields (`stdin`, `tty`).
async fn start(k: &KernelProcess, run: &str, cmd: &[&str], extra: Value) -> String {
    let mut body = json!({"command": cmd, "background": true, "timeout_sec": 300});
    for (name, value) in extra.as_object().unwrap() {
        body[name] = value.clone();
    }
    let v = k
        .client
        .post(&format!("/v1/runs/{run}/tools/run_command"), &body)
        .await
        .unwrap();
    v["operation_id"].as_str().unwrap().to_owned()
}

async fn tool(c: &Client, run: &str, name: &str, body: Value) -> (u16, Value) {
    c.request(
        Method::POST,
        &format!("/v1/runs/{run}/tools/{name}"),
        Some(&body),
        &[],
    )
    .await
    .unwrap()
}

async fn write(k: &KernelProcess, run: &str, op: &str, text: &str) -> Value {
    let body = json!({"operation_id": op, "text": text, "yield_ms": 5000});
    let (status, v) = tool(&k.client, run, "write_stdin", body).await;
    assert_eq!(status, 200, "{v}");
    v
}

/// Output until `needle` shows up (or the time is up): the op's whole log.
async fn output_with(k: &KernelProcess, run: &str, op: &str, needle: &str) -> String {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let body = json!({"operation_id": op, "wait_ms": 1000});
        let (status, v) = tool(&k.client, run, "read_output", body).await;
        assert_eq!(status, 200, "{v}");
        let out = v["output"].as_str().unwrap().to_owned();
        if out.contains(needle) || tokio::time::Instant::now() > deadline {
            return out;
        }
    }
}

/// A `python3 -i` REPL on Debian, driven over five writes; writes after its
/// end are refused, and so is a write to an op without stdin.
#[tokio::test]
async fn a_python_repl_is_driven_over_five_writes() {
    let k = Image::Debian.kernel("repl").await.unwrap();
    let run = unique_run("repl");
    let op = start(
        &k,
        &run,
        &["python3", "-i", "-q", "-u"],
        json!({"stdin": true}),
    )
    .await;
    let steps = [
        ("2+3\n", "5"),
        ("x = 7\n", ">>>"),
        ("x * 6\n", "42"),
        ("print('hi ' + str(x))\n", "hi 7"),
        ("import sys; sys.exit(3)\n", ""),
    ];
    for (text, want) in steps {
        let v = write(&k, &run, &op, text).await;
        assert!(v["output"].as_str().unwrap().contains(want), "{text}: {v}");
    }
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["exit_code"].as_i64()),
        (Some("completed"), Some(3))
    );
    let body = json!({"operation_id": op, "text": "1\n"});
    let (status, v) = tool(&k.client, &run, "write_stdin", body).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("operation_ended")),
        "{v}"
    );
    let plain = k.start_bg(&run, &["sleep", "30"], 60).await.unwrap();
    let body = json!({"operation_id": plain, "text": "x\n"});
    let (status, v) = tool(&k.client, &run, "write_stdin", body).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("no_stdin")),
        "{v}"
    );
}

/// A foreground `read -p` on a terminal yields with its prompt; the answer
/// goes in, and the result arrives in a report exactly once.
#[tokio::test]
async fn a_prompt_is_answered_and_a_yielded_result_is_reported_once() {
    let k = Image::Default.kernel("prompt").await.unwrap();
    let run = unique_run("prompt");
    let script = "read -p 'name? ' n; echo \"hello $n\"; exit 4";
    let body = json!({"command": ["bash", "-c", script], "tty": true, "yield_ms": 1500});
    let v = k
        .client
        .post(&format!("/v1/runs/{run}/tools/run_command"), &body)
        .await
        .unwrap();
    assert_eq!(v["running"], true, "{v}");
    assert_eq!(v["background"], true, "{v}");
    assert!(v["output"].as_str().unwrap().contains("name? "), "{v}");
    let op = v["operation_id"].as_str().unwrap().to_owned();
    let answer = write(&k, &run, &op, "Ada\r").await;
    assert!(
        answer["output"].as_str().unwrap().contains("hello Ada"),
        "{answer}"
    );
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(s["exit_code"], 4, "{s}");
    let seen = k.collect_deliveries(&run, 1, T).await.unwrap();
    assert_eq!(seen, vec![op.clone()]);
    let again = k
        .collect_deliveries(&run, 1, Duration::from_secs(3))
        .await
        .unwrap();
    assert!(again.is_empty(), "delivered twice: {again:?}");
}

/// A foreground command that ends within its `yield_ms` answers as always
/// (inline, never reported); one that does not yields its partial output.
#[tokio::test]
async fn yield_ms_answers_with_the_output_so_far() {
    let k = Image::Default.kernel("yield").await.unwrap();
    let run = unique_run("yield");
    let quick = json!({"command": ["echo", "quick"], "yield_ms": 5000});
    let v = k
        .client
        .post(&format!("/v1/runs/{run}/tools/run_command"), &quick)
        .await
        .unwrap();
    assert_eq!(
        (v["status"].as_str(), v["delivered"].as_bool()),
        (Some("completed"), Some(true)),
        "{v}"
    );
    let slow =
        json!({"command": ["sh", "-c", "echo first; sleep 2; echo second"], "yield_ms": 700});
    let v = k
        .client
        .post(&format!("/v1/runs/{run}/tools/run_command"), &slow)
        .await
        .unwrap();
    assert_eq!(v["running"], true, "{v}");
    assert_eq!(v["output"], "first\n", "{v}");
    let op = v["operation_id"].as_str().unwrap().to_owned();
    let seen = k.collect_deliveries(&run, 1, T).await.unwrap();
    assert_eq!(seen, vec![op.clone()]);
    let s = k.state(&op).await.unwrap();
    assert_eq!(s["output_tail"], "first\nsecond\n", "{s}");
    let bad = json!({"command": ["true"], "background": true, "yield_ms": 10});
    let (status, _) = tool(&k.client, &run, "run_command", bad).await;
    assert_eq!(status, 400);
}

/// `tty` and `stty size` see the terminal, also after `resize_tty`; bad
/// sizes and a resize of a pipe op are refused.
#[tokio::test]
async fn a_terminal_op_sees_its_size_change() {
    let k = Image::Default.kernel("tty").await.unwrap();
    let run = unique_run("tty");
    let script = "tty; stty size; read x; stty size";
    let op = start(
        &k,
        &run,
        &["sh", "-c", script],
        json!({"tty": {"rows": 30, "cols": 100}}),
    )
    .await;
    let out = output_with(&k, &run, &op, "30 100").await;
    assert!(out.contains("/dev/pts/"), "{out}");
    assert!(out.contains("30 100"), "{out}");
    let size = json!({"operation_id": op, "rows": 40, "cols": 120});
    let (status, v) = tool(&k.client, &run, "resize_tty", size).await;
    assert_eq!(status, 200, "{v}");
    let v = write(&k, &run, &op, "\r").await;
    assert!(v["output"].as_str().unwrap().contains("40 120"), "{v}");
    for (rows, cols) in [(0, 80), (24, 1001)] {
        let size = json!({"operation_id": op, "rows": rows, "cols": cols});
        assert_eq!(tool(&k.client, &run, "resize_tty", size).await.0, 400);
    }
    let pipe = start(&k, &run, &["cat"], json!({"stdin": true})).await;
    let size = json!({"operation_id": pipe, "rows": 10, "cols": 10});
    let (status, v) = tool(&k.client, &run, "resize_tty", size).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("no_tty")),
        "{v}"
    );
}

/// Ctrl-C (INT) on a terminal stops the foreground job; `bash -i` lives on.
#[tokio::test]
async fn ctrl_c_stops_the_job_and_the_shell_lives_on() {
    let k = Image::Default.kernel("ctrlc").await.unwrap();
    let run = unique_run("ctrlc");
    let op = start(&k, &run, &["bash", "--norc", "-i"], json!({"tty": true})).await;
    write(&k, &run, &op, "sleep 300; echo after-sleep $?\r").await;
    // the sleep runs (a write's answer comes once the echo went quiet)
    tokio::time::sleep(Duration::from_millis(300)).await;
    let kill = json!({"operation_id": op, "signal": "INT"});
    let (status, v) = tool(&k.client, &run, "kill_operation", kill).await;
    assert_eq!(status, 200, "{v}");
    // bash abandons the interrupted line (no "after-sleep") and prompts
    // again; a sleep still running would swallow the next line
    let v = write(&k, &run, &op, "echo alive $((6*7))\r").await;
    assert!(v["output"].as_str().unwrap().contains("alive 42"), "{v}");
    assert_eq!(k.state(&op).await.unwrap()["status"], "running");
    let out = output_with(&k, &run, &op, "alive 42").await;
    assert!(!out.contains("after-sleep 0"), "{out}");
    let bad = json!({"operation_id": op, "signal": "SIGINT"});
    assert_eq!(tool(&k.client, &run, "kill_operation", bad).await.0, 400);
    write(&k, &run, &op, "exit 5\r").await;
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(
        (s["exit_code"].as_i64(), s["killed"].as_bool()),
        (Some(5), Some(false))
    );
    let events = k
        .client
        .get(&format!("/v1/runs/{run}/events"))
        .await
        .unwrap();
    let signalled: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "tool.signalled")
        .collect();
    assert_eq!(signalled.len(), 1, "{events}");
    assert_eq!(signalled[0]["data"]["signal"], "INT");
}

/// 1 MiB written in 64 KiB chunks arrives intact; a retried write with
/// the same `Idempotency-Key` is applied once; EOF ends `cat`.
#[tokio::test]
async fn a_mebibyte_arrives_intact_and_a_keyed_write_applies_once() {
    let k = Image::Default.kernel("mib").await.unwrap();
    let run = unique_run("mib");
    let op = start(&k, &run, &["sha256sum"], json!({"stdin": true})).await;
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    for chunk in data.chunks(64 * 1024) {
        let b64 = base64::engine::general_purpose::STANDARD.encode(chunk);
        let body = json!({"operation_id": op, "data_base64": b64, "yield_ms": 0});
        let (status, v) = tool(&k.client, &run, "write_stdin", body).await;
        assert_eq!(
            (status, v["bytes_written"].as_u64()),
            (200, Some(65536)),
            "{v}"
        );
    }
    let eof = json!({"operation_id": op, "eof": true, "yield_ms": 0});
    assert_eq!(tool(&k.client, &run, "write_stdin", eof).await.0, 200);
    // a command that lives on after its stdin closed: a second EOF is
    // refused as closed (an ended op's would be `operation_ended`)
    let lives = start(
        &k,
        &run,
        &["sh", "-c", "cat; sleep 60"],
        json!({"stdin": true}),
    )
    .await;
    let eof = json!({"operation_id": lives, "eof": true, "yield_ms": 0});
    assert_eq!(
        tool(&k.client, &run, "write_stdin", eof.clone()).await.0,
        200
    );
    let (status, v) = tool(&k.client, &run, "write_stdin", eof).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("stdin_closed")),
        "{v}"
    );
    let s = k.wait_terminal(&op, T).await.unwrap();
    let want = hex::encode(Sha256::digest(&data));
    assert!(s["output_tail"].as_str().unwrap().starts_with(&want), "{s}");

    let cat = start(&k, &run, &["cat"], json!({"stdin": true})).await;
    let keyed = json!({"operation_id": cat, "text": "once\n", "yield_ms": 300});
    for _ in 0..2 {
        let (status, v) = k
            .client
            .request(
                Method::POST,
                &format!("/v1/runs/{run}/tools/write_stdin"),
                Some(&keyed),
                &[("Idempotency-Key", "write-1")],
            )
            .await
            .unwrap();
        assert_eq!(status, 200, "{v}");
    }
    write(&k, &run, &cat, "twice\n").await;
    let out = output_with(&k, &run, &cat, "twice").await;
    assert_eq!(out, "once\ntwice\n");
}

/// A nudge reaches a `while read` loop and is recorded by its length.
#[tokio::test]
async fn a_nudge_reaches_a_read_loop() {
    let k = Image::Default.kernel("nudge").await.unwrap();
    let run = unique_run("nudge");
    let script = "while read line; do echo \"got: $line\"; done";
    let op = start(&k, &run, &["sh", "-c", script], json!({"stdin": true})).await;
    let v = k
        .client
        .post(
            &format!("/v1/operations/{op}/nudge"),
            &json!({"text": "wrap up"}),
        )
        .await
        .unwrap();
    assert!(
        v["output"].as_str().unwrap().contains("got: wrap up"),
        "{v}"
    );
    let events = k
        .client
        .get(&format!("/v1/runs/{run}/events"))
        .await
        .unwrap();
    let nudged = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "tool.nudged")
        .cloned()
        .unwrap();
    assert_eq!(nudged["data"], json!({"bytes": 8}));
    let plain = k.start_bg(&run, &["sleep", "30"], 60).await.unwrap();
    let (status, v) = k
        .client
        .request(
            Method::POST,
            &format!("/v1/operations/{plain}/nudge"),
            Some(&json!({"text": "x"})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("no_stdin")),
        "{v}"
    );
}

/// A run's token writes to its own ops only.
#[tokio::test]
async fn a_write_to_another_runs_op_is_refused() {
    let k = Image::Default.kernel("foreign").await.unwrap();
    let (a, b) = (unique_run("own"), unique_run("other"));
    let created = k
        .client
        .post("/v1/runs", &json!({"run_id": a}))
        .await
        .unwrap();
    let token = created["token"].as_str().unwrap().to_owned();
    let own = Client::new(k.client.base().to_owned(), token);
    let theirs = start(&k, &b, &["cat"], json!({"stdin": true})).await;
    let body = json!({"operation_id": theirs, "text": "x\n"});
    let (status, _) = tool(&own, &b, "write_stdin", body.clone()).await;
    assert_eq!(status, 403);
    let (status, _) = tool(&own, &a, "write_stdin", body).await;
    assert_eq!(status, 404);
}

/// Without the resident launcher (`docker exec` starts every op) stdin
/// and terminals behave the same.
#[tokio::test]
async fn the_exec_path_gives_the_same_stdin_and_terminal() {
    let bin = opkernel::drills::harness::kernel_binary().unwrap();
    let env = [
        ("OPKERNEL_LAUNCHER", "off"),
        ("OPKERNEL_IMAGE", &Image::Default.name()),
    ];
    let k = KernelProcess::start(&bin, "exec-stdin", &env)
        .await
        .unwrap();
    let run = unique_run("execstdin");
    let cat = start(&k, &run, &["cat"], json!({"stdin": true})).await;
    let v = write(&k, &run, &cat, "by exec\n").await;
    assert_eq!(v["output"], "by exec\n", "{v}");
    let sh = start(&k, &run, &["sh"], json!({"tty": {"rows": 12, "cols": 34}})).await;
    let v = write(&k, &run, &sh, "stty size\r").await;
    assert!(v["output"].as_str().unwrap().contains("12 34"), "{v}");
    let inbox = k
        .home
        .join("scratch")
        .join(sandbox::profile::scratch_key(&run))
        .join(".ops/inbox");
    for op in [&cat, &sh] {
        let claimed = inbox.join(format!("{op}.claimed"));
        assert!(!claimed.exists(), "{op} went through the launcher");
    }
}
