//! Drills that SIGKILL and restart the kernel around an op's lifecycle.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use super::{check, check_ended_once, count_lines, ops_path, scratch_path, unique_run, Kit, LONG};

/// The kernel is SIGKILLed ten times while one op runs: every kill lands
/// while the op is live (the command waits for the drill's go, and the
/// control plane says `running` at each kill), every restart re-attaches
/// (attempt 1 + 10), and the op runs once, ends once, is delivered once.
pub async fn sigkill_repeated(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit.start("sigkill", &[]).await?;
    let run = unique_run("sigkill");
    let op = k
        .start_bg(
            &run,
            &[
                "sh",
                "-c",
                "echo started >> /scratch/ran; while [ ! -e /scratch/go ]; do sleep 0.1; done; echo done",
            ],
            120,
        )
        .await?;
    k.container_of(&op).await?;
    let mut restarts = Vec::new();
    for kill in 1..=10u64 {
        k.sigkill();
        let (status, _) = k.state_offline(&op)?;
        check(status == "running", || {
            format!("kill {kill} landed after the op ended ({status})")
        })?;
        k.spawn().await?;
        restarts.push(k.last_start.as_millis());
        // this restart's attempt attached before the next kill
        k.wait_state(&op, Duration::from_secs(20), |s| {
            s["attempt"].as_u64() >= Some(kill + 1)
        })
        .await
        .with_context(|| format!("restart {kill} did not re-attach to the live op"))?;
    }
    std::fs::write(scratch_path(&k, &run, "go"), "")?;
    let s = k.wait_terminal(&op, LONG).await?;
    check(s["status"] == "completed" && s["exit_code"] == 0, || {
        format!("unexpected end: {s}")
    })?;
    check(s["output_tail"] == "done\n", || format!("output lost: {s}"))?;
    let ran = count_lines(&scratch_path(&k, &run, "ran"));
    check(ran == 1, || format!("command ran {ran} times"))?;
    let attempt = s["attempt"].as_u64().unwrap_or(0);
    check(attempt >= 11, || {
        format!("attempt {attempt}: not every one of the 10 restarts re-attached to the live op")
    })?;
    check_ended_once(&k, &run, &[&op]).await?;
    let delivered = k
        .collect_deliveries(&run, 1, Duration::from_secs(10))
        .await?;
    let again = k
        .collect_deliveries(&run, 1, Duration::from_secs(2))
        .await?;
    check(delivered == vec![op.clone()] && again.is_empty(), || {
        format!("deliveries {delivered:?} then {again:?}")
    })?;
    Ok(format!(
        "10 SIGKILLs, each while the op ran: ran once, completed 0, ended once, delivered once; attempts {attempt}; restarts took {restarts:?} ms"
    ))
}

pub async fn exit_while_down(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit.start("exitdown", &[]).await?;
    let run = unique_run("exitdown");
    let zero = k
        .start_bg(&run, &["sh", "-c", "sleep 2; exit 0"], 60)
        .await?;
    let seven = k
        .start_bg(&run, &["sh", "-c", "sleep 2; exit 7"], 60)
        .await?;
    let nine = k
        .start_bg(&run, &["sh", "-c", "sleep 2; kill -KILL $$"], 60)
        .await?;
    for op in [&zero, &seven, &nine] {
        k.container_of(op).await?;
    }
    k.sigkill();
    tokio::time::sleep(Duration::from_secs(4)).await;
    for op in [&zero, &seven, &nine] {
        check(ops_path(&k, &run, op, "code").exists(), || {
            format!("{op} has no code file while the kernel is down")
        })?;
    }
    k.spawn().await?;
    let mut codes = Vec::new();
    for op in [&zero, &seven, &nine] {
        let s = k.wait_terminal(op, LONG).await?;
        check(s["status"] == "completed", || format!("{op}: {s}"))?;
        codes.push(s["exit_code"].as_i64().unwrap_or(-1));
    }
    check(codes == vec![0, 7, 137], || format!("codes {codes:?}"))?;
    check_ended_once(&k, &run, &[&zero, &seven, &nine]).await?;
    let mut delivered = k
        .collect_deliveries(&run, 3, Duration::from_secs(10))
        .await?;
    let again = k
        .collect_deliveries(&run, 1, Duration::from_secs(2))
        .await?;
    delivered.sort();
    let mut want = vec![zero.clone(), seven.clone(), nine.clone()];
    want.sort();
    check(delivered == want && again.is_empty(), || {
        format!("delivered {delivered:?} then {again:?}, expected {want:?} once each")
    })?;
    Ok(format!(
        "codes after restart: {codes:?}, each ended once and delivered once"
    ))
}

/// A kill of a command that ignores TERM: the TERM lands (durably
/// recorded) and the kernel is SIGKILLed in the grace pause, before the
/// KILL. After the restart the kill goes on and the op ends killed 137.
pub async fn kill_interrupted(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit
        .start("killint", &[("OPKERNEL_KILL_GRACE", "5000ms")])
        .await?;
    let run = unique_run("killint");
    let op = k
        .start_bg(&run, &["bash", "-c", "trap '' TERM; sleep 300 & wait"], 600)
        .await?;
    k.container_of(&op).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // TERM is sent and ignored; the kernel dies during the grace pause
    let kill = k.kill_in_background(&run, &op).await?;
    let term_landed = k.wait_signalled(&op, Duration::from_secs(4)).await;
    k.sigkill();
    let _ = kill.await;
    term_landed?;
    let flags = k.kill_flags_offline(&op)?;
    check(flags.intent && flags.signalled, || {
        format!("the TERM did not land before the kernel's SIGKILL: {flags:?}")
    })?;
    check(!ops_path(&k, &run, &op, "code").exists(), || {
        "the command ended before the kernel's SIGKILL: the KILL was not interrupted".into()
    })?;
    let s = k.state_offline(&op)?;
    check(s.0 == "running", || {
        format!("op settled before the restart: {s:?}")
    })?;
    k.spawn().await?;
    let s = k.wait_terminal(&op, LONG).await?;
    check(
        s["status"] == "completed" && s["exit_code"] == 137 && s["killed"] == true,
        || format!("kill did not complete after restart: {s}"),
    )?;
    check_ended_once(&k, &run, &[&op]).await?;
    Ok(
        "TERM landed (intent and signal recorded), kernel SIGKILLed in the grace pause with the command alive; after restart: completed 137 killed"
            .into(),
    )
}

pub async fn timeout_not_extended(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit.start("tmo", &[]).await?;
    let run = unique_run("tmo");
    let op = k.start_bg(&run, &["sleep", "300"], 4).await?;
    k.wait_state(&op, LONG, |s| s["status"] == "running")
        .await?;
    k.sigkill();
    tokio::time::sleep(Duration::from_secs(6)).await;
    k.spawn().await?;
    let restarted = Instant::now();
    let s = k.wait_terminal(&op, LONG).await?;
    let after = restarted.elapsed().as_secs_f64();
    check(s["status"] == "timed_out", || format!("{s}"))?;
    // down for 6 s past a 4 s budget counted from the recorded start: it
    // ends right after the restart; a budget counted again from the
    // restart would take the whole 4 s (the time before the kill does not
    // count here, so a loaded machine's slow start proves nothing)
    check(after < 4.0, || {
        format!("timed out only {after:.1} s after the restart")
    })?;
    Ok(format!(
        "4 s budget, kernel down 6 s: timed out {after:.1} s after the restart"
    ))
}

pub async fn crash_around_create(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit.start("create", &[("OPKERNEL_GRACE", "3000ms")]).await?;
    let run = unique_run("create");
    k.sigkill();
    // 1. a container made by a kernel that died before recording anything
    let profile = kit.profile();
    let identity = sandbox::RunIdentity::new(&run, &profile)?;
    let sb = sandbox::Sandbox::connect(None, k.home.join("scratch")).await?;
    let orphan = sb.ensure_container(&identity, &profile).await?;
    // 2. op rows left behind: one never claimed, one claimed but never executed
    let store = k.offline_store().await?;
    let start = |cmd: &str| crate::store::StartRequest {
        run_id: run.clone(),
        scratch_key: identity.scratch_key.clone(),
        command: vec!["sh".into(), "-c".into(), cmd.into()],
        background: true,
        timeout_sec: 60,
        io: sandbox::Io::Null,
        idempotency_key: None,
        approval: None,
        schedule_id: None,
        origin: crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
    };
    let crate::store::NewOp::Created(unclaimed) = store
        .insert_op(
            start("echo a >> /scratch/ran-a"),
            crate::store::Admission::UNLIMITED,
        )
        .await?
    else {
        anyhow::bail!("insert failed")
    };
    let crate::store::NewOp::Created(claimed) = store
        .insert_op(
            start("echo b >> /scratch/ran-b"),
            crate::store::Admission::UNLIMITED,
        )
        .await?
    else {
        anyhow::bail!("insert failed")
    };
    check(
        store
            .claim_exec(&claimed.id, "dead-kernel", &orphan.id, (false, None))
            .await?,
        || "claim failed".into(),
    )?;
    drop(store);
    k.spawn().await?;
    let a = k.wait_terminal(&unclaimed.id, LONG).await?;
    let b = k.wait_terminal(&claimed.id, LONG).await?;
    check(a["status"] == "completed" && a["exit_code"] == 0, || {
        format!("unclaimed op: {a}")
    })?;
    check(a["container_id"] == orphan.id.as_str(), || {
        format!("not adopted: {a} vs {}", orphan.id)
    })?;
    // the kernel died after the claim: whether Docker got the start is
    // unknown, so the op is lost with effect uncertain, never re-run
    check(b["status"] == "lost" && b["effect"] == "uncertain", || {
        format!("claimed-but-never-run op: {b}")
    })?;
    check(count_lines(&scratch_path(&k, &run, "ran-a")) == 1, || {
        "unclaimed op did not run exactly once".into()
    })?;
    check(!scratch_path(&k, &run, "ran-b").exists(), || {
        "claimed op ran after the restart".into()
    })?;
    // 3. a fresh op in the same run reuses the same container
    let c = k.start_bg(&run, &["true"], 60).await?;
    let c = k.wait_terminal(&c, LONG).await?;
    let count = run_containers(&run)?;
    check(
        count == 1 && c["container_id"] == orphan.id.as_str(),
        || format!("{count} containers for the run"),
    )?;
    Ok("orphan container adopted (1 container); unclaimed op ran once; claimed-but-never-executed op lost (effect uncertain), not re-run".into())
}

/// How many containers (any state) carry the run's label.
fn run_containers(run: &str) -> anyhow::Result<usize> {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=opkernel.run_id={run}"),
        ])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .count())
}

pub async fn unacked_report(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit.start("unacked", &[]).await?;
    let run = unique_run("unacked");
    let a = k.start_bg(&run, &["sh", "-c", "echo a"], 60).await?;
    let b = k.start_bg(&run, &["sh", "-c", "echo b"], 60).await?;
    k.wait_terminal(&a, LONG).await?;
    k.wait_terminal(&b, LONG).await?;
    let first = k
        .client
        .get(&format!("/v1/runs/{run}/report?wait=10"))
        .await?;
    check(
        first["resolved"].as_array().map_or(0, Vec::len) == 2,
        || format!("{first}"),
    )?;
    k.restart().await?;
    let again = k
        .client
        .get(&format!("/v1/runs/{run}/report?wait=10"))
        .await?;
    check(again == first, || {
        format!("re-served report differs: {first} vs {again}")
    })?;
    let id = first["report_id"].as_str().unwrap_or_default().to_owned();
    k.client
        .post(&format!("/v1/runs/{run}/report/{id}/ack"), &json!({}))
        .await?;
    k.restart().await?;
    let after = k
        .client
        .get(&format!("/v1/runs/{run}/report?wait=1"))
        .await?;
    check(
        after["report_id"].is_null() && after["resolved"] == json!([]),
        || format!("delivered twice: {after}"),
    )?;
    Ok("same report re-served after restart; nothing after ack and another restart".into())
}
