//! Drills of the resident launcher's handover (SPEC §13): the launcher or
//! the kernel dies around a request, the container restarts under one, a
//! flood of requests arrives at once. Every command appends its op id to
//! `/scratch/ran`; each drill checks that every op ran at most once (once
//! when it ended `completed`), that nothing ended silently, and that every
//! result was delivered once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::harness::{docker_exec, KernelProcess};
use super::{check, scratch_path, unique_run, Kit, LONG};

/// The command every drill op runs: it records its own op id, then `rest`.
pub(super) fn recording(rest: &str) -> String {
    format!("echo $__OPKERNEL_OP >> /scratch/ran; {rest}")
}

/// How many times each op id was recorded as run.
pub(super) fn runs(k: &KernelProcess, run: &str) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    let text = std::fs::read_to_string(scratch_path(k, run, "ran")).unwrap_or_default();
    for line in text.lines() {
        *seen.entry(line.trim().to_owned()).or_default() += 1;
    }
    seen
}

/// The run's container (made by a first op) and its launcher's pid, from
/// the launcher's own record.
pub(super) async fn warm(k: &KernelProcess, run: &str) -> anyhow::Result<(String, u32)> {
    // a foreground op: its result goes to its caller, never into a report
    let out = k
        .client
        .post(
            &format!("/v1/runs/{run}/tools/run_command"),
            &serde_json::json!({"command": ["true"]}),
        )
        .await?;
    let container = out["container_id"]
        .as_str()
        .context("no container in the foreground reply")?
        .to_owned();
    let record = scratch_path(k, run, ".ops/launcher.pid");
    let text = std::fs::read_to_string(&record).context("no launcher record")?;
    let pid = sandbox::PidRecord::parse(&text)
        .map_err(|e| anyhow::anyhow!("bad launcher record {text:?}: {e:?}"))?
        .pid;
    Ok((container, pid))
}

/// Sends a signal to the launcher from inside its container.
fn signal_launcher(container: &str, pid: u32, signal: &str) -> anyhow::Result<()> {
    let script = format!("kill -{signal} {pid}");
    if signal == "KILL" {
        // the container ends with its launcher (see `docker_exec_ending`)
        return super::harness::docker_exec_ending(container, &script, Duration::from_secs(10));
    }
    docker_exec(container, &script)?;
    Ok(())
}

/// A run whose launcher is frozen with one op's request filed and waiting:
/// (container, launcher pid, op).
async fn pending_request(k: &KernelProcess, run: &str) -> anyhow::Result<(String, u32, String)> {
    let (container, launcher) = warm(k, run).await?;
    signal_launcher(&container, launcher, "STOP")?;
    let op = k
        .start_bg(run, &["sh", "-c", &recording("true")], 60)
        .await?;
    filed(k, run, &op).await?;
    Ok((container, launcher, op))
}

/// Waits until the op's request sits in the inbox (filed, not claimed).
async fn filed(k: &KernelProcess, run: &str, op: &str) -> anyhow::Result<()> {
    let path = scratch_path(k, run, &format!(".ops/inbox/{op}.req"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        check(Instant::now() < deadline, || {
            format!("{op}'s request was never filed")
        })?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Every op terminal; `completed` ones ran exactly once, others at most
/// once; each delivered exactly once. Returns the statuses by op.
async fn settle_all(
    k: &KernelProcess,
    run: &str,
    ops: &[String],
) -> anyhow::Result<HashMap<String, String>> {
    let mut statuses = HashMap::new();
    for op in ops {
        let s = k.wait_terminal(op, LONG).await?;
        statuses.insert(op.clone(), s["status"].as_str().unwrap_or("").to_owned());
        check(s["status"] != "completed" || s["exit_code"] == 0, || {
            format!("{op} completed with a wrong code: {s}")
        })?;
    }
    let ran = runs(k, run);
    for op in ops {
        let times = ran.get(op).copied().unwrap_or(0);
        let status = &statuses[op];
        check(times <= 1, || format!("{op} ran {times} times"))?;
        check(status != "completed" || times == 1, || {
            format!("{op} completed but ran {times} times")
        })?;
    }
    let delivered = k.collect_deliveries(run, ops.len(), LONG).await?;
    let again = k
        .collect_deliveries(run, 1, Duration::from_millis(500))
        .await?;
    let mut sorted = delivered.clone();
    sorted.sort();
    sorted.dedup();
    check(
        sorted.len() == ops.len() && delivered.len() == ops.len() && again.is_empty(),
        || {
            format!(
                "{} ops: {} delivered ({} distinct), then {} more",
                ops.len(),
                delivered.len(),
                sorted.len(),
                again.len()
            )
        },
    )?;
    Ok(statuses)
}

/// How the control plane says an op was started: handed to the launcher
/// and run by it, or taken back and run by `docker exec` (its exec id is
/// recorded). The handover files leave the inbox once the op settles, so
/// this record is the lasting evidence.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum StartedBy {
    Launcher,
    Exec,
    Neither,
}

pub(super) fn started_by(k: &KernelProcess, op: &str) -> anyhow::Result<StartedBy> {
    sandbox::shim::validate_op_id(op)?;
    let q = |cond: &str| {
        k.sql_offline_query(&format!(
            "SELECT COUNT(*) FROM ops WHERE id = '{op}' AND handed_over_at IS NOT NULL AND {cond}"
        ))
    };
    Ok(if q("exec_id IS NULL AND pid IS NOT NULL")? == 1 {
        StartedBy::Launcher
    } else if q("exec_id IS NOT NULL")? == 1 {
        StartedBy::Exec
    } else {
        StartedBy::Neither
    })
}

pub(super) fn tally(statuses: &HashMap<String, String>) -> String {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for s in statuses.values() {
        *counts.entry(s.as_str()).or_default() += 1;
    }
    let mut parts: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    parts.sort();
    parts.join(", ")
}

/// The launcher is frozen with requests pending, then killed (its container
/// stops with it): the kernel takes each request back and starts it by
/// exec in the restarted container, once.
pub async fn launcher_killed_pending(kit: &Kit) -> anyhow::Result<String> {
    let k = kit
        .start("lkill", &[("OPKERNEL_LAUNCHER_CLAIM", "1500ms")])
        .await?;
    let run = unique_run("lkill");
    let (container, launcher) = warm(&k, &run).await?;
    signal_launcher(&container, launcher, "STOP")?;
    let mut ops = Vec::new();
    for _ in 0..3 {
        ops.push(
            k.start_bg(&run, &["sh", "-c", &recording("true")], 60)
                .await?,
        );
    }
    for op in &ops {
        filed(&k, &run, op).await?;
    }
    signal_launcher(&container, launcher, "KILL")?;
    let statuses = settle_all(&k, &run, &ops).await?;
    check(statuses.values().all(|s| s == "completed"), || {
        format!("not all completed: {statuses:?}")
    })?;
    // the first request taken back restarts the container by its exec;
    // the restarted launcher may then claim the others before their own
    // observers take them back: either way, each ran once
    let mut by_exec = 0;
    for op in &ops {
        let by = started_by(&k, op)?;
        check(by != StartedBy::Neither, || {
            format!("{op} has no start on record")
        })?;
        by_exec += (by == StartedBy::Exec) as usize;
    }
    check(by_exec >= 1, || {
        "no request was taken back and run by exec".into()
    })?;
    Ok(format!(
        "3 pending requests, launcher killed: each ran once, {by_exec} taken back and run by exec, the rest claimed by the restarted launcher ({})",
        tally(&statuses)
    ))
}

/// The kernel dies after filing a request and before seeing it claimed,
/// twice: once the launcher claims while the kernel is down (the restarted
/// kernel finds it running), once it stays frozen (the restarted kernel
/// takes it back and starts it by exec). Each runs once.
pub async fn kernel_killed_after_filing(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit
        .start("kfile", &[("OPKERNEL_LAUNCHER_CLAIM", "4000ms")])
        .await?;
    let run = unique_run("kfile");
    let (container, launcher) = warm(&k, &run).await?;
    signal_launcher(&container, launcher, "STOP")?;
    let claimed_while_down = k
        .start_bg(&run, &["sh", "-c", &recording("sleep 1")], 60)
        .await?;
    filed(&k, &run, &claimed_while_down).await?;
    k.sigkill();
    signal_launcher(&container, launcher, "CONT")?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    k.spawn().await?;
    signal_launcher(&container, launcher, "STOP")?;
    let taken_back = k
        .start_bg(&run, &["sh", "-c", &recording("true")], 60)
        .await?;
    filed(&k, &run, &taken_back).await?;
    k.sigkill();
    k.spawn().await?;
    let ops = vec![claimed_while_down.clone(), taken_back.clone()];
    let statuses = settle_all(&k, &run, &ops).await?;
    signal_launcher(&container, launcher, "CONT")?;
    check(statuses.values().all(|s| s == "completed"), || {
        format!("not all completed: {statuses:?}")
    })?;
    let first = started_by(&k, &claimed_while_down)?;
    check(first == StartedBy::Launcher, || {
        format!("the first request was not claimed by the launcher: {first:?}")
    })?;
    let second = started_by(&k, &taken_back)?;
    check(second == StartedBy::Exec, || {
        format!("the second request was not taken back: {second:?}")
    })?;
    // the thawed launcher finds nothing left to run: it is claiming again
    // (an op filed after the thaw runs through it), so a request of the
    // taken-back op still in its inbox would have run by now
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = k
        .start_bg(&run, &["sh", "-c", &recording("true")], 60)
        .await?;
    let a = k.wait_terminal(&after, LONG).await?;
    check(a["status"] == "completed", || {
        format!("after the thaw: {a}")
    })?;
    let by = started_by(&k, &after)?;
    check(by == StartedBy::Launcher, || {
        format!("the thawed launcher did not run the next op: {by:?}")
    })?;
    check(runs(&k, &run).get(&taken_back) == Some(&1), || {
        "the taken-back request ran again".into()
    })?;
    Ok("claimed while the kernel was down: found running, ran once; still pending at restart: taken back, run once by exec".into())
}

/// The launcher dies between claiming a request and the op's pid file
/// (simulated: the claim rename, then the kill): the op is settled by
/// evidence, `lost`, and never run anywhere.
pub async fn launcher_killed_after_claim(kit: &Kit) -> anyhow::Result<String> {
    let k = kit
        .start(
            "lclaim",
            &[
                ("OPKERNEL_LAUNCHER_CLAIM", "1500ms"),
                ("OPKERNEL_GRACE", "3000ms"),
            ],
        )
        .await?;
    let run = unique_run("lclaim");
    let (container, launcher, op) = pending_request(&k, &run).await?;
    let inbox = |state: &str| scratch_path(&k, &run, &format!(".ops/inbox/{op}.{state}"));
    std::fs::rename(inbox("req"), inbox("claimed"))?;
    signal_launcher(&container, launcher, "KILL")?;
    let statuses = settle_all(&k, &run, std::slice::from_ref(&op)).await?;
    let s = k.state(&op).await?;
    check(
        statuses[&op] == "lost" && s["effect"] == "uncertain",
        || format!("a claimed op without evidence: {s}"),
    )?;
    check(!runs(&k, &run).contains_key(&op), || {
        "the claimed op ran after its launcher died".into()
    })?;
    Ok(
        "claimed, launcher killed before the pid file: lost (effect uncertain), never run by exec"
            .into(),
    )
}

/// The container restarts under a pending request: the new launcher claims
/// it (or the kernel takes it back first); either way it runs once.
pub async fn container_restarted_pending(kit: &Kit) -> anyhow::Result<String> {
    let k = kit.start("lrestart", &[]).await?;
    let run = unique_run("lrestart");
    let (container, _launcher, op) = pending_request(&k, &run).await?;
    let out = std::process::Command::new("docker")
        .args(["restart", "-t", "0", &container])
        .output()?;
    check(out.status.success(), || {
        format!("docker restart: {}", String::from_utf8_lossy(&out.stderr))
    })?;
    let statuses = settle_all(&k, &run, std::slice::from_ref(&op)).await?;
    check(statuses[&op] == "completed", || format!("{statuses:?}"))?;
    let by = started_by(&k, &op)?;
    check(by != StartedBy::Neither, || {
        "no record of how it started".into()
    })?;
    Ok(format!(
        "container restarted under a pending request: ran once ({})",
        if by == StartedBy::Launcher {
            "claimed by the new launcher"
        } else {
            "taken back, run by exec"
        }
    ))
}

/// How many requests the flood files at once: 500, or 100 under gVisor,
/// whose ptrace platform starts about ten commands a second on a 2-core
/// host, so 500 would outrun the start-evidence window (the last ones
/// honestly `lost`, never run twice) rather than test the handover.
fn flood_size() -> usize {
    match super::env_runtime().is_runc() {
        true => 500,
        false => 100,
    }
}

/// A flood of requests at once into one container: all run once, none by
/// the exec fallback, all delivered once.
pub async fn request_flood(kit: &Kit) -> anyhow::Result<String> {
    // 500 launches at once need more than the default 1024 pids; and the
    // launcher more than the default 10 s to claim the last of them on a
    // loaded 2-core machine (four drills at once, each a flood or a kernel
    // on PostgreSQL): past the window a request is taken back and run by
    // `docker exec`, still once, which is the fallback's test, not this one
    let k = kit
        .start(
            "flood",
            &[
                ("OPKERNEL_MAX_OPS_PER_RUN", "1000"),
                ("OPKERNEL_PIDS_LIMIT", "4096"),
                ("OPKERNEL_LAUNCHER_CLAIM", "30s"),
            ],
        )
        .await?;
    let run = unique_run("flood");
    warm(&k, &run).await?;
    let began = Instant::now();
    let command = recording("true");
    let argv = ["sh", "-c", command.as_str()];
    let n = flood_size();
    let starts = (0..n).map(|_| k.start_bg(&run, &argv, 120));
    let ops: Vec<String> = futures::future::try_join_all(starts).await?;
    let filed_in = began.elapsed();
    let statuses = settle_all(&k, &run, &ops).await?;
    let all_done = began.elapsed();
    check(statuses.values().all(|s| s == "completed"), || {
        format!("not all completed: {}", tally(&statuses))
    })?;
    let mut by_launcher = 0;
    for op in &ops {
        by_launcher += (started_by(&k, op)? == StartedBy::Launcher) as usize;
    }
    check(by_launcher == ops.len(), || {
        format!("only {by_launcher} of {n} ran through the launcher (the rest by docker exec)")
    })?;
    Ok(format!(
        "{n} requests filed in {:.2}s, all run once and delivered once in {:.2}s; 0 fell back to exec",
        filed_in.as_secs_f64(),
        all_done.as_secs_f64()
    ))
}
