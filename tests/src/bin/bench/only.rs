//! The bench's single measurements (`--recovery-only`, `--concurrent-only`,
//! `--abuse-only`, `--latency-only`), each on a kernel of its own.

use std::path::Path;

use opkernel::drills::harness::KernelProcess;

use crate::{abuse, cpuop, fallbacks, latency, pct, row, scale, Checks, BENCH_ENV};

/// Recovery of `ops` running ops over `containers` after a SIGKILL.
pub async fn recovery(
    bin: &Path,
    ops: usize,
    containers: usize,
    checks: &mut Checks,
) -> anyhow::Result<()> {
    let mut k = KernelProcess::start(bin, "bench-recovery", BENCH_ENV).await?;
    let rec = scale::recovery(&mut k, ops, containers).await?;
    println!(
        "recovery: {} running ops over {} containers re-attached {:.2}s after SIGKILL + restart; {} delivered afterwards; lost {}, duplicated {}, executed twice {}",
        rec.ops, rec.containers, rec.seconds, rec.delivered, rec.lost, rec.duplicated, rec.executed_twice
    );
    checks.recovery(&rec);
    checks.zero("recovery_fallback_ops", fallbacks(&k)?);
    Ok(())
}

/// `ops` concurrent ops over `runs` runs.
pub async fn concurrent(
    bin: &Path,
    ops: usize,
    runs: usize,
    checks: &mut Checks,
) -> anyhow::Result<()> {
    let k = KernelProcess::start(bin, "bench-scale", BENCH_ENV).await?;
    let c = scale::concurrent(&k, ops, runs).await?;
    let fell_back = fallbacks(&k)?;
    println!(
        "concurrent: {} ops in {} runs started in {:.1}s (kernel CPU {:.1}s meanwhile); lost {}, duplicated {}; kernel CPU while they wait {:.2}%; peak RSS {:.1} MB; fallbacks {}; launchers {} at most {:.2}% CPU, {} KiB",
        c.ops, c.runs, c.start_sec, c.start_cpu_sec, c.lost, c.duplicated, c.cpu_pct_idle, c.peak_rss_mb, fell_back,
        c.launchers, c.launcher_cpu_pct_max, c.launcher_rss_kb_max
    );
    checks.concurrent(&c, fell_back);
    Ok(())
}

/// The kernel's CPU (and, on PostgreSQL, the store's commits) per op over
/// `ops` background `true` ops in `runs` runs.
pub async fn cpu(bin: &Path, ops: usize, runs: usize, checks: &mut Checks) -> anyhow::Result<()> {
    let k = KernelProcess::start(bin, "bench-cpu", BENCH_ENV).await?;
    let c = cpuop::measure(&k, ops, runs).await?;
    println!("{}", c.figures());
    checks.zero("kernel_cpu_lost", c.lost);
    checks.zero("kernel_cpu_duplicated", c.duplicated);
    Ok(())
}

/// Log readers and SSE clients against one kernel.
pub async fn abuse(bin: &Path, checks: &mut Checks) -> anyhow::Result<()> {
    let k = KernelProcess::start(bin, "bench-abuse", BENCH_ENV).await?;
    let a = abuse::measure(&k).await?;
    println!(
        "abuse: {} readers of a {} MiB log + {} SSE clients: kernel peak RSS {:.1} MB; other run's start p50 {:.1} ms -> {:.1} ms; failed readers {}, failed SSE clients {}",
        a.readers, a.log_bytes_each >> 20, a.sse_clients, a.peak_rss_mb, a.start_p50_before_ms, a.start_p50_during_ms,
        a.reader_failures, a.sse_failures
    );
    checks.abuse(&a);
    Ok(())
}

/// Start and running latencies over `samples` ops, against bare exec.
pub async fn latency(bin: &Path, samples: usize, checks: &mut Checks) -> anyhow::Result<()> {
    let k = KernelProcess::start(bin, "bench", BENCH_ENV).await?;
    let lat = latency::measure(&k, samples).await?;
    row("start reply (kernel)", &lat.start);
    row("running (kernel)", &lat.running);
    row("running (bare API exec)", &lat.api);
    println!(
        "ratio running/api {:.3}",
        pct(&lat.running, 50.0) / pct(&lat.api, 50.0)
    );
    checks.zero("latency_fallback_ops", fallbacks(&k)?);
    Ok(())
}

/// New runs' first commands with the warm pool on and off.
pub async fn pool(bin: &Path, samples: usize, checks: &mut Checks) -> anyhow::Result<()> {
    let p = crate::pool::measure(bin, samples).await?;
    row("new run, 1st cmd (pool)", &p.first_command);
    row("new run, 1st cmd (no pool)", &p.first_command_nopool);
    row("same run, 2nd cmd (pool)", &p.second_command);
    row("pool refill", &p.refill);
    println!(
        "an idle pool container holds {:.1} MiB; first commands not in a pool container: {}",
        p.idle_container_mib, p.not_adopted
    );
    checks.zero("pool_first_commands_not_adopted", p.not_adopted);
    Ok(())
}

/// Interactive ops: write → echo, beside `docker exec -i`, and `yield_ms`.
pub async fn interactive(bin: &Path, samples: usize, checks: &mut Checks) -> anyhow::Result<()> {
    let k = KernelProcess::start(bin, "bench-interactive", BENCH_ENV).await?;
    let i = crate::interactive::measure(&k, samples).await?;
    row("stdin write -> echo", &i.echo);
    row("docker exec -i (kept)", &i.exec_session);
    row("docker exec -i (per line)", &i.exec_once);
    row("yield_ms 100: answer", &i.yielded_after);
    println!(
        "yield_ms on a command that ends in time: {:+.2} ms at p50",
        i.yield_overhead_ms
    );
    checks.zero("stdin_echo_missing", i.missing);
    Ok(())
}

/// A large file up and down, beside `docker cp`, and forks.
pub async fn files(bin: &Path, quick: bool, checks: &mut Checks) -> anyhow::Result<()> {
    let w = crate::workspaces::measure(bin, quick).await?;
    w.print();
    checks.files(&w);
    Ok(())
}

/// The egress proxy's cost per connection and a download through it.
pub async fn egress(bin: &Path, quick: bool, checks: &mut Checks) -> anyhow::Result<()> {
    let e = crate::egress::measure(bin, quick).await?;
    e.print();
    checks.zero("egress_failed_requests", e.bad);
    Ok(())
}
