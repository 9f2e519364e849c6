//! The bench's full run: latency and notify on one kernel, then
//! concurrency, recovery and abuse each on a kernel of its own; its
//! figures as JSON, a readable table, and its correctness checks.

use std::path::Path;

use opkernel::drills::harness::KernelProcess;
use serde_json::{json, Value};

use crate::{
    abuse, cpuop, egress, fallbacks, interactive, latency, pct, pool, scale, storecost, workspaces,
    Checks, BENCH_ENV,
};

/// Every measurement of one full (or quick) run.
pub struct Run {
    samples: usize,
    pub(crate) lat: latency::Latency,
    pub(crate) notify: Vec<f64>,
    pub(crate) notify_samples: usize,
    pub(crate) notify_missing: usize,
    pub(crate) cost: Option<storecost::StoreCost>,
    /// 5,000 `true` ops, start to acked report, on a kernel of their own.
    pub(crate) cpu: cpuop::CpuPerOp,
    pub(crate) inter: interactive::Interactive,
    /// 1,000 ops over 20 runs (full mode only).
    pub(crate) conc_small: Option<(scale::Concurrent, usize)>,
    pub(crate) conc: scale::Concurrent,
    pub(crate) rec: scale::Recovery,
    pub(crate) abuse: abuse::Abuse,
    pub(crate) pool: pool::PoolFigures,
    pub(crate) files: workspaces::Workspaces,
    pub(crate) egress: egress::Egress,
    /// Ops started by `docker exec`, per phase: latency, concurrency,
    /// recovery, abuse.
    pub(crate) fallbacks: [usize; 4],
}

/// Runs every measurement, each phase on a fresh kernel.
pub async fn measure(bin: &Path, quick: bool) -> anyhow::Result<Run> {
    let samples = if quick { 30 } else { 100 };
    let k = KernelProcess::start(bin, "bench", BENCH_ENV).await?;
    let lat = latency::measure(&k, samples).await?;
    let notify_samples = if quick { 15 } else { 40 };
    let (notify, notify_missing) = latency::notify(&k, notify_samples).await?;
    let cost = storecost::measure(&k, if quick { 50 } else { 200 }).await?;
    let inter = interactive::measure(&k, samples).await?;
    let lat_fallbacks = fallbacks(&k)?;
    drop(k);
    let k = KernelProcess::start(bin, "bench-cpu", BENCH_ENV).await?;
    let cpu = cpuop::measure(&k, 5000, 50).await?;
    drop(k);
    let conc_small = if quick {
        None
    } else {
        let k = KernelProcess::start(bin, "bench-scale", BENCH_ENV).await?;
        let c = scale::concurrent(&k, 1000, 20).await?;
        Some((c, fallbacks(&k)?))
    };
    let k = KernelProcess::start(bin, "bench-scale", BENCH_ENV).await?;
    let conc = scale::concurrent(&k, 5000, 50).await?;
    let conc_fallbacks = fallbacks(&k)?;
    drop(k);
    let mut k = KernelProcess::start(bin, "bench-recovery", BENCH_ENV).await?;
    let rec = scale::recovery(&mut k, 500, 50).await?;
    let rec_fallbacks = fallbacks(&k)?;
    drop(k);
    let k = KernelProcess::start(bin, "bench-abuse", BENCH_ENV).await?;
    let abuse = abuse::measure(&k).await?;
    let abuse_fallbacks = fallbacks(&k)?;
    drop(k);
    let pool = pool::measure(bin, if quick { 10 } else { 30 }).await?;
    let files = workspaces::measure(bin, quick).await?;
    let egress = egress::measure(bin, quick).await?;
    Ok(Run {
        egress,
        pool,
        files,
        samples,
        lat,
        notify,
        notify_samples,
        notify_missing,
        cost,
        cpu,
        inter,
        conc_small,
        conc,
        rec,
        abuse,
        fallbacks: [
            lat_fallbacks,
            conc_fallbacks,
            rec_fallbacks,
            abuse_fallbacks,
        ],
    })
}

fn p50(v: &[f64]) -> f64 {
    pct(v, 50.0)
}

impl Run {
    /// Holds every correctness figure to its target.
    pub fn check(&self, checks: &mut Checks) {
        let [lat, conc, rec, abuse] = self.fallbacks;
        checks.zero("latency_fallback_ops", lat);
        checks.zero("notify_missing", self.notify_missing);
        checks.zero("stdin_echo_missing", self.inter.missing);
        checks.zero("kernel_cpu_lost", self.cpu.lost);
        checks.zero("kernel_cpu_duplicated", self.cpu.duplicated);
        if let Some((small, fell_back)) = &self.conc_small {
            checks.concurrent(small, *fell_back);
        }
        checks.concurrent(&self.conc, conc);
        checks.recovery(&self.rec);
        checks.zero("recovery_fallback_ops", rec);
        checks.abuse(&self.abuse);
        checks.zero("abuse_fallback_ops", abuse);
        checks.zero("pool_first_commands_not_adopted", self.pool.not_adopted);
        checks.files(&self.files);
        checks.zero("egress_failed_requests", self.egress.bad);
    }

    /// Every figure, as the JSON line prints them.
    pub fn figures(&self, quick: bool, store: &str) -> Value {
        let mut figures = self.latency_figures();
        let more = [
            self.scale_figures(),
            self.abuse_figures(),
            self.pool_figures(),
            self.interactive_figures(),
            self.files.figures(),
            self.egress.figures(),
            self.cpu.figures(),
        ];
        if let Some(map) = figures.as_object_mut() {
            map.insert("mode".into(), json!(if quick { "quick" } else { "full" }));
            map.insert("store".into(), json!(store));
            map.insert("samples".into(), json!(self.samples));
            for extra in more {
                map.extend(extra.as_object().cloned().unwrap_or_default());
            }
        }
        figures
    }

    fn latency_figures(&self) -> Value {
        let lat = &self.lat;
        let cost = self.cost.as_ref();
        json!({
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
            "fallback_ops": self.fallbacks.iter().sum::<usize>(),
            "notify_missing": self.notify_missing,
            "notify_p50_ms": p50(&self.notify),
            "notify_p90_ms": pct(&self.notify, 90.0),
            "store_cost_ops": cost.map(|c| c.ops),
            "store_statements_per_op": cost.and_then(|c| c.statements_per_op),
            "store_commits_per_op": cost.map(|c| c.commits_per_op),
        })
    }

    fn scale_figures(&self) -> Value {
        let (conc, rec) = (&self.conc, &self.rec);
        let small = self.conc_small.as_ref().map(|(c, _)| c);
        json!({
            "launchers_missing": conc.launchers_missing,
            "launchers": conc.launchers,
            "launcher_cpu_pct_idle_max": conc.launcher_cpu_pct_max,
            "launcher_rss_kb_max": conc.launcher_rss_kb_max,
            "concurrent_1000_lost": small.map(|c| c.lost),
            "concurrent_1000_duplicated": small.map(|c| c.duplicated),
            "concurrent_1000_start_sec": small.map(|c| c.start_sec),
            "concurrent_ops": conc.ops,
            "concurrent_runs": conc.runs,
            "concurrent_lost": conc.lost,
            "concurrent_duplicated": conc.duplicated,
            "concurrent_executed_twice": conc.executed_twice,
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
            "recovery_executed_twice": rec.executed_twice,
        })
    }

    fn abuse_figures(&self) -> Value {
        let abuse = &self.abuse;
        json!({
            "abuse_log_readers": abuse.readers,
            "abuse_log_bytes_each": abuse.log_bytes_each,
            "abuse_sse_clients": abuse.sse_clients,
            "abuse_log_reader_failures": abuse.reader_failures,
            "abuse_sse_failures": abuse.sse_failures,
            "abuse_kernel_peak_rss_mb": abuse.peak_rss_mb,
            "abuse_other_run_start_p50_before_ms": abuse.start_p50_before_ms,
            "abuse_other_run_start_p50_during_ms": abuse.start_p50_during_ms,
            "abuse_start_ratio": abuse.start_p50_during_ms / abuse.start_p50_before_ms,
        })
    }

    fn interactive_figures(&self) -> Value {
        let i = &self.inter;
        json!({
            "stdin_echo_p50_ms": p50(&i.echo),
            "stdin_echo_p90_ms": pct(&i.echo, 90.0),
            "stdin_echo_missing": i.missing,
            "docker_exec_i_session_p50_ms": p50(&i.exec_session),
            "docker_exec_i_session_p90_ms": pct(&i.exec_session, 90.0),
            "docker_exec_i_once_p50_ms": p50(&i.exec_once),
            "docker_exec_i_once_p90_ms": pct(&i.exec_once, 90.0),
            "yield_overhead_ms": i.yield_overhead_ms,
            "yield_100ms_answer_p50_ms": p50(&i.yielded_after),
        })
    }

    fn pool_figures(&self) -> Value {
        let pool = &self.pool;
        json!({
            "new_run_first_command_p50_ms": p50(&pool.first_command),
            "new_run_first_command_p90_ms": pct(&pool.first_command, 90.0),
            "new_run_first_command_nopool_p50_ms": p50(&pool.first_command_nopool),
            "new_run_first_command_nopool_p90_ms": pct(&pool.first_command_nopool, 90.0),
            "pool_second_command_p50_ms": p50(&pool.second_command),
            "pool_refill_p50_ms": p50(&pool.refill),
            "pool_idle_container_mib": pool.idle_container_mib,
            "pool_first_commands_not_adopted": pool.not_adopted,
        })
    }
}
