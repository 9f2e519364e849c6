#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Schedules end to end, in real time against the real engine: one op per
//! slot, no slot fired twice, kernel outages with and without catch-up,
//! overdue one-shots, and a slot skipped while the previous op runs.

use std::time::{Duration, Instant};

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::unique_run;
use reqwest::Method;
use serde_json::{json, Value};

async fn kernel(tag: &str) -> KernelProcess {
    KernelProcess::start(&kernel_binary().unwrap(), tag, &[])
        .await
        .unwrap()
}

async fn add(k: &KernelProcess, run: &str, body: Value) -> String {
    let (s, v) = k
        .client
        .request(
            Method::POST,
            &format!("/v1/runs/{run}/schedules"),
            Some(&body),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(s, 200, "{v}");
    v["schedule_id"].as_str().unwrap().to_owned()
}

async fn events(k: &KernelProcess, run: &str) -> Vec<Value> {
    let v = k
        .client
        .get(&format!("/v1/runs/{run}/events?limit=500"))
        .await
        .unwrap();
    v["events"].as_array().unwrap().clone()
}

fn of_kind<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["kind"] == kind).collect()
}

fn ms(rfc3339: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339.as_str().unwrap())
        .unwrap()
        .timestamp_millis()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn schedule(k: &KernelProcess, run: &str, id: &str) -> Value {
    k.client
        .get(&format!("/v1/runs/{run}/schedules/{id}"))
        .await
        .unwrap()
}

/// Makes the run's container with a foreground op before a schedule is
/// added: its first fire then costs no container creation, which would
/// overrun the next slots. Returns the op's id.
async fn warm(k: &KernelProcess, run: &str) -> String {
    let v = k
        .client
        .post(
            &format!("/v1/runs/{run}/tools/run_command"),
            &json!({"command": ["true"], "background": false}),
        )
        .await
        .unwrap();
    assert_eq!(
        (v["status"].as_str(), v["exit_code"].as_i64()),
        (Some("completed"), Some(0)),
        "{v}"
    );
    assert!(v["container_id"].is_string(), "{v}");
    v["operation_id"].as_str().unwrap().to_owned()
}

/// Waits until the run's schedule has no op running (its last one settled).
async fn quiet(k: &KernelProcess, run: &str, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while schedule(k, run, id).await["current_operation_id"].is_string() {
        assert!(Instant::now() < deadline, "schedule stayed busy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_recurring_schedule_fires_once_per_slot() {
    let k = kernel("sched-slots").await;
    let run = unique_run("slots");
    let warm_op = warm(&k, &run).await;
    let id = add(
        &k,
        &run,
        json!({"command": ["sh", "-c", "echo x >> /scratch/fired"], "every_sec": 1}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(4600)).await;
    let (s, _) = k
        .client
        .request(
            Method::POST,
            &format!("/v1/runs/{run}/schedules/{id}/pause"),
            None,
            &[],
        )
        .await
        .unwrap();
    assert_eq!(s, 200);
    quiet(&k, &run, &id).await;
    let all = events(&k, &run).await;
    let fired = of_kind(&all, "schedule.fired");
    assert!(
        (3..=5).contains(&fired.len()),
        "{} fires in 4.6 s",
        fired.len()
    );
    // one op per due time, the due times one slot apart
    let dues: Vec<i64> = fired.iter().map(|e| ms(&e["data"]["due_at"])).collect();
    assert!(dues.windows(2).all(|w| w[1] - w[0] == 1000), "{dues:?}");
    let ops: Vec<&str> = fired
        .iter()
        .map(|e| e["operation_id"].as_str().unwrap())
        .collect();
    let mut unique = ops.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ops.len());
    let list = k.client.get(&format!("/v1/ops?run={run}")).await.unwrap();
    let listed: Vec<&str> = list["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["operation_id"].as_str().unwrap())
        .filter(|o| *o != warm_op)
        .collect();
    assert_eq!(listed.len(), ops.len(), "{list}");
    // each ran once, and is an ordinary background op of the run
    let ran = std::fs::read_to_string(
        k.home
            .join("scratch")
            .join(sandbox::profile::scratch_key(&run))
            .join("fired"),
    )
    .unwrap();
    assert_eq!(ran.lines().count(), ops.len());
    let report = k
        .client
        .get(&format!("/v1/runs/{run}/report?wait=5"))
        .await
        .unwrap();
    assert_eq!(report["resolved"].as_array().unwrap().len(), ops.len());
    let s = schedule(&k, &run, &id).await;
    assert_eq!(
        (s["last_status"].as_str(), s["last_exit_code"].as_i64()),
        (Some("completed"), Some(0))
    );
}

#[tokio::test]
async fn a_slot_is_skipped_while_the_previous_op_runs() {
    let k = kernel("sched-busy").await;
    let run = unique_run("busy");
    warm(&k, &run).await;
    let id = add(
        &k,
        &run,
        json!({"command": ["sh", "-c", "echo start >> /scratch/log; sleep 2.5; echo end >> /scratch/log"], "every_sec": 1}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(5500)).await;
    k.client
        .post(&format!("/v1/runs/{run}/schedules/{id}/pause"), &json!({}))
        .await
        .unwrap();
    quiet(&k, &run, &id).await;
    let all = events(&k, &run).await;
    let skipped = of_kind(&all, "schedule.skipped");
    assert!(!skipped.is_empty(), "{all:?}");
    for s in &skipped {
        assert_eq!(s["data"]["reason"], "previous still running");
    }
    // never two at once: the log alternates start, end
    let log = std::fs::read_to_string(
        k.home
            .join("scratch")
            .join(sandbox::profile::scratch_key(&run))
            .join("log"),
    )
    .unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.len() >= 4, "{lines:?}");
    for pair in lines.chunks(2) {
        assert_eq!(pair, ["start", "end"], "{lines:?}");
    }
}

/// A schedule firing every second, the kernel SIGKILLed for ~3.5 s, then
/// restarted: returns the run's events and when the kernel was down.
async fn outage(catch_up: bool) -> (KernelProcess, String, Vec<Value>, i64, i64) {
    let mut k = kernel(if catch_up {
        "sched-catch"
    } else {
        "sched-nocatch"
    })
    .await;
    let run = unique_run("outage");
    warm(&k, &run).await;
    let id = add(
        &k,
        &run,
        json!({"command": ["true"], "every_sec": 1, "catch_up": catch_up}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while of_kind(&events(&k, &run).await, "schedule.fired").is_empty() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    quiet(&k, &run, &id).await;
    k.sigkill();
    let down = now_ms();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let up = now_ms();
    k.spawn().await.unwrap();
    tokio::time::sleep(Duration::from_millis(2300)).await;
    k.client
        .post(&format!("/v1/runs/{run}/schedules/{id}/pause"), &json!({}))
        .await
        .unwrap();
    quiet(&k, &run, &id).await;
    let all = events(&k, &run).await;
    (k, run, all, down, up)
}

#[tokio::test]
async fn after_an_outage_without_catch_up_nothing_is_backfilled() {
    let (_k, _run, all, down, up) = outage(false).await;
    let fired = of_kind(&all, "schedule.fired");
    let during: Vec<i64> = fired
        .iter()
        .map(|e| ms(&e["data"]["due_at"]))
        .filter(|due| *due > down && *due <= up)
        .collect();
    assert!(during.is_empty(), "backfilled due times {during:?}");
    // the missed slots are skipped, with no run record; then the next
    // future slots fire as usual
    let skipped = of_kind(&all, "schedule.skipped");
    assert_eq!(skipped.len(), 1, "{all:?}");
    assert!(skipped[0]["data"]["reason"]
        .as_str()
        .unwrap()
        .contains("missed while the kernel was down"));
    assert!(skipped[0]["data"]["slots"].as_u64().unwrap() >= 3);
    let after: Vec<i64> = fired
        .iter()
        .map(|e| ms(&e["data"]["due_at"]))
        .filter(|due| *due > up)
        .collect();
    assert!(!after.is_empty(), "no slot fired after the restart");
}

#[tokio::test]
async fn after_an_outage_with_catch_up_exactly_one_op_catches_up() {
    let (_k, _run, all, down, up) = outage(true).await;
    let fired = of_kind(&all, "schedule.fired");
    let catch_up: Vec<&&Value> = fired
        .iter()
        .filter(|e| {
            let due = ms(&e["data"]["due_at"]);
            due > down && due <= up
        })
        .collect();
    assert_eq!(catch_up.len(), 1, "{fired:?}");
    // the catch-up op stands for its own due time and the ones after it
    assert!(catch_up[0]["data"]["missed_slots"].as_u64().unwrap() >= 2);
    // nothing is skipped for the outage; a slot due while an op still
    // runs (a loaded machine) is skipped for that reason, rightly
    let missed: Vec<&Value> = of_kind(&all, "schedule.skipped")
        .into_iter()
        .filter(|e| e["data"]["reason"] != "previous still running")
        .collect();
    assert!(missed.is_empty(), "{missed:?}");
}

#[tokio::test]
async fn an_overdue_one_shot_is_skipped_or_fired_per_catch_up() {
    let mut k = kernel("sched-once").await;
    let run = unique_run("once");
    let at = chrono::DateTime::from_timestamp_millis(now_ms() + 1500)
        .unwrap()
        .to_rfc3339();
    let skip = add(
        &k,
        &run,
        json!({"command": ["sh", "-c", "echo skip >> /scratch/ran"], "at": at, "catch_up": false}),
    )
    .await;
    let fire = add(
        &k,
        &run,
        json!({"command": ["sh", "-c", "echo fire >> /scratch/ran"], "at": at, "catch_up": true,
               "delete_after_success": true}),
    )
    .await;
    k.sigkill();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    k.spawn().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    // the catch-up one ran and, having succeeded, is gone
    loop {
        let (s, _) = k
            .client
            .request(
                Method::GET,
                &format!("/v1/runs/{run}/schedules/{fire}"),
                None,
                &[],
            )
            .await
            .unwrap();
        if s == 404 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the catch-up one-shot did not finish"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = schedule(&k, &run, &skip).await;
    assert_eq!(s["enabled"], false);
    assert_eq!(s["last_status"], "skipped");
    assert!(s["last_operation_id"].is_null(), "no run record: {s}");
    let ran = std::fs::read_to_string(
        k.home
            .join("scratch")
            .join(sandbox::profile::scratch_key(&run))
            .join("ran"),
    )
    .unwrap();
    assert_eq!(ran, "fire\n");
}

#[tokio::test]
async fn bad_schedules_are_clear_errors() {
    let k = kernel("sched-bad").await;
    let run = unique_run("bad");
    for body in [
        json!({"command": ["true"]}),
        json!({"command": ["true"], "every_sec": 1, "cron": "* * * * *"}),
        json!({"command": ["true"], "cron": "* * * * * *"}),
        json!({"command": ["true"], "cron": "70 * * * *"}),
        json!({"command": ["true"], "every_sec": 0}),
        json!({"command": ["true"], "at": "soon"}),
        json!({"command": [], "every_sec": 5}),
        json!({"command": ["true"], "every_sec": 5, "timeout_sec": 999999}),
        json!({"command": ["true"], "every_sec": 5, "bogus": 1}),
        json!({"command": ["true"], "cron": "0 0 30 2 *"}),
        json!({"command": ["true"], "every_sec": 5, "delete_after_success": true}),
    ] {
        let (s, v) = k
            .client
            .request(
                Method::POST,
                &format!("/v1/runs/{run}/schedules"),
                Some(&body),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(s, 400, "{body}: {v}");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    let v = k
        .client
        .get(&format!("/v1/runs/{run}/schedules"))
        .await
        .unwrap();
    assert!(
        v["schedules"].as_array().unwrap().is_empty(),
        "nothing was made"
    );
}

#[tokio::test]
async fn a_cancelled_run_ends_its_schedules() {
    let k = kernel("sched-cancel").await;
    let run = unique_run("over");
    let id = add(&k, &run, json!({"command": ["true"], "every_sec": 1})).await;
    k.client
        .post(&format!("/v1/runs/{run}/cancel"), &json!({}))
        .await
        .unwrap();
    quiet(&k, &run, &id).await;
    let s = schedule(&k, &run, &id).await;
    assert_eq!(
        (s["enabled"].as_bool(), s["next_due_at"].as_str()),
        (Some(false), None),
        "{s}"
    );
    let before = events(&k, &run).await.len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        events(&k, &run).await.len(),
        before,
        "a schedule of a cancelled run stays quiet"
    );
    let (st, v) = k
        .client
        .request(
            Method::POST,
            &format!("/v1/runs/{run}/schedules"),
            Some(&json!({"command": ["true"], "every_sec": 1})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (409, Some("run_cancelled")),
        "{v}"
    );
}

/// A caller's Idempotency-Key may not start with `schedule:`: those keys are
/// the kernel's own, one per due time of a schedule, and a caller that took
/// one first would make the schedule adopt the caller's op (same command)
/// or skip its slot (another command). Refused for background and
/// foreground starts; nothing is made, and the due time fires its own
/// command once.
#[tokio::test]
async fn a_callers_key_may_not_take_a_schedules_due_time() {
    let k = kernel("sched-key").await;
    let run = unique_run("schedkey");
    let at = chrono::DateTime::from_timestamp_millis(now_ms() + 3000)
        .unwrap()
        .to_rfc3339();
    let id = add(
        &k,
        &run,
        json!({"command": ["sh", "-c", "echo scheduled >> /scratch/ran"], "at": at}),
    )
    .await;
    let due = ms(&schedule(&k, &run, &id).await["next_due_at"]);
    let key = format!("schedule:{id}:{due}");
    for (background, command) in [
        (true, "echo scheduled >> /scratch/ran"),
        (true, "echo squatter >> /scratch/ran"),
        (false, "echo squatter >> /scratch/ran"),
    ] {
        let (s, v) = k
            .client
            .request(
                Method::POST,
                &format!("/v1/runs/{run}/tools/run_command"),
                Some(&json!({"command": ["sh", "-c", command], "background": background})),
                &[("Idempotency-Key", key.as_str())],
            )
            .await
            .unwrap();
        assert_eq!(s, 400, "a start keyed {key:?} was not refused: {v}");
        assert!(
            v.to_string().contains("reserved for schedules"),
            "refused for another reason: {v}"
        );
    }
    let ops = k.client.get(&format!("/v1/ops?run={run}")).await.unwrap();
    assert_eq!(ops["operations"], json!([]), "a refused start made an op");
    let deadline = Instant::now() + Duration::from_secs(20);
    let fired = loop {
        let s = schedule(&k, &run, &id).await;
        if s["last_operation_id"].is_string() && s["current_operation_id"].is_null() {
            break s;
        }
        assert!(Instant::now() < deadline, "the due time never ran: {s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(fired["last_status"], "completed", "{fired}");
    let ran = std::fs::read_to_string(
        k.home
            .join("scratch")
            .join(sandbox::profile::scratch_key(&run))
            .join("ran"),
    )
    .unwrap();
    assert_eq!(ran, "scheduled\n");
}
