//! The kernel's CPU per op: a batch of background `true` ops over warm
//! runs, each from its start to its acked report (an agent long-polling
//! its run's report and acking each), against the kernel process's own CPU
//! time (user + system, from `/proc/<pid>/stat`) over the whole batch. On
//! PostgreSQL the store's commits over the same batch are counted too.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use opkernel::drills::harness::KernelProcess;
use serde_json::{json, Value};

use crate::scale::proc_cpu_ticks;
use crate::storecost;

/// One batch's cost.
pub struct CpuPerOp {
    pub ops: usize,
    pub runs: usize,
    pub wall_sec: f64,
    pub cpu_sec: f64,
    /// The kernel database's transactions committed over the batch, read
    /// only ones too (PostgreSQL's `pg_stat_database.xact_commit`; `None`
    /// on SQLite).
    pub commits: Option<i64>,
    /// The store's transactions over the batch, by the kernel's own
    /// metrics: (read, write, commits of writes).
    pub transactions: (f64, f64, f64),
    pub lost: usize,
    pub duplicated: usize,
}

impl CpuPerOp {
    pub fn ms_per_op(&self) -> f64 {
        self.cpu_sec * 1000.0 / self.ops as f64
    }

    pub fn commits_per_op(&self) -> Option<f64> {
        self.commits.map(|c| c as f64 / self.ops as f64)
    }

    pub fn figures(&self) -> Value {
        json!({
            "kernel_cpu_ops": self.ops,
            "kernel_cpu_ms_per_op": (self.ms_per_op() * 1000.0).round() / 1000.0,
            "kernel_cpu_batch_sec": self.wall_sec,
            "kernel_cpu_batch_pg_xact_commit_per_op": self.commits_per_op(),
            "store_read_transactions_per_op": self.transactions.0 / self.ops as f64,
            "store_write_transactions_per_op": self.transactions.1 / self.ops as f64,
            "store_write_commits_per_op": self.transactions.2 / self.ops as f64,
            "kernel_cpu_lost": self.lost,
            "kernel_cpu_duplicated": self.duplicated,
        })
    }
}

/// Drains one run's reports (long-polling, acking each) until `want` ops
/// were delivered or `deadline` passes; returns the ops delivered (marked
/// `failed:` unless completed with exit code 0). An ack that fails is an
/// error: the report it left unacked would come again and count twice.
async fn drain(
    k: &KernelProcess,
    run: &str,
    want: usize,
    deadline: Instant,
) -> anyhow::Result<Vec<String>> {
    let mut seen = Vec::new();
    while seen.len() < want && Instant::now() < deadline {
        let Ok(report) = k.client.get(&format!("/v1/runs/{run}/report?wait=5")).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        for item in report["resolved"].as_array().into_iter().flatten() {
            // anything but a clean exit counts as lost
            let ok = item["status"] == "completed" && item["exit_code"] == 0;
            let id = item["operation_id"].as_str().unwrap_or_default();
            seen.push(if ok {
                id.to_owned()
            } else {
                format!("failed:{id}")
            });
        }
        if let Some(id) = report["report_id"].as_str() {
            let ack = format!("/v1/runs/{run}/report/{id}/ack");
            k.client.post(&ack, &json!({})).await?;
        }
    }
    Ok(seen)
}

/// The store's transactions so far, read and write, and the commits of
/// writes, from `/metrics`.
async fn transactions(k: &KernelProcess) -> anyhow::Result<(f64, f64, f64)> {
    let text = String::from_utf8(k.client.get_bytes("/metrics").await?)?;
    let count = |kind: &str| {
        let key = match kind {
            "commits" => "opkernel_store_commits_total ".to_owned(),
            _ => format!("opkernel_store_transaction_seconds_count{{kind=\"{kind}\"}} "),
        };
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str())?.trim().parse::<f64>().ok())
            .ok_or_else(|| anyhow::anyhow!("no {key} in /metrics"))
    };
    Ok((count("read")?, count("write")?, count("commits")?))
}

/// Warms one container per run (a foreground `true`), four at a time.
async fn warm(k: &KernelProcess, runs: &[String]) -> anyhow::Result<()> {
    let warmed: Vec<anyhow::Result<Value>> = futures::stream::iter(runs.iter().cloned())
        .map(|run| async move {
            let path = format!("/v1/runs/{run}/tools/run_command");
            k.client.post(&path, &json!({"command": ["true"]})).await
        })
        .buffer_unordered(4)
        .collect()
        .await;
    warmed.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    Ok(())
}

/// Starts `ops` background `true` ops spread over `runs` warm runs, 32
/// requests in flight, while one drainer per run collects its reports.
pub async fn measure(k: &KernelProcess, ops: usize, runs: usize) -> anyhow::Result<CpuPerOp> {
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let run_ids: Vec<String> = (0..runs).map(|i| format!("bench-cpu-{tag}-{i}")).collect();
    warm(k, &run_ids).await?;
    let pid = k
        .pid()
        .ok_or_else(|| anyhow::anyhow!("kernel not running"))?;
    // let the warm-up's own work drain before counting
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let commits_before = storecost::commits(k).await?;
    let tx_before = transactions(k).await?;
    let (began, cpu_before) = (Instant::now(), proc_cpu_ticks(pid)?);
    let per_run = ops / runs;
    let deadline = began + Duration::from_secs(600);
    let drains = run_ids.iter().map(|run| drain(k, run, per_run, deadline));
    let jobs: Vec<&String> = (0..per_run).flat_map(|_| run_ids.iter()).collect();
    let starts = futures::stream::iter(jobs)
        .map(|run| async move { k.start_bg(run, &["true"], 60).await })
        .buffer_unordered(32)
        .try_collect::<Vec<String>>();
    // a failed start or ack ends the batch at once (its drain would wait
    // for the deadline)
    let (started, delivered) = tokio::try_join!(starts, futures::future::try_join_all(drains))?;
    let cpu_sec = proc_cpu_ticks(pid)?.saturating_sub(cpu_before) as f64 / 100.0;
    let wall_sec = began.elapsed().as_secs_f64();
    let tx_after = transactions(k).await?;
    let commits = match (commits_before, storecost::commits(k).await?) {
        (Some(b), Some(a)) => Some(a - b),
        _ => None,
    };
    let mut seen: HashMap<String, usize> = HashMap::new();
    for id in delivered.into_iter().flatten() {
        *seen.entry(id).or_default() += 1;
    }
    Ok(CpuPerOp {
        ops: started.len(),
        runs,
        wall_sec,
        cpu_sec,
        commits,
        transactions: (
            tx_after.0 - tx_before.0,
            tx_after.1 - tx_before.1,
            tx_after.2 - tx_before.2,
        ),
        lost: started.iter().filter(|id| !seen.contains_key(*id)).count(),
        duplicated: seen.values().filter(|&&n| n > 1).count(),
    })
}
