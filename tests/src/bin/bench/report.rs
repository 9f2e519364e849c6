//! The full run's readable table (the JSON line holds the same figures).

use serde_json::Value;

use crate::full::Run;
use crate::row;

impl Run {
    /// Prints the latency table and one line per other measurement.
    pub fn print(&self, figures: &Value) {
        println!(
            "{:<28} {:>9} {:>9} {:>9} {:>6}",
            "latency (ms)", "p50", "p90", "p99", "n"
        );
        let lat = &self.lat;
        row("start reply (kernel)", &lat.start);
        row("running (kernel)", &lat.running);
        row("running (bare API exec)", &lat.api);
        row("running (docker exec -d)", &lat.cli);
        row("first output (in the log)", &lat.first_output);
        row("notify (exit -> report)", &self.notify);
        row("new run, 1st cmd (pool)", &self.pool.first_command);
        row(
            "new run, 1st cmd (no pool)",
            &self.pool.first_command_nopool,
        );
        row("same run, 2nd cmd (pool)", &self.pool.second_command);
        row("pool refill", &self.pool.refill);
        row("stdin write -> echo", &self.inter.echo);
        row("docker exec -i (kept)", &self.inter.exec_session);
        row("docker exec -i (per line)", &self.inter.exec_once);
        row("yield_ms 100: answer", &self.inter.yielded_after);
        let f = |name: &str| figures[name].as_f64().unwrap_or(f64::NAN);
        println!(
            "ratios: start/cli {:.3}  running/api {:.3}  running/cli {:.3}",
            f("start_ratio_vs_cli"),
            f("running_ratio_vs_api"),
            f("running_ratio_vs_cli")
        );
        println!(
            "shim overhead per op inside the container: {:.2} ms; ops that fell back to docker exec: {}",
            lat.shim_overhead_ms,
            self.fallbacks.iter().sum::<usize>()
        );
        let cpu = &self.cpu;
        let per_op = |n: f64| n / cpu.ops as f64;
        let pg = cpu.commits_per_op().map_or(String::new(), |c| {
            format!(" (PostgreSQL: {c:.2} transactions committed per op, reads included)")
        });
        println!(
            "kernel CPU: {:.3} ms per op ({} `true` ops over {} runs, start to acked report, in {:.1} s); \
             {:.2} store writes and {:.2} commits of them per op{pg}",
            cpu.ms_per_op(),
            cpu.ops,
            cpu.runs,
            cpu.wall_sec,
            per_op(cpu.transactions.1),
            per_op(cpu.transactions.2),
        );
        if let Some(c) = &self.cost {
            let statements = c
                .statements_per_op
                .map_or("n/a (pg_stat_statements not loaded)".to_owned(), |s| {
                    format!("{s:.1}")
                });
            println!(
                "store: {} background ops, start to acked report: {statements} statements and {:.1} commits per op",
                c.ops, c.commits_per_op
            );
        }
        println!(
            "warm pool: an idle pool container holds {:.1} MiB; first commands not in a pool container: {}",
            self.pool.idle_container_mib, self.pool.not_adopted
        );
        println!(
            "yield_ms on a command that ends in time: {:+.2} ms at p50",
            self.inter.yield_overhead_ms
        );
        self.print_scale();
        self.files.print();
        self.egress.print();
        if self.notify_missing > 0 {
            println!(
                "notify: {} of {} ops never came back in a report",
                self.notify_missing, self.notify_samples
            );
        }
    }

    fn print_scale(&self) {
        let (conc, rec, abuse) = (&self.conc, &self.rec, &self.abuse);
        println!(
            "launchers ({} containers) while the ops wait: CPU at most {:.2}% of a core, RSS at most {} KiB",
            conc.launchers, conc.launcher_cpu_pct_max, conc.launcher_rss_kb_max
        );
        for c in self.conc_small.iter().map(|(c, _)| c).chain([conc]) {
            println!(
                "concurrent: {} ops in {} runs started in {:.1}s; lost {}, duplicated {}; kernel CPU while they wait {:.2}% of a core; peak RSS {:.1} MB",
                c.ops, c.runs, c.start_sec, c.lost, c.duplicated, c.cpu_pct_idle, c.peak_rss_mb
            );
        }
        println!(
            "recovery: {} running ops over {} containers re-attached {:.2}s after SIGKILL + restart; {} delivered afterwards; lost {}, duplicated {}, executed twice {}",
            rec.ops, rec.containers, rec.seconds, rec.delivered, rec.lost, rec.duplicated, rec.executed_twice
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
    }
}
