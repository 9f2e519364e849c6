//! Drills of timing races: a slow Docker start, a kill that
//! arrives before the exec, a wall-clock step, a kill interrupted by a
//! restart of a command that honours SIGTERM.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use super::proxy::{DockerProxy, Hold};
use super::{check, check_ended_once, count_lines, ops_path, scratch_path, unique_run, Kit, LONG};

/// A proxy in front of the real Docker socket, for one drill.
pub(super) fn docker_proxy() -> anyhow::Result<(DockerProxy, PathBuf)> {
    let sock = std::env::temp_dir().join(format!(
        "opk-proxy-{}.sock",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    let upstream = std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_owned))
        .unwrap_or_else(|| "/var/run/docker.sock".into());
    Ok((DockerProxy::start(&sock, Path::new(&upstream))?, sock))
}

/// The exec start of an op outlives the Docker request timeout. Released
/// later, the command runs once and completes; dropped, the op is lost
/// with effect uncertain. Never `failed` ("nothing ran") on a guess.
pub async fn slow_start(kit: &Kit) -> anyhow::Result<String> {
    let (proxy, sock) = docker_proxy()?;
    let env = [
        ("OPKERNEL_DOCKER_SOCKET", sock.to_str().unwrap_or_default()),
        ("OPKERNEL_DOCKER_TIMEOUT", "2s"),
        ("OPKERNEL_START_EVIDENCE", "1000ms"),
        ("OPKERNEL_GRACE", "9000ms"),
        // the drill holds a docker exec start: ops must go that way
        ("OPKERNEL_LAUNCHER", "off"),
    ];
    let k = kit.start("slowstart", &env).await?;
    let run = unique_run("slowstart");
    // the run container exists before the hold
    let warm = k.start_bg(&run, &["true"], 60).await?;
    k.wait_terminal(&warm, LONG).await?;
    let append = |file: &str| format!("echo \"$__OPKERNEL_OP\" >> /scratch/{file}; exit 4");

    proxy.hold(&["/exec/", "/start"]);
    let a = k
        .start_bg(&run, &["sh", "-c", &append("ran-a")], 60)
        .await?;
    // past the request timeout and the start-evidence window
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let during = k.state(&a).await?;
    check(during["status"] == "starting", || {
        format!("a start of unknown outcome was settled on a guess: {during}")
    })?;
    proxy.end_hold(Hold::Release);
    let a_end = k.wait_terminal(&a, LONG).await?;
    check(
        a_end["status"] == "completed" && a_end["exit_code"] == 4,
        || format!("released start: {a_end}"),
    )?;
    check(count_lines(&scratch_path(&k, &run, "ran-a")) == 1, || {
        "the released command did not run exactly once".into()
    })?;

    proxy.hold(&["/exec/", "/start"]);
    let b = k
        .start_bg(&run, &["sh", "-c", &append("ran-b")], 60)
        .await?;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    proxy.end_hold(Hold::Drop);
    let b_end = k.wait_terminal(&b, LONG).await?;
    check(
        b_end["status"] == "lost" && b_end["effect"] == "uncertain" && b_end["exit_code"].is_null(),
        || format!("dropped start: {b_end}"),
    )?;
    check(!scratch_path(&k, &run, "ran-b").exists(), || {
        "the dropped start ran".into()
    })?;
    let _ = std::fs::remove_file(proxy.socket());
    Ok(format!(
        "start held past the 2 s request timeout: released -> ran once, completed 4; dropped -> lost, effect uncertain ({})",
        b_end["message"]
    ))
}

/// A kill that arrives while the run container is being created wins: the
/// command never runs, and the op is failed with killed.
pub async fn kill_before_start(kit: &Kit) -> anyhow::Result<String> {
    let (proxy, sock) = docker_proxy()?;
    let env = [("OPKERNEL_DOCKER_SOCKET", sock.to_str().unwrap_or_default())];
    let k = kit.start("killfirst", &env).await?;
    let run = unique_run("killfirst");
    proxy.hold(&["/containers/create"]);
    let op = k
        .start_bg(&run, &["sh", "-c", "echo ran >> /scratch/ran"], 60)
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let kill = k.kill_in_background(&run, &op).await?;
    proxy.end_hold(Hold::Release);
    let s = k.wait_terminal(&op, LONG).await?;
    let _ = kill.await;
    check(
        s["status"] == "failed" && s["killed"] == true && s["message"] == "cancelled before start",
        || format!("kill before the exec: {s}"),
    )?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // the run goes on: its next op runs in the container made meanwhile and
    // writes to /scratch, the way the cancelled one would have; a start of
    // the cancelled one, made before this one's, would have run by now
    let next = k
        .start_bg(&run, &["sh", "-c", "echo next >> /scratch/next"], 60)
        .await?;
    let n = k.wait_terminal(&next, LONG).await?;
    check(n["status"] == "completed" && n["exit_code"] == 0, || {
        format!("next op: {n}")
    })?;
    check(scratch_path(&k, &run, "next").exists(), || {
        "the next op's write is not in the scratch dir".into()
    })?;
    check(!scratch_path(&k, &run, "ran").exists(), || {
        "the command ran although its kill came first".into()
    })?;
    let _ = std::fs::remove_file(proxy.socket());
    Ok("kill during container creation: failed, killed, 'cancelled before start'; the command never ran".into())
}

/// The wall clock steps two hours forward under a running op: its timeout
/// is measured on the monotonic clock, so it does not fire. The step is
/// made to `store::now_ms`, the kernel's only wall-clock reader (the lint
/// in `wall_clock_tests.rs` fails on any other), so it reaches every
/// deadline the kernel computes.
pub async fn clock_step(kit: &Kit) -> anyhow::Result<String> {
    let k = kit.start("clock", &[]).await?;
    let run = unique_run("clock");
    let op = k
        .start_bg(&run, &["sh", "-c", "sleep 4; exit 0"], 60)
        .await?;
    k.container_of(&op).await?;
    k.client
        .post("/v1/drill/clock-step", &json!({"ms": 2 * 3600 * 1000}))
        .await?;
    // a spurious wake-up makes the observer look at its deadline at once
    k.client
        .post(&format!("/v1/drill/observer-wake/{op}"), &json!({}))
        .await?;
    // and a failed attempt makes the next one compute it again, after
    // the step: it must carry the first reading, not read the clock anew
    k.client
        .post(&format!("/v1/drill/observer-fault/{op}"), &json!({}))
        .await?;
    let s = k.wait_terminal(&op, LONG).await?;
    check(s["attempt"].as_u64() >= Some(2), || {
        format!("no second attempt after the step: {s}")
    })?;
    check(s["status"] == "completed" && s["exit_code"] == 0, || {
        format!("a forward clock step timed the op out: {s}")
    })?;
    // a real timeout still fires on time after the step
    let slow = k.start_bg(&run, &["sleep", "30"], 2).await?;
    let t = k.wait_terminal(&slow, Duration::from_secs(20)).await?;
    check(
        t["status"] == "timed_out" && t["effect"] == "uncertain",
        || format!("timeout after the step: {t}"),
    )?;
    Ok("wall clock stepped +2 h, then an observer attempt failed: the next attempt kept the deadline; the op completed 0; a 2 s timeout still fired".into())
}

/// A kill of a command that honours SIGTERM (slowly) is interrupted by a
/// kernel SIGKILL after the TERM landed (durably recorded): the command
/// ends 143 while the kernel is down (its `.code` is there before the
/// restart), and after the restart the op ends `killed` with 143, because
/// the signal was recorded durably.
pub async fn kill_interrupted_term(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit
        .start("killterm", &[("OPKERNEL_KILL_GRACE", "5000ms")])
        .await?;
    let run = unique_run("killterm");
    let op = k
        .start_bg(
            &run,
            &[
                "bash",
                "-c",
                "trap 'sleep 5; exit 143' TERM; sleep 300 & wait",
            ],
            600,
        )
        .await?;
    k.container_of(&op).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let kill = k.kill_in_background(&run, &op).await?;
    // the command ends 5 s after the TERM: the kernel dies well before
    let term_landed = k.wait_signalled(&op, Duration::from_secs(4)).await;
    k.sigkill();
    let _ = kill.await;
    term_landed?;
    let flags = k.kill_flags_offline(&op)?;
    check(flags.intent && flags.signalled, || {
        format!("the TERM did not land before the kernel's SIGKILL: {flags:?}")
    })?;
    let code_path = ops_path(&k, &run, &op, "code");
    check(!code_path.exists(), || {
        "the command ended before the kernel's SIGKILL".into()
    })?;
    let s = k.state_offline(&op)?;
    check(s.0 == "running", || {
        format!("op settled before the restart: {s:?}")
    })?;
    // the command ends on the TERM while the kernel is down
    let deadline = Instant::now() + Duration::from_secs(15);
    while !code_path.exists() {
        check(Instant::now() < deadline, || {
            "the command did not end on the TERM while the kernel was down".into()
        })?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = std::fs::read_to_string(&code_path)?;
    let code = match sandbox::opfiles::parse_op_result(".code", &text) {
        Ok(sandbox::OpResult::Exited(rec)) => rec.code,
        other => anyhow::bail!("unexpected code record {text:?}: {other:?}"),
    };
    check(code == 143, || {
        format!("the command ended {code} while the kernel was down, not 143")
    })?;
    check(k.state_offline(&op)?.0 == "running", || {
        "settled while the kernel was down".into()
    })?;
    k.spawn().await?;
    let s = k.wait_terminal(&op, LONG).await?;
    check(
        s["status"] == "completed" && s["exit_code"] == 143 && s["killed"] == true,
        || format!("a TERM-ended kill across a restart: {s}"),
    )?;
    check_ended_once(&k, &run, &[&op]).await?;
    Ok("TERM landed (recorded), kernel SIGKILLed, command ended 143 while down (.code before the restart): completed 143, killed".into())
}
