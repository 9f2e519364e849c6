//! The control plane's database lost under load (SPEC §19): a PostgreSQL
//! server crashed for 20 s under 100 live background ops (20 under
//! gVisor), then started again. Commands run on meanwhile, starts are
//! refused with 503, and when the database returns every op settles with
//! its real code, ran once, and is delivered once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::harness::KernelProcess;
use super::launcher::{recording, runs, tally, warm};
use super::pgserver::PgServer;
use super::{check, check_ended_once, ops_path, scratch_path, unique_run, Kit};

/// How many ops are live when the database goes, and how often each
/// looks at its gate: 100 ops looking every 0.2 s, or under gVisor 20
/// looking every second (its ptrace platform starts a few dozen processes
/// a second on a 2-core host, and each look starts a `sleep`).
fn live_ops() -> (usize, &'static str) {
    match super::env_runtime().is_runc() {
        true => (100, "0.2"),
        false => (20, "1"),
    }
}
/// How long it stays down.
const OUTAGE: Duration = Duration::from_secs(20);
/// How many starts race the crash.
const BURST: usize = 10;

/// Op `i`'s command: recorded as run, then waits for its group's gate
/// (even ops: opened during the outage; odd: after it) and exits `i`.
fn command(i: usize, every: &str) -> String {
    let gate = if i.is_multiple_of(2) {
        "gate-down"
    } else {
        "gate-up"
    };
    recording(&format!(
        "until [ -e /scratch/{gate} ]; do sleep {every}; done; exit {i}"
    ))
}

pub async fn store_outage(kit: &Kit) -> anyhow::Result<String> {
    let server = PgServer::start()?;
    let url = server.url();
    let k = kit
        .start(
            "pgout",
            &[
                ("OPKERNEL_STORE", &url),
                ("OPKERNEL_MAX_OPS_PER_RUN", "400"),
                ("OPKERNEL_PIDS_LIMIT", "4096"),
            ],
        )
        .await?;
    let run = unique_run("pgout");
    warm(&k, &run).await?;
    let (live, every) = live_ops();
    let mut ops = Vec::with_capacity(live);
    for i in 0..live {
        ops.push(
            k.start_bg(&run, &["sh", "-c", &command(i, every)], 300)
                .await?,
        );
    }
    for op in &ops {
        k.wait_state(op, Duration::from_secs(60), |s| s["status"] == "running")
            .await?;
    }
    // a burst of starts (each with its Idempotency-Key) races the crash:
    // claims, launches and commits are cut wherever they are
    let burst = start_burst(&k, &run);
    tokio::time::sleep(Duration::from_millis(40)).await;
    server.kill()?;
    let down = Instant::now();
    let refused = refused_while_down(&k, &run, &ops[0]).await?;
    // half the commands end while the database is down
    std::fs::write(scratch_path(&k, &run, "gate-down"), "")?;
    tokio::time::sleep(OUTAGE.saturating_sub(down.elapsed())).await;
    for op in ops.iter().step_by(2) {
        check(ops_path(&k, &run, op, "code").exists(), || {
            format!("{op} had not ended while the database was down")
        })?;
    }
    server.resume()?;
    let outage = down.elapsed();
    std::fs::write(scratch_path(&k, &run, "gate-up"), "")?;
    let back = Instant::now();
    let statuses = settled_with_real_codes(&k, &ops).await?;
    let settled_in = back.elapsed();
    let (burst, answered) = burst_settled(&k, &run, burst).await?;
    let all: Vec<String> = ops.iter().chain(&burst).cloned().collect();
    ran_and_delivered_once(&k, &run, &all).await?;
    check(!scratch_path(&k, &run, "refused").exists(), || {
        "a start refused with 503 during the outage ran anyway".into()
    })?;
    Ok(format!(
        "{live} live ops, the database down {:.1}s (pg_ctl -m immediate): {refused}; \
         after it returned all settled in {:.1}s ({}), each with its own exit code, ran once, delivered once; \
         {BURST} starts racing the crash ({answered} answered, the rest retried with their keys) each ran once",
        outage.as_secs_f64(),
        settled_in.as_secs_f64(),
        tally(&statuses)
    ))
}

/// While the database is down: a start and an op read answer 503
/// `store_unavailable` with `Retry-After`, and the kernel stays up.
async fn refused_while_down(k: &KernelProcess, run: &str, op: &str) -> anyhow::Result<String> {
    let http = crate::base::tls::client().build()?;
    let base = k.client.base();
    let start = http
        .post(format!("{base}/v1/runs/{run}/tools/run_command"))
        .bearer_auth(k.client.token())
        .json(&serde_json::json!({
            "command": ["sh", "-c", "echo ran > /scratch/refused"],
            "background": true,
        }))
        .send()
        .await
        .context("the kernel stopped answering when its database went")?;
    let status = start.status().as_u16();
    let retry = start.headers().get("retry-after").is_some();
    let body: serde_json::Value = start.json().await.unwrap_or_default();
    check(
        status == 503 && body["error"]["code"] == "store_unavailable" && retry,
        || format!("a start during the outage answered {status} (Retry-After: {retry}): {body}"),
    )?;
    let read = http
        .get(format!("{base}/v1/operations/{op}"))
        .bearer_auth(k.client.token())
        .send()
        .await?;
    let read_status = read.status().as_u16();
    check(read_status == 503, || {
        format!("an op read during the outage answered {read_status}, not 503")
    })?;
    Ok("a start and an op read during it got 503 store_unavailable with Retry-After".into())
}

/// Every op ends `completed` with its own exit code (op `i` exits `i`).
async fn settled_with_real_codes(
    k: &KernelProcess,
    ops: &[String],
) -> anyhow::Result<HashMap<String, String>> {
    let mut statuses = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        let s = k.wait_terminal(op, Duration::from_secs(120)).await?;
        statuses.insert(op.clone(), s["status"].as_str().unwrap_or("").to_owned());
        check(s["status"] == "completed" && s["exit_code"] == i, || {
            format!("op {i} ({op}) should have completed with code {i}: {s}")
        })?;
    }
    Ok(statuses)
}

/// Each command recorded itself once, each op ended once in the journal
/// and was delivered in exactly one report.
async fn ran_and_delivered_once(
    k: &KernelProcess,
    run: &str,
    ops: &[String],
) -> anyhow::Result<()> {
    let ran = runs(k, run);
    for op in ops {
        let times = ran.get(op).copied().unwrap_or(0);
        check(times == 1, || format!("{op} ran {times} times"))?;
    }
    let ids: Vec<&str> = ops.iter().map(String::as_str).collect();
    check_ended_once(k, run, &ids).await?;
    let delivered = k
        .collect_deliveries(run, ops.len(), Duration::from_secs(60))
        .await?;
    let again = k
        .collect_deliveries(run, 1, Duration::from_millis(500))
        .await?;
    let mut count: HashMap<&str, usize> = HashMap::new();
    for op in delivered.iter().chain(&again) {
        *count.entry(op.as_str()).or_default() += 1;
    }
    for op in ops {
        let n = count.get(op.as_str()).copied().unwrap_or(0);
        check(n == 1, || format!("{op} was delivered {n} times"))?;
    }
    check(count.len() == ops.len(), || {
        format!("{} ops delivered, {} started", count.len(), ops.len())
    })
}

/// A burst start: recorded as run, then exits 0.
fn burst_body() -> serde_json::Value {
    serde_json::json!({
        "command": ["sh", "-c", recording("exit 0")],
        "background": true,
    })
}

/// Starts [`BURST`] ops at once, each with an Idempotency-Key; each task
/// answers its key and the op id, if its start was answered 200.
fn start_burst(
    k: &KernelProcess,
    run: &str,
) -> Vec<(String, tokio::task::JoinHandle<Option<String>>)> {
    (0..BURST)
        .map(|i| {
            let key = format!("burst-{i}");
            let (client, path) = (
                k.client.clone(),
                format!("/v1/runs/{run}/tools/run_command"),
            );
            let body = burst_body();
            let header = key.clone();
            let task = tokio::spawn(async move {
                let answer = client
                    .request(
                        reqwest::Method::POST,
                        &path,
                        Some(&body),
                        &[("Idempotency-Key", &header)],
                    )
                    .await
                    .ok()?;
                (answer.0 == 200).then(|| answer.1["operation_id"].as_str().map(str::to_owned))?
            });
            (key, task)
        })
        .collect()
}

/// Each burst start that was not answered is retried with its key (the
/// retry finds the op its lost answer had admitted, or admits it now);
/// then every burst op must complete with 0. Returns their ids, and how
/// many starts were answered before the crash.
async fn burst_settled(
    k: &KernelProcess,
    run: &str,
    burst: Vec<(String, tokio::task::JoinHandle<Option<String>>)>,
) -> anyhow::Result<(Vec<String>, usize)> {
    let (mut ids, mut answered) = (Vec::new(), 0);
    for (key, task) in burst {
        let id = match task.await? {
            Some(id) => {
                answered += 1;
                id
            }
            None => {
                let body = burst_body();
                let (status, answer) = k
                    .client
                    .request(
                        reqwest::Method::POST,
                        &format!("/v1/runs/{run}/tools/run_command"),
                        Some(&body),
                        &[("Idempotency-Key", &key)],
                    )
                    .await?;
                check(status == 200, || {
                    format!("the retry of {key} answered {status}: {answer}")
                })?;
                answer["operation_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            }
        };
        let s = k.wait_terminal(&id, Duration::from_secs(120)).await?;
        check(s["status"] == "completed" && s["exit_code"] == 0, || {
            format!("burst op {key} ({id}) should have completed with 0: {s}")
        })?;
        ids.push(id);
    }
    Ok((ids, answered))
}
