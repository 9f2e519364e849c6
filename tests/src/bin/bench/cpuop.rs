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

use crate::scale::{self, proc_cpu_ticks};
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
    /// The CPU of one durable filing on this machine, in µs: the kernel's
    /// own `OpsDir::submit` (create, write, fsync, rename, the directory's
    /// fsync; SPEC §28), run by the bench beside the kernel's scratch.
    pub filing_us: f64,
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
            "durable_filing_cpu_us": (self.filing_us * 10.0).round() / 10.0,
        })
    }
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

/// Starts `ops` background `true` ops spread over `runs` warm runs, 32
/// requests in flight, while one drainer per run collects its reports.
pub async fn measure(k: &KernelProcess, ops: usize, runs: usize) -> anyhow::Result<CpuPerOp> {
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let run_ids: Vec<String> = (0..runs).map(|i| format!("bench-cpu-{tag}-{i}")).collect();
    scale::prepare_runs(k, &run_ids).await?;
    let pid = k
        .pid()
        .ok_or_else(|| anyhow::anyhow!("kernel not running"))?;
    // let the warm-up's own work drain before counting
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let commits_before = storecost::commits(k).await?;
    let tx_before = transactions(k).await?;
    let (began, cpu_before) = (Instant::now(), proc_cpu_ticks(pid)?);
    let per_run = ops / runs;
    let drains = run_ids
        .iter()
        .map(|run| k.collect_deliveries(run, per_run, Duration::from_secs(600)));
    let jobs: Vec<&String> = (0..per_run).flat_map(|_| run_ids.iter()).collect();
    let starts = futures::stream::iter(jobs)
        .map(|run| async move { Ok((run.clone(), k.start_bg(run, &["true"], 60).await?)) })
        .buffer_unordered(32)
        .try_collect::<Vec<(String, String)>>();
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
    // lost: not delivered, or not completed with exit code 0
    let (lost, duplicated) = scale::count_outcomes(k, &started, &seen).await?;
    let home = k.home.clone();
    let filing_us = tokio::task::spawn_blocking(move || filing_cpu_us(&home, 500)).await??;
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
        lost,
        duplicated,
        filing_us,
    })
}

/// This thread's time on a CPU in µs (user and system: the first field
/// of its `schedstat`, in ns).
fn thread_cpu_us() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    let ns: u64 = stat
        .split_whitespace()
        .next()
        .ok_or_else(|| anyhow::anyhow!("empty schedstat"))?
        .parse()?;
    Ok(ns as f64 / 1000.0)
}

/// The CPU per durable filing: `n` requests filed by the kernel's own
/// `OpsDir::submit` into an inbox on the kernel's file system, on one
/// thread, then removed. It is the floor of the kernel's CPU per op on
/// this machine: every op launched by the launcher is filed once.
fn filing_cpu_us(home: &std::path::Path, n: usize) -> anyhow::Result<f64> {
    let dir = home.join("bench-filing");
    std::fs::create_dir_all(dir.join("inbox"))?;
    let ops = sandbox::OpsDir::new(&dir);
    let requests: Vec<sandbox::Request> = (0..n)
        .map(|_| sandbox::Request {
            host: "bench".into(),
            op_id: uuid::Uuid::new_v4().to_string(),
            run_as: "agent".into(),
            log_cap: 1 << 20,
            io: sandbox::Io::Null,
            argv: vec!["true".into()],
        })
        .collect();
    let before = thread_cpu_us()?;
    for request in &requests {
        ops.submit(request)?;
    }
    let spent = thread_cpu_us()? - before;
    std::fs::remove_dir_all(&dir)?;
    Ok(spent / n as f64)
}
