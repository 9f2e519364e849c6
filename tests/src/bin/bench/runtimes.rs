//! runc beside gVisor (SPEC §30), in one run: an op's running and first
//! output latencies (against a bare API exec in the same container), a
//! stdin write's echo, a new run's first command with the warm pool, and
//! what an idle container costs in CPU (under gVisor the launcher looks at
//! its inbox every few ms instead of waiting on inotify).

use std::path::Path;

use opkernel::drills::harness::KernelProcess;
use serde_json::{json, Value};

use crate::{pct, row, BENCH_ENV};

/// One runtime's figures, p50 in ms unless named otherwise.
async fn one(bin: &Path, runtime: &str, samples: usize) -> anyhow::Result<Value> {
    let mut env = BENCH_ENV.to_vec();
    env.push(("OPKERNEL_RUNTIME", runtime));
    let k = KernelProcess::start(bin, &format!("bench-{runtime}"), &env).await?;
    let lat = crate::latency::measure(&k, samples).await?;
    let echo = crate::interactive::measure(&k, samples.min(50)).await?;
    drop(k);
    let pool =
        crate::pool::measure_with(bin, samples.min(20), &[("OPKERNEL_RUNTIME", runtime)]).await?;
    let idle_cpu = idle_cpu(bin, runtime).await?;
    println!("-- {runtime}");
    row(&format!("running ({runtime})"), &lat.running);
    row(&format!("bare API exec ({runtime})"), &lat.api);
    row(&format!("first output ({runtime})"), &lat.first_output);
    row(&format!("stdin write -> echo ({runtime})"), &echo.echo);
    row(
        &format!("new run, 1st cmd ({runtime})"),
        &pool.first_command,
    );
    println!("idle container CPU ({runtime}): {idle_cpu:.2}% of one CPU");
    anyhow::ensure!(
        echo.missing == 0,
        "{} echoes missing under {runtime}",
        echo.missing
    );
    anyhow::ensure!(
        pool.not_adopted == 0,
        "{} first commands not adopted under {runtime}",
        pool.not_adopted
    );
    Ok(json!({
        "running_ms": pct(&lat.running, 50.0),
        "api_exec_ms": pct(&lat.api, 50.0),
        "running_over_api": pct(&lat.running, 50.0) / pct(&lat.api, 50.0),
        "first_output_ms": pct(&lat.first_output, 50.0),
        "stdin_echo_ms": pct(&echo.echo, 50.0),
        "pool_first_command_ms": pct(&pool.first_command, 50.0),
        "idle_container_cpu_percent": idle_cpu,
    }))
}

/// The CPU an idle run container takes: its launcher waiting for work
/// (blocked on inotify under runc, polling its inbox under gVisor).
async fn idle_cpu(bin: &Path, runtime: &str) -> anyhow::Result<f64> {
    let mut env = BENCH_ENV.to_vec();
    env.push(("OPKERNEL_RUNTIME", runtime));
    let k = KernelProcess::start(bin, &format!("bench-idle-{runtime}"), &env).await?;
    let run = "bench-idle";
    let out = k
        .client
        .post(
            &format!("/v1/runs/{run}/tools/run_command"),
            &json!({"command": ["true"]}),
        )
        .await?;
    let container = out["container_id"].as_str().unwrap_or_default().to_owned();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let mut samples = Vec::new();
    for _ in 0..3 {
        samples.push(crate::pool::cpu_percent(&container)?);
    }
    Ok(samples.iter().sum::<f64>() / samples.len() as f64)
}

/// Both runtimes, side by side; the JSON object of both.
pub async fn measure(bin: &Path, samples: usize) -> anyhow::Result<Value> {
    let runc = one(bin, "runc", samples).await?;
    let runsc = one(bin, "runsc", samples).await?;
    Ok(json!({"runc": runc, "runsc": runsc}))
}
