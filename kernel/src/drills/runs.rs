//! Drills of runs as tasks: a cancel interrupted by a kernel SIGKILL.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::bail;
use serde_json::json;

use super::harness::KernelProcess;
use super::{check, check_ended_once, count_lines, scratch_path, unique_run, Kit, LONG};
use crate::surfaces::cli::client::Client;

/// A run with five live ops and a child run with five more; the parent run
/// is cancelled and the kernel SIGKILLed right after, while TERMs are out
/// and half the commands ignore them. After the restart every op ends
/// killed exactly once, each result is delivered once, and both runs stay
/// cancelled.
pub async fn cancel_interrupted(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit
        .start("cancelint", &[("OPKERNEL_KILL_GRACE", "3000ms")])
        .await?;
    let parent = unique_run("cancel-p");
    let child = format!("{parent}.c");
    let ops = start_parent_and_child(&k, &parent, &child).await?;
    let answer = k
        .client
        .post(&format!("/v1/runs/{parent}/cancel"), &json!({}))
        .await?;
    let asked = answer["kill_requested"].as_array().map_or(0, Vec::len);
    check(asked == 10, || {
        format!("cancel asked {asked} kills: {answer}")
    })?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    k.sigkill();
    let mut still_live = 0;
    for (_, op, _) in &ops {
        let (status, _) = k.state_offline(op)?;
        if status == "running" {
            still_live += 1;
        }
    }
    check(still_live > 0, || {
        "every op settled before the SIGKILL: the drill did not interrupt the cancel".to_owned()
    })?;
    k.spawn().await?;
    let mut codes: HashMap<i64, usize> = HashMap::new();
    for (_, op, ignores_term) in &ops {
        let s = k.wait_terminal(op, LONG).await?;
        let code = s["exit_code"].as_i64().unwrap_or(-1);
        let want = if *ignores_term { 137 } else { 143 };
        check(
            s["status"] == "completed" && s["killed"] == true && code == want,
            || format!("{op} did not end killed {want}: {s}"),
        )?;
        *codes.entry(code).or_default() += 1;
    }
    for run in [&parent, &child] {
        check_cancelled_run(&k, run, &ops).await?;
    }
    let (term, kill) = (
        codes.get(&143).copied().unwrap_or(0),
        codes.get(&137).copied().unwrap_or(0),
    );
    if term + kill != 10 {
        bail!("codes {codes:?}");
    }
    Ok(format!(
        "cancel of a run and its child (10 live ops), the kernel SIGKILLed with {still_live} still running: \
         after restart {term} ended 143 and {kill} ended 137, each killed, run and reported once"
    ))
}

/// A parent run and its child, each with 5 live ops (the odd ones ignore
/// TERM): `(run, op, ignores TERM)`, every op's container made.
async fn start_parent_and_child(
    k: &KernelProcess,
    parent: &str,
    child: &str,
) -> anyhow::Result<Vec<(String, String, bool)>> {
    let created = k
        .client
        .post("/v1/runs", &json!({ "run_id": parent }))
        .await?;
    let parent_client = Client::new(
        k.client.base().to_owned(),
        created["token"].as_str().unwrap_or_default().to_owned(),
    );
    parent_client
        .post("/v1/runs", &json!({ "run_id": child }))
        .await?;
    let mut ops: Vec<(String, String, bool)> = Vec::new();
    for run in [parent, child] {
        for i in 0..5 {
            // the odd ones ignore TERM: only the KILL after the grace ends them
            let ignores_term = i % 2 == 1;
            let script = if ignores_term {
                "echo x >> /scratch/ran; trap '' TERM; sleep 300 & wait"
            } else {
                "echo x >> /scratch/ran; exec sleep 300"
            };
            let op = k.start_bg(run, &["sh", "-c", script], 600).await?;
            ops.push((run.to_owned(), op, ignores_term));
        }
    }
    for (_, op, _) in &ops {
        k.container_of(op).await?;
    }
    // every command has run (its record written): a kill now meets the
    // command itself, never a shell that has not reached its first line
    let deadline = std::time::Instant::now() + LONG;
    for run in [parent, child] {
        while count_lines(&scratch_path(k, run, "ran")) < 5 {
            if std::time::Instant::now() > deadline {
                bail!("run {run}: its commands did not all start");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(ops)
}

/// A cancelled run after the restart: each command ran once, each op was
/// delivered once (nothing after), the run is `cancelled`, and its journal
/// has one `tool.completed` per op.
async fn check_cancelled_run(
    k: &KernelProcess,
    run: &str,
    ops: &[(String, String, bool)],
) -> anyhow::Result<()> {
    let ran = count_lines(&scratch_path(k, run, "ran"));
    check(ran == 5, || format!("run {run}: commands ran {ran} times"))?;
    let mut delivered = k
        .collect_deliveries(run, 5, Duration::from_secs(20))
        .await?;
    let again = k.collect_deliveries(run, 1, Duration::from_secs(2)).await?;
    delivered.sort();
    let mut want: Vec<String> = ops
        .iter()
        .filter(|(r, _, _)| r == run)
        .map(|(_, op, _)| op.clone())
        .collect();
    want.sort();
    check(delivered == want && again.is_empty(), || {
        format!("run {run}: delivered {delivered:?} then {again:?}, expected {want:?}")
    })?;
    let state = k.client.get(&format!("/v1/runs/{run}")).await?;
    check(state["state"] == "cancelled", || {
        format!("run {run}: {state}")
    })?;
    let events = k
        .client
        .get(&format!("/v1/runs/{run}/events?limit=500"))
        .await?;
    let ended = events["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == "tool.completed")
        .count();
    check(ended == 5, || {
        format!("run {run}: {ended} tool.completed events for 5 ops")
    })
}

/// A schedule's op is running (its claim held) when the kernel is
/// SIGKILLed; after the restart the claim is taken over, the op ends once,
/// no due time fires twice, and the schedule goes on.
pub async fn scheduler_crash(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit.start("schedcrash", &[]).await?;
    let run = unique_run("sched");
    let made = k
        .client
        .post(
            &format!("/v1/runs/{run}/schedules"),
            &json!({"command": ["sh", "-c", "echo x >> /scratch/ran; sleep 2"], "every_sec": 1}),
        )
        .await?;
    let id = made["schedule_id"].as_str().unwrap_or_default().to_owned();
    let path = format!("/v1/runs/{run}/schedules/{id}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let held = loop {
        let s = k.client.get(&path).await?;
        if let Some(op) = s["current_operation_id"].as_str() {
            break op.to_owned();
        }
        check(std::time::Instant::now() < deadline, || {
            format!("the schedule never fired: {s}")
        })?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    k.container_of(&held).await?;
    k.sigkill();
    // a no-op update counts the rows holding a claim
    let claimed = k.sql_offline(
        "UPDATE schedules SET claimed_at = claimed_at WHERE id = ?1 AND claimed_at IS NOT NULL",
        &[id.as_str().into()],
    )?;
    check(claimed == 1, || "no claim held at the crash".to_owned())?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    k.spawn().await?;
    let s = k.wait_terminal(&held, LONG).await?;
    check(s["status"] == "completed" && s["exit_code"] == 0, || {
        format!("the op in flight at the crash: {s}")
    })?;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    k.client.post(&format!("{path}/pause"), &json!({})).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while k.client.get(&path).await?["current_operation_id"].is_string() {
        check(std::time::Instant::now() < deadline, || {
            "the schedule stayed busy".to_owned()
        })?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fired = fired_in_trace(&k, &run).await?;
    let mut dues: Vec<&String> = fired.iter().map(|(d, _)| d).collect();
    dues.sort();
    dues.dedup();
    check(dues.len() == fired.len() && fired.len() >= 2, || {
        format!("due times fired: {fired:?}")
    })?;
    let ran = count_lines(&scratch_path(&k, &run, "ran"));
    check(ran == fired.len(), || {
        format!("{ran} commands ran for {} fires", fired.len())
    })?;
    let fired_ops: Vec<&str> = fired.iter().map(|(_, op)| op.as_str()).collect();
    check(fired_ops.contains(&held.as_str()), || {
        format!("the op in flight at the crash {held} is not among the fires {fired:?}")
    })?;
    // every fired op (the one in flight at the crash among them) ended once
    check_ended_once(&k, &run, &fired_ops).await?;
    let mut delivered = k
        .collect_deliveries(&run, fired.len(), Duration::from_secs(20))
        .await?;
    let again = k
        .collect_deliveries(&run, 1, Duration::from_secs(2))
        .await?;
    delivered.sort();
    let mut want: Vec<String> = fired_ops.iter().map(|op| (*op).to_owned()).collect();
    want.sort();
    check(delivered == want && again.is_empty(), || {
        format!("delivered {delivered:?} then {again:?}, expected {want:?} once each")
    })?;
    Ok(format!(
        "kernel SIGKILLed with a schedule's claim held: the op ended once (0), {} due times fired once each, each ended once and was delivered once",
        fired.len()
    ))
}

/// The `schedule.fired` events of a run's trace: (due time, op).
async fn fired_in_trace(k: &KernelProcess, run: &str) -> anyhow::Result<Vec<(String, String)>> {
    let events = k
        .client
        .get(&format!("/v1/runs/{run}/events?limit=500"))
        .await?;
    Ok(events["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == "schedule.fired")
        .map(|e| {
            (
                e["data"]["due_at"].as_str().unwrap_or_default().to_owned(),
                e["operation_id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect())
}

/// An op waiting for approval across a kernel SIGKILL: it stays waiting
/// (nothing runs, nothing approves it), then an approval runs it once and
/// its result is delivered once.
pub async fn approval_restart(kit: &Kit) -> anyhow::Result<String> {
    let mut k = kit.start("approvalrestart", &[]).await?;
    let run = unique_run("approve");
    k.client
        .post(
            "/v1/runs",
            &json!({"run_id": run, "envelope": {"approval": {"all": true}}}),
        )
        .await?;
    let op = k
        .start_bg(
            &run,
            &["sh", "-c", "echo x >> /scratch/ran; echo approved"],
            60,
        )
        .await?;
    let s = k.state(&op).await?;
    check(s["status"] == "awaiting_approval", || format!("{s}"))?;
    k.sigkill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    k.spawn().await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let s = k.state(&op).await?;
    check(
        s["status"] == "awaiting_approval" && s["started_at"].is_null(),
        || format!("after the restart: {s}"),
    )?;
    let ran = count_lines(&scratch_path(&k, &run, "ran"));
    check(ran == 0, || format!("ran {ran} times before approval"))?;
    k.client
        .post(&format!("/v1/operations/{op}/approve"), &json!({}))
        .await?;
    let s = k.wait_terminal(&op, LONG).await?;
    check(
        s["status"] == "completed" && s["exit_code"] == 0 && s["output_tail"] == "approved\n",
        || format!("after approval: {s}"),
    )?;
    let ran = count_lines(&scratch_path(&k, &run, "ran"));
    check(ran == 1, || format!("ran {ran} times"))?;
    let delivered = k
        .collect_deliveries(&run, 1, Duration::from_secs(10))
        .await?;
    let again = k
        .collect_deliveries(&run, 1, Duration::from_secs(2))
        .await?;
    check(delivered == vec![op.clone()] && again.is_empty(), || {
        format!("deliveries {delivered:?} then {again:?}")
    })?;
    Ok("an op awaiting approval across a kernel SIGKILL stays waiting; approved, it ran once and was delivered once".to_owned())
}
