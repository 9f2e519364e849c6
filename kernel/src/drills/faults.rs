//! Drills that break things under a running op: its processes, its
//! container, its files, the Docker daemon, its observer.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use super::harness::{docker_exec, KernelProcess};
use super::{check, count_lines, ops_path, scratch_path, unique_run, Kit, LONG};

/// Kills an op's wrapper first (so it cannot write a code), then the
/// processes whose command line contains `needle`.
fn kill_op_from_inside(container: &str, wrapper_pid: u64, needle: &str) -> anyhow::Result<()> {
    docker_exec(
        container,
        &format!(
            "kill -9 {wrapper_pid}; for p in /proc/[0-9]*; do [ ${{p#/proc/}} = $$ ] && continue; grep -qa '{needle}' $p/cmdline 2>/dev/null && kill -9 ${{p#/proc/}}; done; true"
        ),
    )?;
    Ok(())
}

async fn running_op(
    k: &KernelProcess,
    run: &str,
    command: &[&str],
) -> anyhow::Result<(String, String, u64)> {
    let op = k.start_bg(run, command, 600).await?;
    let container = k.container_of(&op).await?;
    let pid = k.state(&op).await?["pid"]
        .as_u64()
        .context("no pid recorded")?;
    Ok((op, container, pid))
}

pub async fn killed_from_inside(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit.start("inside", &[]).await?;
    let run = unique_run("inside");
    let (op, container, pid) = running_op(&k, &run, &["sh", "-c", "exec sleep 311"]).await?;
    k.sigkill();
    kill_op_from_inside(&container, pid, "sleep.311")?;
    k.spawn().await?;
    let s = k.wait_terminal(&op, LONG).await?;
    check(
        s["status"] == "lost" && s["exit_code"].is_null() && s["effect"] == "uncertain",
        || format!("{s}"),
    )?;
    Ok(format!("lost with effect uncertain: {}", s["message"]))
}

pub async fn container_removed(kit: &Kit) -> anyhow::Result<String> {
    let k = kit.start("removed", &[]).await?;
    let run = unique_run("removed");
    let (op, container, _) = running_op(&k, &run, &["sleep", "300"]).await?;
    std::process::Command::new("docker")
        .args(["rm", "-f", &container])
        .output()?;
    let s = k.wait_terminal(&op, LONG).await?;
    check(
        s["status"] == "lost" && s["exit_code"].is_null() && s["effect"] == "uncertain",
        || format!("{s}"),
    )?;
    // a new op in the run gets a new container
    let next = k.start_bg(&run, &["true"], 60).await?;
    let n = k.wait_terminal(&next, LONG).await?;
    check(
        n["status"] == "completed" && n["container_id"] != container.as_str(),
        || format!("{n}"),
    )?;
    Ok(format!(
        "lost ({}); the run's next op got a fresh container",
        s["message"]
    ))
}

pub async fn garbage_code(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit.start("garbage", &[]).await?;
    let run = unique_run("garbage");
    let (empty, container, pid_a) = running_op(&k, &run, &["sh", "-c", "exec sleep 312"]).await?;
    let (junk, _, pid_b) = running_op(&k, &run, &["sh", "-c", "exec sleep 313"]).await?;
    k.sigkill();
    kill_op_from_inside(&container, pid_a, "sleep.312")?;
    kill_op_from_inside(&container, pid_b, "sleep.313")?;
    std::fs::write(ops_path(&k, &run, &empty, "code"), "")?;
    std::fs::write(ops_path(&k, &run, &junk, "code"), "0 but not really\n")?;
    k.spawn().await?;
    let mut seen = Vec::new();
    for op in [&empty, &junk] {
        let s = k.wait_terminal(op, LONG).await?;
        check(s["status"] == "lost" && s["exit_code"].is_null(), || {
            format!("{op}: {s}")
        })?;
        seen.push(s["message"].as_str().unwrap_or_default().to_owned());
    }
    Ok(format!(
        "empty and garbage .code with dead processes: lost ({})",
        seen.join("; ")
    ))
}

/// The op's processes die while the kernel is down, and its recorded pid
/// now names an unrelated process: another op's (it carries that op's
/// marker), so the signaller sees it and must refuse it on identity. The
/// crashed kernel had recorded a kill, so the restarted one signals at
/// its first step: the signal is attempted (intent recorded, the
/// signaller's answer logged) and reaches nothing (never `signalled`);
/// the unrelated process lives, and the op ends lost, never 0.
pub async fn pid_reused(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit.start("pidreuse", &[]).await?;
    let run = unique_run("pidreuse");
    let (op, container, pid) = running_op(&k, &run, &["sh", "-c", "exec sleep 314"]).await?;
    let other_op = uuid::Uuid::new_v4().to_string();
    let started = std::process::Command::new("docker")
        .args(["exec", "-d", "-e"])
        .arg(format!("__OPKERNEL_OP={other_op}"))
        .args([&container, "sleep", "777"])
        .output()?;
    check(started.status.success(), || {
        format!(
            "docker exec -d: {}",
            String::from_utf8_lossy(&started.stderr)
        )
    })?;
    let find = "for p in /proc/[0-9]*; do [ ${p#/proc/} = $$ ] && continue; grep -qa 'sleep.777' $p/cmdline 2>/dev/null && echo ${p#/proc/}; done; true";
    let deadline = Instant::now() + Duration::from_secs(10);
    let stranger: u64 = loop {
        if let Ok(pid) = docker_exec(&container, find)?.trim().parse() {
            break pid;
        }
        check(Instant::now() < deadline, || {
            "unrelated process not found".into()
        })?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    k.sigkill();
    kill_op_from_inside(&container, pid, "sleep.314")?;
    // the op's recorded pid now names the unrelated process, and the kill
    // requested before the crash had sent nothing yet
    let recorded = k.sql_offline(
        "UPDATE ops SET pid = ?1, kill_requested_at = ?2, kill_reason = 'kill' \
         WHERE id = ?3 AND status = 'running' AND kill_intent = 0",
        &[
            (stranger as i64).into(),
            crate::store::now_ms().into(),
            op.as_str().into(),
        ],
    )?;
    check(recorded == 1, || "the op was not running".into())?;
    k.spawn().await?;
    let s = k.wait_terminal(&op, LONG).await?;
    let alive = docker_exec(
        &container,
        &format!(
            "[ -d /proc/{stranger} ] && grep -qa 'sleep.777' /proc/{stranger}/cmdline && echo alive"
        ),
    )?;
    check(alive.trim() == "alive", || {
        format!("the unrelated process {stranger} was signalled")
    })?;
    let flags = k.kill_flags_offline(&op)?;
    check(flags.intent, || {
        format!("no signal was attempted: {flags:?}")
    })?;
    check(!flags.signalled, || {
        format!("a signal was recorded as landed, though nothing of the op was alive: {flags:?}")
    })?;
    let answered: Vec<String> = k
        .log()
        .lines()
        .map(super::plain)
        .filter(|l| l.contains("signalled op") && l.contains(op.as_str()))
        .collect();
    check(
        !answered.is_empty() && answered.iter().all(|l| l.contains("pids=[]")),
        || format!("the signaller's answers for {op}: {answered:?}"),
    )?;
    check(s["status"] == "lost" && s["exit_code"].is_null(), || {
        format!("{s}")
    })?;
    Ok(format!(
        "{} signal(s) attempted at the op, each refused on identity: unrelated pid {stranger} (marked as another op) survived; op lost, never 0",
        answered.len()
    ))
}

/// A Docker outage while an op runs. By `docker exec` probes (launcher
/// off), a short one costs nothing and a long one makes the op `lost`;
/// with the resident launcher, which answers probes without Docker, even a
/// long one costs nothing (`launcher`): every probe of the outage went to
/// the launcher (the kernel's probe counts), and an op started during the
/// outage runs through the launcher and completes before Docker is back.
pub async fn daemon_outage(kit: &Kit, long: bool, launcher: bool) -> anyhow::Result<String> {
    let (proxy, sock) = super::races::docker_proxy()?;
    let grace = if long { "3s" } else { "8s" };
    let env = [
        ("OPKERNEL_DOCKER_SOCKET", sock.to_str().unwrap_or_default()),
        ("OPKERNEL_GRACE", grace),
        ("OPKERNEL_LAUNCHER", if launcher { "on" } else { "off" }),
    ];
    let k = kit.start("outage", &env).await?;
    let run = unique_run("outage");
    let op = k
        .start_bg(&run, &["sh", "-c", "sleep 6; echo survived; exit 5"], 120)
        .await?;
    k.container_of(&op).await?;
    let cut_for = Duration::from_secs(if long { 7 } else { 3 });
    let probes_before = probe_counts(&k).await?;
    let began = Instant::now();
    proxy.cut();
    // the kernel keeps serving while Docker is unreachable
    let s = k.state(&op).await?;
    check(s["status"] == "running", || {
        format!("not running during the outage: {s}")
    })?;
    // starts go on through the launcher: one runs and ends meanwhile
    let started_during = if launcher {
        Some(start_during_outage(&k, &run, cut_for).await?)
    } else {
        None
    };
    tokio::time::sleep(cut_for.saturating_sub(began.elapsed())).await;
    let during = k.state(&op).await?;
    let probes_during = probe_counts(&k).await?;
    proxy.restore()?;
    let s = k.wait_terminal(&op, LONG).await?;
    let _ = std::fs::remove_file(proxy.socket());
    if let Some(b) = started_during {
        let (by_launcher, silent) = probes_went_to_launcher(&probes_before, &probes_during)?;
        check(during["status"] != "lost", || {
            format!("lost though its launcher answered: {during}")
        })?;
        check(s["status"] == "completed" && s["exit_code"] == 5, || {
            format!("{s}")
        })?;
        let ran = count_lines(&scratch_path(&k, &run, "ran-b"));
        check(ran == 1, || {
            format!("the op started during the outage ran {ran} times")
        })?;
        check(
            super::launcher::started_by(&k, &b)? == super::launcher::StartedBy::Launcher,
            || "the op started during the outage did not run through the launcher".into(),
        )?;
        Ok(format!(
            "outage {cut_for:?} > grace {grace}: every probe asked of the launcher ({by_launcher} answered, {silent} not in time); \
             an op started during it ran through the launcher and completed 6; the first completed with its code 5"
        ))
    } else if long {
        check(
            during["status"] == "lost" && during["effect"] == "uncertain",
            || format!("not lost after the grace window: {during}"),
        )?;
        check(s["status"] == "lost", || format!("{s}"))?;
        Ok(format!(
            "outage {cut_for:?} > grace 3 s: lost after {:.1} s ({})",
            began.elapsed().as_secs_f64(),
            s["message"]
        ))
    } else {
        check(during["status"] == "running", || {
            format!("lost inside the grace window: {during}")
        })?;
        check(s["status"] == "completed" && s["exit_code"] == 5, || {
            format!("{s}")
        })?;
        Ok(format!(
            "outage {cut_for:?} < grace 8 s: op kept running and completed with its code 5"
        ))
    }
}

/// An op started while Docker is cut off: it must run and end (exit 6)
/// within the outage, through the launcher. Returns its id.
async fn start_during_outage(
    k: &KernelProcess,
    run: &str,
    cut_for: Duration,
) -> anyhow::Result<String> {
    let b = k
        .start_bg(
            run,
            &["sh", "-c", "echo $__OPKERNEL_OP >> /scratch/ran-b; exit 6"],
            60,
        )
        .await?;
    let b_end = k.wait_terminal(&b, cut_for).await;
    let b_end = b_end.with_context(|| {
        format!("an op started during the outage did not end within {cut_for:?}")
    })?;
    check(
        b_end["status"] == "completed" && b_end["exit_code"] == 6,
        || format!("the op started during the outage: {b_end}"),
    )?;
    Ok(b)
}

/// Every probe of the outage was asked of the launcher, and it answered;
/// one it was too slow for (a loaded machine) went on by exec and is
/// tolerated. Returns (answered by the launcher, not in time).
fn probes_went_to_launcher(
    before: &crate::runtime::probes::ProbeCounts,
    during: &crate::runtime::probes::ProbeCounts,
) -> anyhow::Result<(u64, u64)> {
    let by_launcher = during.by_launcher - before.by_launcher;
    let silent = during.launcher_silent - before.launcher_silent;
    let by_exec = during.by_exec - before.by_exec;
    check(by_launcher > 0 && by_exec == 0, || {
        format!(
            "probes during the outage: {by_launcher} answered by the launcher, {silent} it was \
             silent for, {by_exec} sent by docker exec without asking it"
        )
    })?;
    Ok((by_launcher, silent))
}

/// The kernel's probe counts (a drill hook).
async fn probe_counts(k: &KernelProcess) -> anyhow::Result<crate::runtime::probes::ProbeCounts> {
    k.client.get_as("/v1/drill/probes").await
}

pub async fn observer_crash(kit: &Kit) -> anyhow::Result<String> {
    let k = kit.start("observer", &[]).await?;
    let run = unique_run("observer");
    let op = k
        .start_bg(
            &run,
            &[
                "sh",
                "-c",
                "echo once >> /scratch/ran; sleep 4; echo finished",
            ],
            120,
        )
        .await?;
    k.container_of(&op).await?;
    k.client
        .post(&format!("/v1/drill/observer-fault/{op}"), &json!({}))
        .await?;
    let s = k
        .wait_state(&op, Duration::from_secs(20), |s| {
            s["attempt"].as_u64() >= Some(2)
        })
        .await?;
    check(s["status"] == "running", || format!("{s}"))?;
    let s = k.wait_terminal(&op, LONG).await?;
    check(
        s["status"] == "completed" && s["exit_code"] == 0 && s["output_tail"] == "finished\n",
        || format!("{s}"),
    )?;
    let ran = count_lines(&scratch_path(&k, &run, "ran"));
    check(ran == 1, || format!("command ran {ran} times"))?;
    // three failures in a row make the op lost with the reason
    let doomed = k.start_bg(&run, &["sleep", "300"], 600).await?;
    k.container_of(&doomed).await?;
    for attempt in 2..=4u64 {
        k.client
            .post(&format!("/v1/drill/observer-fault/{doomed}"), &json!({}))
            .await?;
        k.wait_state(&doomed, Duration::from_secs(20), |s| {
            s["attempt"].as_u64() >= Some(attempt) || s["status"] == "lost"
        })
        .await?;
    }
    let d = k.wait_terminal(&doomed, LONG).await?;
    check(
        d["status"] == "lost"
            && d["message"]
                .as_str()
                .unwrap_or("")
                .contains("observer failed"),
        || format!("{d}"),
    )?;
    Ok(format!(
        "attempt {} attached and completed it (ran once); 3 failed attempts → lost",
        s["attempt"]
    ))
}

/// `docker pause` of a run container for 12 s, well inside the grace
/// window, while its op sleeps 4 s then exits 3: a paused container is
/// unreachable, not stopped, so the op waits and ends `completed 3` once
/// unpaused. Probes run every 500 ms, and the kernel's log must show one
/// finding the container paused, so the pause was really looked at.
pub async fn container_pause(kit: &Kit) -> anyhow::Result<String> {
    let env = [
        ("OPKERNEL_GRACE", "60000ms"),
        ("OPKERNEL_PROBE_INTERVAL", "500ms"),
    ];
    let k = kit.start("pause", &env).await?;
    let run = unique_run("pause");
    let (op, container, _) = running_op(&k, &run, &["sh", "-c", "sleep 4; exit 3"]).await?;
    let docker = |verb: &str| -> anyhow::Result<()> {
        let out = std::process::Command::new("docker")
            .args([verb, &container])
            .output()?;
        check(out.status.success(), || {
            format!("docker {verb}: {}", String::from_utf8_lossy(&out.stderr))
        })
    };
    docker("pause")?;
    let paused = Instant::now();
    let deadline = paused + Duration::from_secs(12);
    while Instant::now() < deadline {
        let s = k.state(&op).await?;
        if s["status"] != "running" {
            let _ = docker("unpause");
            anyhow::bail!("ended while paused (grace 60 s): {s}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let seen = k.log().contains("the container is paused");
    docker("unpause")?;
    check(seen, || "no probe saw the paused container".to_owned())?;
    let s = k.wait_terminal(&op, LONG).await?;
    check(
        s["status"] == "completed" && s["exit_code"] == 3 && s["killed"] == false,
        || format!("{s}"),
    )?;
    Ok(format!(
        "paused {:.0} s inside the 60 s grace: probes saw it paused, the op waited and completed with its code 3",
        paused.elapsed().as_secs_f64()
    ))
}

/// The op's supervisor gives up without settling it (as one whose final
/// `lost` write failed): the watchdog starts a new supervisor within a
/// few seconds, whose attempt attaches; the op ends once, with its code.
pub async fn supervisor_lost(kit: &Kit) -> anyhow::Result<String> {
    let k = kit.start("orphan", &[]).await?;
    let run = unique_run("orphan");
    let (op, _, _) = running_op(&k, &run, &["sh", "-c", "sleep 6; exit 4"]).await?;
    let before = k.state(&op).await?["attempt"].as_u64().unwrap_or(0);
    k.client
        .post(&format!("/v1/drill/supervisor-end/{op}"), &json!({}))
        .await?;
    let given_up = Instant::now();
    let taken = k
        .wait_state(&op, Duration::from_secs(15), |s| {
            s["attempt"].as_u64() > Some(before)
        })
        .await?;
    let after = given_up.elapsed();
    check(k.log().contains("the watchdog starts one"), || {
        "no watchdog line in the kernel's log".to_owned()
    })?;
    check(after < Duration::from_secs(8), || {
        format!("the watchdog took {after:?}")
    })?;
    check(taken["status"] == "running", || format!("{taken}"))?;
    let s = k.wait_terminal(&op, LONG).await?;
    check(s["status"] == "completed" && s["exit_code"] == 4, || {
        format!("{s}")
    })?;
    Ok(format!(
        "supervisor gave up; the watchdog attached attempt {} after {:.1} s; completed 4",
        taken["attempt"],
        after.as_secs_f64()
    ))
}
