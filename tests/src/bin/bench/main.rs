//! `opkernel-bench`: one run of the kernel against raw Docker, side by side.
//! Driven by `scripts/bench.sh [--quick] [--json] [--check]`; the last line
//! of `--json` output is one JSON object with every figure.
//! `--recovery-only OPS CONTAINERS` runs only the recovery measurement;
//! `--concurrent-only OPS RUNS` only the concurrency one.
//! `--check` exits non-zero when a correctness figure is off (see
//! [`Checks`]); timings are reported, never asserted (the machine is noisy).

#![recursion_limit = "256"]

mod abuse;
mod latency;
mod scale;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use serde_json::json;

/// Kernel settings for benchmarking: the production defaults.
pub const BENCH_ENV: &[(&str, &str)] = &[
    ("OPKERNEL_PROBE_INTERVAL_MS", "5000"),
    ("OPKERNEL_HEARTBEAT_MS", "10000"),
    ("OPKERNEL_KILL_GRACE_MS", "5000"),
    ("OPKERNEL_START_EVIDENCE_MS", "10000"),
    ("OPKERNEL_LOG", "warn"),
];

/// Percentile of a sample (nearest rank), in the sample's unit.
pub fn pct(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Waits for a host file to exist, polling every 100 µs. Returns when it appeared.
pub fn wait_file(path: &std::path::Path, timeout: Duration) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        if path.exists() {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            anyhow::bail!("{} did not appear within {timeout:?}", path.display());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Waits for a host file to hold at least one byte, polling every 100 µs.
pub fn wait_output(path: &std::path::Path, timeout: Duration) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            anyhow::bail!("{} got no output within {timeout:?}", path.display());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// How many of the kernel's ops were started by `docker exec` rather than
/// by their container's resident launcher: handed over and taken back (an
/// exec id recorded), or never handed over. In the launcher path (the
/// default) every op goes through the launcher, so this is 0. Read from the
/// control plane: the handover files leave the inbox once an op settles.
pub fn fallbacks(k: &KernelProcess) -> anyhow::Result<usize> {
    Ok(k.sql_offline_query(
        "SELECT COUNT(*) FROM ops WHERE exec_id IS NOT NULL \
         OR (exec_claimed_at IS NOT NULL AND handed_over_at IS NULL)",
    )? as usize)
}

/// Peak kernel RSS a run of the bench may reach (README: ≤ 150 MB).
const MAX_RSS_MB: f64 = 150.0;

/// The correctness figures of one bench run, each held to its target by
/// `--check`: nothing lost or duplicated, every op through the launcher,
/// the kernel's memory bounded, every measuring client served.
#[derive(Default)]
pub struct Checks {
    lines: Vec<(String, bool)>,
}

impl Checks {
    fn want(&mut self, name: &str, got: impl std::fmt::Display, want: &str, ok: bool) {
        self.lines
            .push((format!("{name} = {got} (want {want})"), ok));
    }

    fn zero(&mut self, name: &str, got: usize) {
        self.want(name, got, "0", got == 0);
    }

    fn rss(&mut self, name: &str, mb: f64) {
        self.want(
            name,
            format!("{mb:.1} MB"),
            &format!("<= {MAX_RSS_MB} MB"),
            mb <= MAX_RSS_MB,
        );
    }

    fn concurrent(&mut self, c: &scale::Concurrent, fallbacks: usize) {
        self.zero("concurrent_lost", c.lost);
        self.zero("concurrent_duplicated", c.duplicated);
        self.rss("kernel_peak_rss_mb", c.peak_rss_mb);
        self.zero("concurrent_launchers_missing", c.launchers_missing);
        self.zero("concurrent_fallback_ops", fallbacks);
    }

    fn recovery(&mut self, r: &scale::Recovery) {
        self.zero("recovery_lost", r.lost);
        self.zero("recovery_duplicated", r.duplicated);
        self.want(
            "recovery_delivered",
            r.delivered,
            &r.ops.to_string(),
            r.delivered == r.ops,
        );
    }

    fn abuse(&mut self, a: &abuse::Abuse) {
        self.rss("abuse_kernel_peak_rss_mb", a.peak_rss_mb);
        self.zero("abuse_log_reader_failures", a.reader_failures);
        self.zero("abuse_sse_failures", a.sse_failures);
    }

    /// Prints every figure held; fails when one is off.
    fn finish(self) -> anyhow::Result<()> {
        let off = self.lines.iter().filter(|(_, ok)| !ok).count();
        for (line, ok) in &self.lines {
            println!("check: {line}: {}", if *ok { "ok" } else { "OFF" });
        }
        anyhow::ensure!(off == 0, "{off} correctness figure(s) off");
        println!("check: all {} correctness figures hold", self.lines.len());
        Ok(())
    }
}

pub fn scratch_dir(k: &KernelProcess, run: &str) -> PathBuf {
    k.home
        .join("scratch")
        .join(sandbox::profile::scratch_key(run))
}

fn row(name: &str, samples: &[f64]) {
    println!(
        "{:<28} {:>9.1} {:>9.1} {:>9.1} {:>6}",
        name,
        pct(samples, 50.0),
        pct(samples, 90.0),
        pct(samples, 99.0),
        samples.len()
    );
}

/// The store the bench's kernels use: with `OPKERNEL_STORE=postgres://…`
/// each kernel gets a fresh database on that server (the drills' harness
/// makes it), and the variable is not passed on as is (kernels sharing one
/// database would see each other's ops).
fn bench_store() -> &'static str {
    match std::env::var("OPKERNEL_STORE") {
        Ok(url) if url.starts_with("postgres") => {
            std::env::set_var("OPKERNEL_TEST_STORE", "postgres");
            std::env::set_var("OPKERNEL_TEST_PG", url);
            std::env::remove_var("OPKERNEL_STORE");
            "postgres"
        }
        _ => "sqlite",
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let as_json = args.iter().any(|a| a == "--json");
    let check = args.iter().any(|a| a == "--check");
    let mut checks = Checks::default();
    let store = bench_store();
    let bin = kernel_binary()?;
    let samples = if quick { 30 } else { 100 };
    if let Some(i) = args.iter().position(|a| a == "--recovery-only") {
        let num = |j: usize| args.get(i + j).and_then(|v| v.parse::<usize>().ok());
        let (ops, containers) = (num(1).unwrap_or(100), num(2).unwrap_or(10));
        let mut k = KernelProcess::start(&bin, "bench-recovery", BENCH_ENV).await?;
        let rec = scale::recovery(&mut k, ops, containers).await?;
        println!(
            "recovery: {} running ops over {} containers re-attached {:.2}s after SIGKILL + restart; {} delivered afterwards; lost {}, duplicated {}",
            rec.ops, rec.containers, rec.seconds, rec.delivered, rec.lost, rec.duplicated
        );
        checks.recovery(&rec);
        checks.zero("recovery_fallback_ops", fallbacks(&k)?);
        return if check { checks.finish() } else { Ok(()) };
    }

    if let Some(i) = args.iter().position(|a| a == "--concurrent-only") {
        let num = |j: usize| args.get(i + j).and_then(|v| v.parse::<usize>().ok());
        let (ops, runs) = (num(1).unwrap_or(5000), num(2).unwrap_or(50));
        let k = KernelProcess::start(&bin, "bench-scale", BENCH_ENV).await?;
        let c = scale::concurrent(&k, ops, runs).await?;
        let fell_back = fallbacks(&k)?;
        println!(
            "concurrent: {} ops in {} runs started in {:.1}s (kernel CPU {:.1}s meanwhile); lost {}, duplicated {}; kernel CPU while they wait {:.2}%; peak RSS {:.1} MB; fallbacks {}; launchers {} at most {:.2}% CPU, {} KiB",
            c.ops, c.runs, c.start_sec, c.start_cpu_sec, c.lost, c.duplicated, c.cpu_pct_idle, c.peak_rss_mb, fell_back,
            c.launchers, c.launcher_cpu_pct_max, c.launcher_rss_kb_max
        );
        checks.concurrent(&c, fell_back);
        return if check { checks.finish() } else { Ok(()) };
    }

    if args.iter().any(|a| a == "--abuse-only") {
        let k = KernelProcess::start(&bin, "bench-abuse", BENCH_ENV).await?;
        let a = abuse::measure(&k).await?;
        println!(
            "abuse: {} readers of a {} MiB log + {} SSE clients: kernel peak RSS {:.1} MB; other run's start p50 {:.1} ms -> {:.1} ms; failed readers {}, failed SSE clients {}",
            a.readers, a.log_bytes_each >> 20, a.sse_clients, a.peak_rss_mb, a.start_p50_before_ms, a.start_p50_during_ms,
            a.reader_failures, a.sse_failures
        );
        checks.abuse(&a);
        return if check { checks.finish() } else { Ok(()) };
    }
    eprintln!(
        "bench: kernel {} ({} mode, store {store})",
        bin.display(),
        if quick { "quick" } else { "full" }
    );
    let k = KernelProcess::start(&bin, "bench", BENCH_ENV).await?;
    let lat = latency::measure(&k, samples).await?;
    let notify_samples = if quick { 15 } else { 40 };
    let (notify, notify_missing) = latency::notify(&k, notify_samples).await?;
    let lat_fallbacks = fallbacks(&k)?;
    drop(k);

    let k = KernelProcess::start(&bin, "bench-scale", BENCH_ENV).await?;
    let conc = scale::concurrent(&k, 5000, 50).await?;
    let conc_fallbacks = fallbacks(&k)?;
    drop(k);

    let mut k = KernelProcess::start(&bin, "bench-recovery", BENCH_ENV).await?;
    let rec = scale::recovery(&mut k, 500, 50).await?;
    let rec_fallbacks = fallbacks(&k)?;
    drop(k);

    let k = KernelProcess::start(&bin, "bench-abuse", BENCH_ENV).await?;
    let abuse = abuse::measure(&k).await?;
    let abuse_fallbacks = fallbacks(&k)?;
    drop(k);

    checks.zero("latency_fallback_ops", lat_fallbacks);
    checks.zero("notify_missing", notify_missing);
    checks.concurrent(&conc, conc_fallbacks);
    checks.recovery(&rec);
    checks.zero("recovery_fallback_ops", rec_fallbacks);
    checks.abuse(&abuse);
    checks.zero("abuse_fallback_ops", abuse_fallbacks);
    let all_fallbacks = lat_fallbacks + conc_fallbacks + rec_fallbacks + abuse_fallbacks;

    let p50 = |v: &[f64]| pct(v, 50.0);
    let figures = json!({
        "mode": if quick { "quick" } else { "full" },
        "store": store,
        "samples": samples,
        "start_p50_ms": p50(&lat.start),
        "start_p90_ms": pct(&lat.start, 90.0),
        "start_p99_ms": pct(&lat.start, 99.0),
        "running_p50_ms": p50(&lat.running),
        "running_p90_ms": pct(&lat.running, 90.0),
        "running_p99_ms": pct(&lat.running, 99.0),
        "api_exec_p50_ms": p50(&lat.api),
        "api_exec_p90_ms": pct(&lat.api, 90.0),
        "docker_exec_cli_p50_ms": p50(&lat.cli),
        "docker_exec_cli_p90_ms": pct(&lat.cli, 90.0),
        "start_ratio_vs_cli": p50(&lat.start) / p50(&lat.cli),
        "running_ratio_vs_api": p50(&lat.running) / p50(&lat.api),
        "running_ratio_vs_cli": p50(&lat.running) / p50(&lat.cli),
        "shim_overhead_ms": lat.shim_overhead_ms,
        "first_output_p50_ms": p50(&lat.first_output),
        "first_output_p90_ms": pct(&lat.first_output, 90.0),
        "fallback_ops": all_fallbacks,
        "notify_missing": notify_missing,
        "launchers_missing": conc.launchers_missing,
        "launchers": conc.launchers,
        "launcher_cpu_pct_idle_max": conc.launcher_cpu_pct_max,
        "launcher_rss_kb_max": conc.launcher_rss_kb_max,
        "notify_p50_ms": p50(&notify),
        "notify_p90_ms": pct(&notify, 90.0),
        "concurrent_ops": conc.ops,
        "concurrent_runs": conc.runs,
        "concurrent_lost": conc.lost,
        "concurrent_duplicated": conc.duplicated,
        "concurrent_start_sec": conc.start_sec,
        "concurrent_start_kernel_cpu_sec": conc.start_cpu_sec,
        "kernel_cpu_pct_idle_wait": conc.cpu_pct_idle,
        "kernel_peak_rss_mb": conc.peak_rss_mb,
        "recovery_ops": rec.ops,
        "recovery_containers": rec.containers,
        "recovery_sec": rec.seconds,
        "recovery_delivered": rec.delivered,
        "recovery_lost": rec.lost,
        "recovery_duplicated": rec.duplicated,
        "abuse_log_readers": abuse.readers,
        "abuse_log_bytes_each": abuse.log_bytes_each,
        "abuse_sse_clients": abuse.sse_clients,
        "abuse_log_reader_failures": abuse.reader_failures,
        "abuse_sse_failures": abuse.sse_failures,
        "abuse_kernel_peak_rss_mb": abuse.peak_rss_mb,
        "abuse_other_run_start_p50_before_ms": abuse.start_p50_before_ms,
        "abuse_other_run_start_p50_during_ms": abuse.start_p50_during_ms,
        "abuse_start_ratio": abuse.start_p50_during_ms / abuse.start_p50_before_ms,
    });

    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>6}",
        "latency (ms)", "p50", "p90", "p99", "n"
    );
    row("start reply (kernel)", &lat.start);
    row("running (kernel)", &lat.running);
    row("running (bare API exec)", &lat.api);
    row("running (docker exec -d)", &lat.cli);
    row("first output (in the log)", &lat.first_output);
    row("notify (exit -> report)", &notify);
    println!(
        "ratios: start/cli {:.3}  running/api {:.3}  running/cli {:.3}",
        figures["start_ratio_vs_cli"].as_f64().unwrap_or(f64::NAN),
        figures["running_ratio_vs_api"].as_f64().unwrap_or(f64::NAN),
        figures["running_ratio_vs_cli"].as_f64().unwrap_or(f64::NAN)
    );
    println!(
        "shim overhead per op inside the container: {:.2} ms; ops that fell back to docker exec: {}",
        lat.shim_overhead_ms, all_fallbacks
    );
    println!(
        "launchers ({} containers) while the ops wait: CPU at most {:.2}% of a core, RSS at most {} KiB",
        conc.launchers, conc.launcher_cpu_pct_max, conc.launcher_rss_kb_max
    );
    println!(
        "concurrent: {} ops in {} runs started in {:.1}s; lost {}, duplicated {}; kernel CPU while they wait {:.2}% of a core; peak RSS {:.1} MB",
        conc.ops, conc.runs, conc.start_sec, conc.lost, conc.duplicated, conc.cpu_pct_idle, conc.peak_rss_mb
    );
    println!(
        "recovery: {} running ops over {} containers re-attached {:.2}s after SIGKILL + restart; {} delivered afterwards; lost {}, duplicated {}",
        rec.ops, rec.containers, rec.seconds, rec.delivered, rec.lost, rec.duplicated
    );
    println!(
        "abuse: {} readers of a {} MiB log + {} SSE clients: kernel peak RSS {:.1} MB; other run's start p50 {:.1} ms -> {:.1} ms; failed readers {}, failed SSE clients {}",
        abuse.readers,
        abuse.log_bytes_each >> 20,
        abuse.sse_clients,
        abuse.peak_rss_mb,
        abuse.start_p50_before_ms,
        abuse.start_p50_during_ms,
        abuse.reader_failures,
        abuse.sse_failures
    );
    if notify_missing > 0 {
        println!("notify: {notify_missing} of {notify_samples} ops never came back in a report");
    }
    if as_json {
        println!("{figures}");
    }
    if check {
        checks.finish()?;
    }
    Ok(())
}
