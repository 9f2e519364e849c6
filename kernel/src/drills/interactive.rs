//! Interactive drills (SPEC §25): a write to an op's stdin survives a
//! kernel SIGKILL between two writes, and Ctrl-C on a terminal stops the
//! foreground job while the shell lives on.

use std::time::Duration;

use serde_json::{json, Value};

use super::harness::KernelProcess;
use super::{check, check_ended_once, unique_run, Kit, LONG};

/// Starts a background op with `extra` fields (`stdin`, `tty`).
async fn start(k: &KernelProcess, run: &str, cmd: &[&str], extra: Value) -> anyhow::Result<String> {
    let mut body = json!({"command": cmd, "background": true, "timeout_sec": 300});
    for (name, value) in extra.as_object().into_iter().flatten() {
        body[name] = value.clone();
    }
    let v = k
        .client
        .post(&format!("/v1/runs/{run}/tools/run_command"), &body)
        .await?;
    v["operation_id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("no operation id in {v}"))
}

/// One `write_stdin`; its answer.
async fn write(k: &KernelProcess, run: &str, body: Value) -> anyhow::Result<Value> {
    let (status, v) = k
        .client
        .request(
            reqwest::Method::POST,
            &format!("/v1/runs/{run}/tools/write_stdin"),
            Some(&body),
            &[],
        )
        .await?;
    check(status == 200, || {
        format!("write_stdin answered {status}: {v}")
    })?;
    Ok(v)
}

/// A `cat` with stdin; the kernel SIGKILLed between two writes and
/// restarted: both lines come back once, in order, from the same process;
/// then EOF ends it with 0, reported once.
pub async fn stdin_across_restart(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit.start("stdin-restart", &[]).await?;
    let run = unique_run("stdin");
    let op = start(&k, &run, &["cat"], json!({"stdin": true})).await?;
    let first = write(&k, &run, json!({"operation_id": op, "text": "one\n"})).await?;
    check(first["output"] == "one\n", || {
        format!("first write: {first}")
    })?;
    let before = k.state(&op).await?;
    k.sigkill();
    k.wait_exit(Duration::from_secs(10)).await?;
    k.restart().await?;
    let second = write(&k, &run, json!({"operation_id": op, "text": "two\n"})).await?;
    check(second["output"] == "two\n", || {
        format!("second write: {second}")
    })?;
    // the same process: its wrapper's pid and start as before (the new
    // kernel's observer attaches as a later attempt, which never launches)
    let state = k.state(&op).await?;
    let same = state["pid"] == before["pid"] && state["started_at"] == before["started_at"];
    check(same, || format!("the op moved: {before} then {state}"))?;
    write(
        &k,
        &run,
        json!({"operation_id": op, "eof": true, "yield_ms": 0}),
    )
    .await?;
    let s = k.wait_terminal(&op, LONG).await?;
    check(s["status"] == "completed" && s["exit_code"] == 0, || {
        format!("{s}")
    })?;
    check(s["output_tail"] == "one\ntwo\n", || format!("output: {s}"))?;
    let seen = k.collect_deliveries(&run, 1, LONG).await?;
    check(seen == [op.clone()], || format!("delivered {seen:?}"))?;
    check_ended_once(&k, &run, &[&op]).await?;
    Ok("two writes across a SIGKILL reached one cat once, in order; EOF ended it 0".into())
}

/// `bash -i` on a terminal runs `sleep`; INT (Ctrl-C) stops the sleep,
/// the shell lives on and runs the next line; `exit` ends it with its code.
pub async fn tty_ctrl_c(kit: &Kit) -> anyhow::Result<String> {
    let k = kit.start("tty-ctrl-c", &[]).await?;
    let run = unique_run("ctrlc");
    let op = start(&k, &run, &["bash", "--norc", "-i"], json!({"tty": true})).await?;
    write(&k, &run, json!({"operation_id": op, "text": "sleep 300\r"})).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, v) = k
        .client
        .request(
            reqwest::Method::POST,
            &format!("/v1/runs/{run}/tools/kill_operation"),
            Some(&json!({"operation_id": op, "signal": "INT"})),
            &[],
        )
        .await?;
    check(status == 200, || format!("the INT answered {status}: {v}"))?;
    let body = json!({"operation_id": op, "text": "echo alive $((6*7))\r", "yield_ms": 5000});
    let alive = write(&k, &run, body).await?;
    let said = alive["output"].as_str().unwrap_or_default();
    check(said.contains("alive 42"), || {
        format!("after Ctrl-C: {alive}")
    })?;
    write(&k, &run, json!({"operation_id": op, "text": "exit 3\r"})).await?;
    let s = k.wait_terminal(&op, LONG).await?;
    check(s["exit_code"] == 3 && s["killed"] == false, || {
        format!("{s}")
    })?;
    check_ended_once(&k, &run, &[&op]).await?;
    Ok("Ctrl-C stopped the sleep; bash lived on and exited 3".into())
}
