#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What the seeds ask and no other test checked (issue 36 item 14): a
//! schedule's fire held by an approval rule, refused by an exhausted
//! budget and by a lowered timeout ceiling (nothing runs); an observer
//! that panics for real is taken over; a grandparent's token reaches its
//! grandchild's ops but never drains its reports; `tool.failed` of a real
//! lost and timed-out op says `effect: "uncertain"`; the background
//! default timeout; the reaper right after a restart; a fresh kill after a
//! restart.

use std::path::PathBuf;
use std::time::{Duration, Instant};

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

/// Creates a run as the operator (or with `token`'s run as its parent);
/// its token.
async fn create(k: &KernelProcess, token: Option<&str>, body: Value) -> String {
    let client = match token {
        Some(t) => Client::new(k.client.base().to_owned(), t.to_owned()),
        None => k.client.clone(),
    };
    let (s, v) = client
        .request(Method::POST, "/v1/runs", Some(&body), &[])
        .await
        .unwrap();
    assert_eq!(s, 200, "{v}");
    v["token"].as_str().unwrap().to_owned()
}

/// A one-shot schedule of `run`, due `in_ms` from now, whose command
/// records that it ran in `/scratch/ran`; its id.
async fn schedule_soon(k: &KernelProcess, run: &str, in_ms: i64, extra: Value) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let at = chrono::DateTime::from_timestamp_millis(now + in_ms)
        .unwrap()
        .to_rfc3339();
    let mut body = json!({"command": ["sh", "-c", "echo scheduled >> /scratch/ran"], "at": at});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    let v = k
        .client
        .post(&format!("/v1/runs/{run}/schedules"), &body)
        .await
        .unwrap();
    v["schedule_id"].as_str().unwrap().to_owned()
}

fn ran_file(k: &KernelProcess, run: &str) -> PathBuf {
    k.home
        .join("scratch")
        .join(sandbox::profile::scratch_key(run))
        .join("ran")
}

/// Waits for the run's first event of `kind`.
async fn event(k: &KernelProcess, run: &str, kind: &str) -> Value {
    let deadline = Instant::now() + T;
    loop {
        let v = k
            .client
            .get(&format!("/v1/runs/{run}/events?limit=500"))
            .await
            .unwrap();
        let found = v["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == kind)
            .cloned();
        if let Some(e) = found {
            return e;
        }
        assert!(Instant::now() < deadline, "no {kind} event: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A fire matched by the run's approval rule waits for the operator:
/// nothing runs, and a denial ends it.
#[tokio::test]
async fn a_scheduled_fire_waits_for_approval_and_never_runs_unapproved() {
    let k = kernel("seed-approval", &[]).await;
    let run = unique_run("sched-appr");
    let envelope = json!({"approval": {"match": ["scheduled"]}});
    create(&k, None, json!({"run_id": run, "envelope": envelope})).await;
    schedule_soon(&k, &run, 1000, json!({})).await;
    let asked = event(&k, &run, "approval.requested").await;
    let op = asked["operation_id"].as_str().unwrap().to_owned();
    assert_eq!(k.state(&op).await.unwrap()["status"], "awaiting_approval");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(k.state(&op).await.unwrap()["status"], "awaiting_approval");
    assert!(!ran_file(&k, &run).exists(), "an unapproved fire ran");
    k.client
        .post(
            &format!("/v1/operations/{op}/deny"),
            &json!({"reason": "no"}),
        )
        .await
        .unwrap();
    let denied = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(denied["status"], "denied", "{denied}");
    assert!(!ran_file(&k, &run).exists());
}

/// A fire of a run whose budget is spent is refused: the slot is skipped
/// with the budget named, nothing runs.
#[tokio::test]
async fn a_scheduled_fire_is_refused_by_an_exhausted_budget() {
    let k = kernel("seed-budget", &[]).await;
    let run = unique_run("sched-budget");
    create(
        &k,
        None,
        json!({"run_id": run, "budget": {"op_seconds": 1}}),
    )
    .await;
    let spend = json!({"command": ["sleep", "1.5"]});
    let path = format!("/v1/runs/{run}/tools/run_command");
    let v = k.client.post(&path, &spend).await.unwrap();
    assert_eq!(v["status"], "completed", "{v}");
    schedule_soon(&k, &run, 500, json!({})).await;
    let skipped = event(&k, &run, "schedule.skipped").await;
    let reason = skipped["data"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("op_seconds"), "{skipped}");
    assert!(!ran_file(&k, &run).exists(), "a fire over budget ran");
}

/// A schedule whose timeout is above a ceiling lowered since it was made
/// is refused at its fire (never clamped): skipped, nothing runs.
#[tokio::test]
async fn a_scheduled_fire_over_a_lowered_timeout_ceiling_is_refused() {
    let mut k = kernel("seed-ceiling", &[]).await;
    let run = unique_run("sched-ceil");
    schedule_soon(&k, &run, 6000, json!({"timeout_sec": 600})).await;
    k.set_env("OPKERNEL_BG_MAX_TIMEOUT", Some("300s"));
    k.restart().await.unwrap();
    let skipped = event(&k, &run, "schedule.skipped").await;
    let reason = skipped["data"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("ceiling") && reason.contains("600"),
        "{skipped}"
    );
    let ops = k.client.get(&format!("/v1/ops?run={run}")).await.unwrap();
    assert_eq!(
        ops["operations"],
        json!([]),
        "a fire over the ceiling made an op"
    );
    assert!(!ran_file(&k, &run).exists());
}

/// An observer attempt that panics for real (its task unwinds) is taken
/// over by the next attempt: the op ends with its real code, once.
#[tokio::test]
async fn an_observer_that_panics_is_taken_over() {
    let k = kernel("seed-panic", &[]).await;
    let run = unique_run("panic");
    let op = k
        .start_bg(&run, &["sh", "-c", "sleep 2; exit 5"], 60)
        .await
        .unwrap();
    k.wait_state(&op, T, |s| s["pid"].is_number())
        .await
        .unwrap();
    let path = format!("/v1/drill/observer-panic/{op}");
    k.client.post(&path, &json!({})).await.unwrap();
    let done = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(
        (done["status"].as_str(), done["exit_code"].as_i64()),
        (Some("completed"), Some(5)),
        "{done}"
    );
    assert!(
        done["attempt"].as_u64() >= Some(2),
        "no new attempt: {done}"
    );
    assert!(k.log().contains("drill: observer panic"), "no real panic");
    let delivered = k.collect_deliveries(&run, 1, T).await.unwrap();
    assert_eq!(delivered, vec![op], "delivered once");
}

/// A grandparent's token reaches its grandchild's ops and trace (state-
/// like actions reach every descendant) but never drains or acks its
/// reports.
#[tokio::test]
async fn a_grandparent_reaches_its_grandchild_but_never_its_reports() {
    let k = kernel("seed-lineage", &[]).await;
    let g = unique_run("g");
    let g_token = create(&k, None, json!({"run_id": g})).await;
    let p = format!("{g}.p");
    let p_token = create(&k, Some(&g_token), json!({"run_id": "p"})).await;
    let c = format!("{p}.c");
    let c_token = create(&k, Some(&p_token), json!({"run_id": "c"})).await;
    let child = Client::new(k.client.base().to_owned(), c_token);
    let body = json!({"command": ["true"], "background": true});
    let v = child
        .post(&format!("/v1/runs/{c}/tools/run_command"), &body)
        .await
        .unwrap();
    let op = v["operation_id"].as_str().unwrap().to_owned();
    k.wait_terminal(&op, T).await.unwrap();
    let grandparent = Client::new(k.client.base().to_owned(), g_token);
    for path in [
        format!("/v1/operations/{op}"),
        format!("/v1/runs/{c}/events"),
        format!("/v1/runs/{c}"),
    ] {
        let (s, v) = grandparent
            .request(Method::GET, &path, None, &[])
            .await
            .unwrap();
        assert_eq!(s, 200, "{path}: {v}");
    }
    let (s, v) = grandparent
        .request(
            Method::GET,
            &format!("/v1/runs/{c}/report?wait=0"),
            None,
            &[],
        )
        .await
        .unwrap();
    assert_eq!(s, 403, "a grandparent drained its grandchild's report: {v}");
    // the grandchild's own result is still there for it, once
    let report = child
        .get(&format!("/v1/runs/{c}/report?wait=5"))
        .await
        .unwrap();
    assert_eq!(
        report["resolved"][0]["operation_id"],
        op.as_str(),
        "{report}"
    );
}

/// The `tool.failed` event of a real timed-out op and of a real lost one
/// (its container removed under it) says `effect: "uncertain"`.
#[tokio::test]
async fn tool_failed_of_a_real_lost_or_timed_out_op_is_uncertain() {
    let k = kernel("seed-uncertain", &[("OPKERNEL_GRACE", "2000ms")]).await;
    let run = unique_run("uncertain");
    let slow = k.start_bg(&run, &["sleep", "30"], 1).await.unwrap();
    let timed_out = k.wait_terminal(&slow, T).await.unwrap();
    assert_eq!(timed_out["status"], "timed_out", "{timed_out}");
    let lost_run = unique_run("lost");
    let doomed = k.start_bg(&lost_run, &["sleep", "30"], 60).await.unwrap();
    let running = k
        .wait_state(&doomed, T, |s| s["pid"].is_number())
        .await
        .unwrap();
    let container = running["container_id"].as_str().unwrap();
    let rm = std::process::Command::new("docker")
        .args(["rm", "-f", container])
        .output()
        .unwrap();
    assert!(rm.status.success(), "{rm:?}");
    let lost = k.wait_terminal(&doomed, T).await.unwrap();
    assert_eq!(lost["status"], "lost", "{lost}");
    for (run, op) in [(&run, &slow), (&lost_run, &doomed)] {
        let failed = event(&k, run, "tool.failed").await;
        assert_eq!(failed["operation_id"], op.as_str(), "{failed}");
        assert_eq!(failed["data"]["effect"], "uncertain", "{failed}");
    }
}

/// A background start without `timeout_sec` gets the 900 s default.
#[tokio::test]
async fn a_background_start_without_a_timeout_gets_900_seconds() {
    let k = kernel("seed-default", &[]).await;
    let run = unique_run("default");
    let body = json!({"command": ["true"], "background": true});
    let v = k
        .client
        .post(&format!("/v1/runs/{run}/tools/run_command"), &body)
        .await
        .unwrap();
    assert_eq!(v["timeout_sec"], 900, "{v}");
    assert!(v["message"].as_str().unwrap().contains("900 s"), "{v}");
}

/// The reaper run at once after a kernel restart (its registry empty)
/// keeps a container with a live op; a kill asked afterwards, to a
/// container of the run's own (no pool), reaches the op's processes.
#[tokio::test]
async fn right_after_a_restart_the_reaper_keeps_live_work_and_a_fresh_kill_works() {
    let mut k = kernel("seed-restart", &[("OPKERNEL_REAP_TTL", "1s")]).await;
    let run = unique_run("restart");
    let op = k.start_bg(&run, &["sleep", "60"], 120).await.unwrap();
    let running = k
        .wait_state(&op, T, |s| s["pid"].is_number())
        .await
        .unwrap();
    let container = running["container_id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_secs(2)).await;
    k.restart().await.unwrap();
    let reaped = k.client.post("/v1/reap", &json!({})).await.unwrap();
    let mine: Vec<&Value> = reaped["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["container_id"] == container.as_str())
        .collect();
    assert_eq!(mine.len(), 1, "{reaped}");
    assert_eq!(mine[0]["action"], "keep", "{reaped}");
    assert_eq!(mine[0]["removed"], false);
    assert_eq!(k.state(&op).await.unwrap()["status"], "running");
    let kill = json!({"operation_id": op});
    k.client
        .post(&format!("/v1/runs/{run}/tools/kill_operation"), &kill)
        .await
        .unwrap();
    let done = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(
        (done["status"].as_str(), done["killed"].as_bool()),
        (Some("completed"), Some(true)),
        "{done}"
    );
    assert!(
        matches!(done["exit_code"].as_i64(), Some(143 | 137)),
        "{done}"
    );
}

/// SPEC §24: a kill asked for an op settled `lost` whose command runs on
/// (its container was paused past the grace window, then thawed) stops
/// it, as a kill would; before, a lost op's processes ran on for ever.
#[tokio::test]
async fn a_kill_of_a_lost_op_still_running_stops_it() {
    lost_op_stopped_by(false).await;
}

/// SPEC §24: a cancel of the run reaches its lost op's command too.
#[tokio::test]
async fn a_cancel_reaches_a_lost_op_still_running() {
    lost_op_stopped_by(true).await;
}

/// A lost op whose command runs on, then a kill of it (or a cancel of its
/// run): the command stops, the op stays lost.
async fn lost_op_stopped_by(cancel: bool) {
    let k = kernel("seed-lost-kill", &[("OPKERNEL_GRACE", "2000ms")]).await;
    let run = unique_run("lostkill");
    let beat = "while true; do echo x >> /scratch/beat; sleep 0.2; done";
    let op = k.start_bg(&run, &["sh", "-c", beat], 120).await.unwrap();
    let running = k
        .wait_state(&op, T, |s| s["pid"].is_number())
        .await
        .unwrap();
    let container = running["container_id"].as_str().unwrap().to_owned();
    let docker = |args: &[&str]| {
        let out = std::process::Command::new("docker")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    docker(&["pause", &container]);
    let lost = k.wait_terminal(&op, T).await;
    docker(&["unpause", &container]);
    let lost = lost.unwrap();
    assert_eq!(lost["status"], "lost", "{lost}");
    let beats = k
        .home
        .join("scratch")
        .join(sandbox::profile::scratch_key(&run))
        .join("beat");
    let size = || std::fs::metadata(&beats).map(|m| m.len()).unwrap_or(0);
    let before = size();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        size() > before,
        "the lost op's command runs on after the thaw"
    );
    if cancel {
        let path = format!("/v1/runs/{run}/cancel");
        k.client.post(&path, &json!({})).await.unwrap();
    } else {
        let kill = json!({"operation_id": op});
        let answer = k
            .client
            .post(&format!("/v1/runs/{run}/tools/kill_operation"), &kill)
            .await
            .unwrap();
        assert!(
            answer["message"]
                .as_str()
                .unwrap()
                .contains("being stopped"),
            "{answer}"
        );
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let stopped = size();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(size(), stopped, "the command still runs after the kill");
    assert_eq!(k.state(&op).await.unwrap()["status"], "lost");
}

/// SPEC §28: an op's `.code` is synced (the file before its rename, the
/// directory after it) before it counts, so a host crash cannot take back
/// an exit code the kernel already read. Seen with `strace` attached to the
/// run container's launcher (the ops' shims are its children).
#[tokio::test]
async fn the_exit_code_is_synced_around_its_rename() {
    let k = kernel("seed-fsync", &[]).await;
    let run = unique_run("fsync");
    let first = k.start_bg(&run, &["true"], 60).await.unwrap();
    let first = k.wait_terminal(&first, T).await.unwrap();
    let container = first["container_id"].as_str().unwrap().to_owned();
    let top = std::process::Command::new("docker")
        .args(["top", &container])
        .output()
        .unwrap();
    let top = String::from_utf8_lossy(&top.stdout).into_owned();
    // the launcher itself, not the container's init that started it
    let launcher = top
        .lines()
        .find(|l| l.contains("shim serve") && !l.contains("docker-init"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no launcher in {top}"))
        .to_owned();
    let trace = k.home.join("strace.out");
    let mut strace = std::process::Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-e",
            "trace=fsync,rename,renameat,renameat2",
            "-p",
            &launcher,
            "-o",
        ])
        .arg(&trace)
        .spawn()
        .expect("strace (Debian's package; scripts/test.sh installs it)");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let op = k.start_bg(&run, &["true"], 60).await.unwrap();
    k.wait_terminal(&op, T).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // SIGTERM: strace detaches and writes what it saw (SIGKILL would not)
    let _ = std::process::Command::new("kill")
        .arg(strace.id().to_string())
        .status();
    let _ = strace.wait();
    let lines: Vec<String> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let renamed = lines
        .iter()
        .position(|l| l.contains(&format!("{op}.code.tmp")) && l.contains("rename"))
        .unwrap_or_else(|| panic!("no rename of {op}.code: {lines:#?}"));
    // the shim's own calls around that rename: the file synced just
    // before it, the directory just after
    let pid = lines[renamed].split_whitespace().next().unwrap().to_owned();
    let prefix = format!("{pid} ");
    let own: Vec<&String> = lines.iter().filter(|l| l.starts_with(&prefix)).collect();
    let at = own.iter().position(|l| **l == lines[renamed]).unwrap();
    assert!(
        at > 0 && own[at - 1].contains("fsync("),
        "no fsync before the rename: {own:#?}"
    );
    assert!(
        own.get(at + 1).is_some_and(|l| l.contains("fsync(")),
        "no fsync after the rename: {own:#?}"
    );
}
