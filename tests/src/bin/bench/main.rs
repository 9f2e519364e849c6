//! `opkernel-bench`: one run of the kernel against raw Docker, side by side.
//! Driven by `scripts/bench.sh [--quick] [--json] [--check]`; the last line
//! of `--json` output is one JSON object with every figure.
//! `--recovery-only OPS CONTAINERS` runs only the recovery measurement;
//! `--concurrent-only OPS RUNS` only the concurrency one;
//! `--cpu-only [OPS] [RUNS]` only the kernel's CPU per op;
//! `--latency-only [SAMPLES]` only the start and running latencies;
//! `--pool-only [SAMPLES]` only a new run's first command, pool on and off;
//! `--files-only` the files API and forks; `--egress-only` the egress proxy;
//! `--runtimes [SAMPLES]` runc beside gVisor (needs `docker-up.sh --runsc`);
//! `--cluster` the cluster's figures on `scripts/cluster.sh` nodes.
//! `--check` exits non-zero when a correctness figure is off (see
//! [`Checks`]); timings are reported, never asserted (the machine is noisy).

#![recursion_limit = "256"]

mod abuse;
mod cluster;
mod cpuop;
mod egress;
mod full;
mod interactive;
mod latency;
mod only;
mod pool;
mod report;
mod runtimes;
mod scale;
mod storecost;
mod workspaces;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use opkernel::drills::harness::{kernel_binary, KernelProcess};

/// Kernel settings for benchmarking: the production defaults.
pub const BENCH_ENV: &[(&str, &str)] = &[
    ("OPKERNEL_PROBE_INTERVAL", "5000ms"),
    ("OPKERNEL_HEARTBEAT", "10000ms"),
    ("OPKERNEL_KILL_GRACE", "5000ms"),
    ("OPKERNEL_START_EVIDENCE", "10000ms"),
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

/// Peak kernel RSS a run of the bench may reach (README: ≤ 150 MB for the
/// release build; the debug build, which `.ci/run` measures, is held to
/// 250 MB: still a leak's alarm, its own allocations larger).
const MAX_RSS_MB: f64 = if cfg!(debug_assertions) { 250.0 } else { 150.0 };

/// How much a file moved up and down through the files API may grow the
/// kernel's peak RSS: a streamed transfer holds a few chunks in flight,
/// whatever the file's size (256 MiB in quick mode, 1 GiB in full).
const MAX_FILES_GROWTH_MB: f64 = 64.0;

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
        self.zero("concurrent_executed_twice", c.executed_twice);
        self.rss("kernel_peak_rss_mb", c.peak_rss_mb);
        self.zero("concurrent_launchers_missing", c.launchers_missing);
        self.zero("concurrent_fallback_ops", fallbacks);
    }

    fn recovery(&mut self, r: &scale::Recovery) {
        self.zero("recovery_lost", r.lost);
        self.zero("recovery_duplicated", r.duplicated);
        self.zero("recovery_executed_twice", r.executed_twice);
        self.want(
            "recovery_delivered",
            r.delivered,
            &r.ops.to_string(),
            r.delivered == r.ops,
        );
    }

    fn files(&mut self, w: &workspaces::Workspaces) {
        self.zero("files_corrupt", w.corrupt);
        self.want(
            "files_kernel_rss_growth_mb",
            format!("{:.1} MB", w.rss_growth_mb),
            &format!("<= {MAX_FILES_GROWTH_MB} MB, for a {} MiB file", w.file_mib),
            w.rss_growth_mb <= MAX_FILES_GROWTH_MB,
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
    let num = |flag: &str, j: usize| {
        let i = args.iter().position(|a| a == flag)?;
        args.get(i + j).and_then(|v| v.parse::<usize>().ok())
    };
    let flag = |name: &str| args.iter().any(|a| a == name);
    if flag("--recovery-only") {
        let (ops, containers) = (
            num("--recovery-only", 1).unwrap_or(100),
            num("--recovery-only", 2).unwrap_or(10),
        );
        only::recovery(&bin, ops, containers, &mut checks).await?;
    } else if flag("--concurrent-only") {
        let (ops, runs) = (
            num("--concurrent-only", 1).unwrap_or(5000),
            num("--concurrent-only", 2).unwrap_or(50),
        );
        only::concurrent(&bin, ops, runs, &mut checks).await?;
    } else if flag("--cpu-only") {
        let (ops, runs) = (
            num("--cpu-only", 1).unwrap_or(5000),
            num("--cpu-only", 2).unwrap_or(50),
        );
        only::cpu(&bin, ops, runs, &mut checks).await?;
    } else if flag("--latency-only") {
        only::latency(&bin, num("--latency-only", 1).unwrap_or(100), &mut checks).await?;
    } else if flag("--interactive-only") {
        let samples = num("--interactive-only", 1).unwrap_or(100);
        only::interactive(&bin, samples, &mut checks).await?;
    } else if flag("--pool-only") {
        only::pool(&bin, num("--pool-only", 1).unwrap_or(30), &mut checks).await?;
    } else if flag("--runtimes") {
        let figures = runtimes::measure(&bin, num("--runtimes", 1).unwrap_or(50)).await?;
        println!("{figures}");
    } else if flag("--files-only") {
        only::files(&bin, quick, &mut checks).await?;
    } else if flag("--egress-only") {
        only::egress(&bin, quick, &mut checks).await?;
    } else if flag("--abuse-only") {
        only::abuse(&bin, &mut checks).await?;
    } else if flag("--cluster") {
        let figures = cluster::measure(quick, &mut checks).await?;
        println!("{figures:#}");
        if as_json {
            println!("{figures}");
        }
    } else {
        eprintln!(
            "bench: kernel {} ({} mode, store {store})",
            bin.display(),
            if quick { "quick" } else { "full" }
        );
        let run = full::measure(&bin, quick).await?;
        run.check(&mut checks);
        let figures = run.figures(quick, store);
        run.print(&figures);
        if as_json {
            println!("{figures}");
        }
    }
    if check {
        checks.finish()?;
    }
    Ok(())
}
