//! The warm pool (SPEC §22): a new run's first command, from the run's
//! creation to the command's answer, with the pool on and off; how long the
//! pool takes to refill after an adoption; what an idle pool container
//! costs in memory.

use std::path::Path;
use std::time::{Duration, Instant};

use opkernel::drills::harness::KernelProcess;
use serde_json::{json, Value};

use crate::{ms, BENCH_ENV};

/// The pool's figures.
pub struct PoolFigures {
    /// Run creation → first command's answer, pool on (ms).
    pub first_command: Vec<f64>,
    /// The same with the pool off (ms).
    pub first_command_nopool: Vec<f64>,
    /// The adopted container's second command, once the pool is full
    /// again (ms): the same path on a container whose storage is warm.
    pub second_command: Vec<f64>,
    /// Adoption → the pool back to its size (ms).
    pub refill: Vec<f64>,
    /// Memory of one idle pool container, as Docker counts it (MiB).
    pub idle_container_mib: f64,
    /// First commands that did not run in a pool container (pool on).
    pub not_adopted: usize,
}

/// Free pool containers listed now.
async fn free(k: &KernelProcess) -> anyhow::Result<Vec<String>> {
    let list = k.client.get("/v1/containers").await?;
    Ok(list["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["pool"] == "free" && c["state"] == "running")
        .filter_map(|c| c["container_id"].as_str().map(str::to_owned))
        .collect())
}

/// Waits until `n` free containers are listed; returns how long it took.
async fn until_free(k: &KernelProcess, n: usize) -> anyhow::Result<Duration> {
    let began = Instant::now();
    while free(k).await?.len() < n {
        anyhow::ensure!(
            began.elapsed() < Duration::from_secs(60),
            "the pool did not refill"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(began.elapsed())
}

/// One new run's first command: creation, then `echo`; its time and the
/// container that answered.
async fn new_run_first_command(k: &KernelProcess, run: &str) -> anyhow::Result<(f64, String)> {
    let began = Instant::now();
    k.client.post("/v1/runs", &json!({ "run_id": run })).await?;
    let (_, container) = echo(k, run).await?;
    Ok((ms(began.elapsed()), container))
}

/// `echo hi` in `run`, waited for: its time and the container that answered.
async fn echo(k: &KernelProcess, run: &str) -> anyhow::Result<(f64, String)> {
    let began = Instant::now();
    let done: Value = k
        .client
        .post(
            &format!("/v1/runs/{run}/tools/run_command"),
            &json!({"command": ["echo", "hi"]}),
        )
        .await?;
    let took = ms(began.elapsed());
    anyhow::ensure!(done["output"] == "hi\n", "echo answered {done}");
    Ok((
        took,
        done["container_id"].as_str().unwrap_or_default().to_owned(),
    ))
}

/// `samples` new runs with the pool on (size 2), then off.
pub async fn measure(bin: &Path, samples: usize) -> anyhow::Result<PoolFigures> {
    measure_with(bin, samples, &[]).await
}

/// [`measure`] with `extra` settings for every kernel (a runtime, say).
pub async fn measure_with(
    bin: &Path,
    samples: usize,
    extra: &[(&str, &str)],
) -> anyhow::Result<PoolFigures> {
    let mut env = BENCH_ENV.to_vec();
    env.extend_from_slice(extra);
    let nopool = env.clone();
    env.push(("OPKERNEL_POOL", "2"));
    let k = KernelProcess::start(bin, "bench-pool", &env).await?;
    let (mut first_command, mut refill, mut not_adopted) = (Vec::new(), Vec::new(), 0);
    let mut second_command = Vec::new();
    until_free(&k, 2).await?;
    let idle = free(&k).await?;
    let idle_container_mib = memory_mib(&idle[0])?;
    for i in 0..samples {
        let ready = free(&k).await?;
        let (took, container) = new_run_first_command(&k, &format!("bench-pool-{i}")).await?;
        let began = Instant::now();
        first_command.push(took);
        not_adopted += usize::from(!ready.contains(&container));
        until_free(&k, 2).await?;
        refill.push(ms(began.elapsed()));
        let (took, again) = echo(&k, &format!("bench-pool-{i}")).await?;
        anyhow::ensure!(again == container, "the second command left its container");
        second_command.push(took);
    }
    drop(k);
    let k = KernelProcess::start(bin, "bench-nopool", &nopool).await?;
    let mut first_command_nopool = Vec::new();
    for i in 0..samples {
        first_command_nopool.push(
            new_run_first_command(&k, &format!("bench-nopool-{i}"))
                .await?
                .0,
        );
    }
    Ok(PoolFigures {
        first_command,
        first_command_nopool,
        second_command,
        refill,
        idle_container_mib,
        not_adopted,
    })
}

/// A container's CPU use now as `docker stats` reports it, in percent of
/// one CPU.
pub fn cpu_percent(container: &str) -> anyhow::Result<f64> {
    let out = std::process::Command::new("docker")
        .args([
            "stats",
            "--no-stream",
            "--format",
            "{{.CPUPerc}}",
            container,
        ])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.trim().trim_end_matches('%').parse()?)
}

/// A container's memory use as `docker stats` reports it, in MiB.
fn memory_mib(container: &str) -> anyhow::Result<f64> {
    let out = std::process::Command::new("docker")
        .args([
            "stats",
            "--no-stream",
            "--format",
            "{{.MemUsage}}",
            container,
        ])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let used = text.split('/').next().unwrap_or_default().trim();
    let (number, unit) =
        used.split_at(used.find(|c: char| c.is_alphabetic()).unwrap_or(used.len()));
    let value: f64 = number.trim().parse()?;
    Ok(match unit {
        "KiB" | "kB" => value / 1024.0,
        "GiB" | "GB" => value * 1024.0,
        "B" => value / (1024.0 * 1024.0),
        _ => value,
    })
}
