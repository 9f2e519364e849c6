//! Scale: many ops started together, the kernel's CPU and memory while they
//! wait, exactly-once delivery of all of them; and recovery of hundreds of
//! running ops over dozens of containers after a SIGKILL.

use std::collections::HashMap;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use futures::StreamExt;
use opkernel::drills::harness::KernelProcess;
use opkernel_tests::KernelProcessExt;
use serde_json::{json, Value};

use crate::scratch_dir;

/// Records its own execution (its op id, from the kernel's marker, one
/// line appended to `/scratch/ran`), then blocks until the bench opens
/// `/scratch/gate` for writing: zero CPU while waiting.
const GATED: &[&str] = &[
    "sh",
    "-c",
    "echo \"$__OPKERNEL_OP\" >> /scratch/ran; read x < /scratch/gate; echo released",
];

pub struct Concurrent {
    pub ops: usize,
    pub runs: usize,
    pub lost: usize,
    pub duplicated: usize,
    /// Ops whose command ran more than once (its own record, not a report).
    pub executed_twice: usize,
    pub start_sec: f64,
    /// Kernel CPU seconds spent while they started.
    pub start_cpu_sec: f64,
    pub cpu_pct_idle: f64,
    pub peak_rss_mb: f64,
    /// The containers' resident launchers over the same quiet window: CPU
    /// (% of a core, the busiest one) and resident set (KiB, the largest).
    pub launcher_cpu_pct_max: f64,
    pub launcher_rss_kb_max: u64,
    pub launchers: usize,
    /// Run containers in which no launcher could be measured.
    pub launchers_missing: usize,
}

pub struct Recovery {
    pub ops: usize,
    pub containers: usize,
    pub seconds: f64,
    pub delivered: usize,
    pub lost: usize,
    pub duplicated: usize,
    /// Ops whose command ran more than once (its own record, not a report).
    pub executed_twice: usize,
}

pub fn proc_cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let (_, rest) = stat
        .rsplit_once(") ")
        .ok_or_else(|| anyhow::anyhow!("bad stat"))?;
    let f: Vec<&str> = rest.split(' ').collect();
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`, ...).
pub fn status_kb(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no {field} for {pid}"))
}

/// Host pids of the resident launchers (`/.opkernel/shim serve`) of the
/// kernel's run containers, and how many of those containers showed none
/// (`docker top` failed, or no launcher in it): counted, never skipped.
fn launcher_pids(k: &KernelProcess) -> anyhow::Result<(Vec<u32>, usize)> {
    let out = std::process::Command::new("docker")
        .args(["ps", "-q", "--filter", "label=opkernel.managed=true"])
        .output()?;
    anyhow::ensure!(out.status.success(), "docker ps failed");
    let home = k.home.display().to_string();
    let mut pids = Vec::new();
    let mut missing = 0;
    for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let mounts = std::process::Command::new("docker")
            .args(["inspect", "-f", "{{range .Mounts}}{{.Source}} {{end}}", id])
            .output()?;
        if !mounts.status.success() {
            // gone meanwhile: not one of ours to measure (ours stay up)
            continue;
        }
        if !String::from_utf8_lossy(&mounts.stdout).contains(&home) {
            continue;
        }
        let top = std::process::Command::new("docker")
            .args(["top", id, "-o", "pid,args"])
            .output()?;
        let found: Vec<u32> = String::from_utf8_lossy(&top.stdout)
            .lines()
            .filter(|l| {
                let mut f = l.split_whitespace();
                f.next();
                f.collect::<Vec<_>>().join(" ") == "/.opkernel/shim serve"
            })
            .filter_map(|l| l.split_whitespace().next()?.parse::<u32>().ok())
            .collect();
        if !top.status.success() || found.len() != 1 {
            missing += 1;
        }
        pids.extend(found);
    }
    Ok((pids, missing))
}

pub fn peak_rss_mb(pid: u32) -> anyhow::Result<f64> {
    Ok(status_kb(pid, "VmHWM")? as f64 / 1024.0)
}

/// Warms one container per run and puts a gate fifo in each scratch dir.
pub(crate) async fn prepare_runs(k: &KernelProcess, runs: &[String]) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<Value>> = futures::stream::iter(runs.iter().cloned())
        .map(|run| async move {
            k.client
                .post(
                    &format!("/v1/runs/{run}/tools/run_command"),
                    &json!({"command": ["true"]}),
                )
                .await
        })
        .buffer_unordered(4)
        .collect()
        .await;
    for r in results {
        r?;
    }
    for run in runs {
        let gate = scratch_dir(k, run).join("gate");
        let status = std::process::Command::new("mkfifo")
            .args(["-m", "666"])
            .arg(&gate)
            .status()?;
        anyhow::ensure!(status.success(), "mkfifo {}", gate.display());
    }
    Ok(())
}

/// Starts `per_run` gated ops in each run, `parallel` requests at a time.
async fn start_gated(
    k: &KernelProcess,
    runs: &[String],
    per_run: usize,
    parallel: usize,
) -> anyhow::Result<Vec<(String, String)>> {
    let jobs: Vec<String> = (0..per_run).flat_map(|_| runs.iter().cloned()).collect();
    let started: Vec<anyhow::Result<(String, String)>> = futures::stream::iter(jobs)
        .map(|run| async move { k.start_bg(&run, GATED, 900).await.map(|id| (run, id)) })
        .buffer_unordered(parallel)
        .collect()
        .await;
    started.into_iter().collect()
}

/// Waits until `n` ops are running with their process recorded.
async fn wait_all_running(k: &KernelProcess, n: usize, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        // read from the control plane's file, not through the kernel's API:
        // the measurement must not load the kernel it measures
        let running = k.running_with_pid()?;
        if running >= n {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {running} of {n} ops running after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Opens every gate for writing (releasing all readers) until `done` holds.
async fn release(k: &KernelProcess, runs: &[String]) {
    for run in runs {
        let gate = scratch_dir(k, run).join("gate");
        if let Ok(f) = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&gate)
        {
            drop(f);
        }
    }
}

/// Drains reports of every run (acking them) until `want` deliveries were
/// seen or nothing arrives for a while. Returns op id → times delivered.
async fn collect(
    k: &KernelProcess,
    runs: &[String],
    want: usize,
    timeout: Duration,
) -> anyhow::Result<HashMap<String, usize>> {
    let deadline = Instant::now() + timeout;
    let mut seen: HashMap<String, usize> = HashMap::new();
    // after the expected count, a few more rounds: a late duplicate shows
    let mut after = 0;
    while after < 3 && Instant::now() < deadline {
        if seen.values().sum::<usize>() >= want {
            after += 1;
        }
        release(k, runs).await;
        for run in runs {
            let report = k
                .client
                .get(&format!("/v1/runs/{run}/report?wait=0"))
                .await?;
            for item in report["resolved"].as_array().into_iter().flatten() {
                *seen
                    .entry(item["operation_id"].as_str().unwrap_or_default().to_owned())
                    .or_default() += 1;
            }
            if let Some(id) = report["report_id"].as_str() {
                k.client
                    .post(&format!("/v1/runs/{run}/report/{id}/ack"), &json!({}))
                    .await?;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(seen)
}

pub(crate) async fn count_outcomes(
    k: &KernelProcess,
    ids: &[(String, String)],
    seen: &HashMap<String, usize>,
) -> anyhow::Result<(usize, usize)> {
    let mut lost = 0;
    for (_, id) in ids {
        let s = k.state(id).await?;
        if s["status"] != "completed" || s["exit_code"] != 0 || !seen.contains_key(id) {
            lost += 1;
        }
    }
    let duplicated = seen.values().filter(|&&n| n > 1).count();
    Ok((lost, duplicated))
}

/// Ops whose command ran more than once, by the commands' own records
/// (`/scratch/ran` of each run: one line per execution); an op of `ids`
/// that never ran is counted as lost by [`count_outcomes`].
fn executed_twice(k: &KernelProcess, runs: &[String]) -> usize {
    let mut ran: HashMap<String, usize> = HashMap::new();
    for run in runs {
        let text = std::fs::read_to_string(scratch_dir(k, run).join("ran")).unwrap_or_default();
        for id in text.lines().filter(|l| !l.is_empty()) {
            *ran.entry(id.to_owned()).or_default() += 1;
        }
    }
    ran.values().filter(|&&n| n > 1).count()
}

pub async fn concurrent(k: &KernelProcess, ops: usize, runs: usize) -> anyhow::Result<Concurrent> {
    let run_ids: Vec<String> = (0..runs).map(|i| format!("bench-conc-{i}")).collect();
    prepare_runs(k, &run_ids).await?;
    let pid = k
        .pid()
        .ok_or_else(|| anyhow::anyhow!("kernel not running"))?;
    let began = Instant::now();
    let cpu_before = proc_cpu_ticks(pid)?;
    let ids = start_gated(k, &run_ids, ops / runs, 32).await?;
    wait_all_running(k, ids.len(), Duration::from_secs(600)).await?;
    let start_sec = began.elapsed().as_secs_f64();
    let start_cpu_sec = proc_cpu_ticks(pid)?.saturating_sub(cpu_before) as f64 / 100.0;
    // let start-up work drain, then measure a quiet window
    tokio::time::sleep(Duration::from_secs(3)).await;
    let window = Duration::from_secs(15);
    let (launchers, launchers_missing) = launcher_pids(k)?;
    let l0: Vec<u64> = launchers
        .iter()
        .map(|&p| proc_cpu_ticks(p).unwrap_or(0))
        .collect();
    let (t0, c0) = (Instant::now(), proc_cpu_ticks(pid)?);
    tokio::time::sleep(window).await;
    let (t1, c1) = (Instant::now(), proc_cpu_ticks(pid)?);
    let hz = 100.0; // USER_HZ on Linux
    let secs = (t1 - t0).as_secs_f64();
    let cpu_pct_idle = ((c1 - c0) as f64 / hz) / secs * 100.0;
    let mut launcher_cpu_pct_max = 0.0f64;
    let mut launcher_rss_kb_max = 0;
    for (&p, before) in launchers.iter().zip(l0) {
        let ticks = proc_cpu_ticks(p)?.saturating_sub(before);
        launcher_cpu_pct_max = launcher_cpu_pct_max.max(ticks as f64 / hz / secs * 100.0);
        launcher_rss_kb_max = launcher_rss_kb_max.max(status_kb(p, "VmRSS")?);
    }
    let seen = collect(k, &run_ids, ids.len(), Duration::from_secs(300)).await?;
    let (lost, duplicated) = count_outcomes(k, &ids, &seen).await?;
    Ok(Concurrent {
        ops: ids.len(),
        runs,
        lost,
        duplicated,
        executed_twice: executed_twice(k, &run_ids),
        start_sec,
        start_cpu_sec,
        cpu_pct_idle,
        peak_rss_mb: peak_rss_mb(pid)?,
        launcher_cpu_pct_max,
        launcher_rss_kb_max,
        launchers: launchers.len(),
        launchers_missing,
    })
}

pub async fn recovery(
    k: &mut KernelProcess,
    ops: usize,
    containers: usize,
) -> anyhow::Result<Recovery> {
    let run_ids: Vec<String> = (0..containers).map(|i| format!("bench-rec-{i}")).collect();
    prepare_runs(k, &run_ids).await?;
    let ids = start_gated(k, &run_ids, ops / containers, 32).await?;
    wait_all_running(k, ids.len(), Duration::from_secs(600)).await?;
    let before: HashMap<String, u64> = ids.iter().map(|(_, id)| (id.clone(), 0)).collect();
    k.sigkill();
    let began = Instant::now();
    k.spawn().await?;
    // re-attached: a new observer attempt owns every op in the control plane
    let seconds = loop {
        let list = k.client.get("/v1/ops?limit=10000").await?;
        let attached = list["operations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|o| before.contains_key(o["operation_id"].as_str().unwrap_or_default()))
            .filter(|o| o["status"] == "running" && o["attempt"].as_u64() >= Some(2))
            .count();
        if attached == ids.len() {
            break began.elapsed().as_secs_f64();
        }
        anyhow::ensure!(
            began.elapsed() < Duration::from_secs(120),
            "only {attached} of {} re-attached",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let seen = collect(k, &run_ids, ids.len(), Duration::from_secs(300)).await?;
    let (lost, duplicated) = count_outcomes(k, &ids, &seen).await?;
    Ok(Recovery {
        ops: ids.len(),
        containers,
        seconds,
        delivered: seen.len(),
        lost,
        duplicated,
        executed_twice: executed_twice(k, &run_ids),
    })
}
