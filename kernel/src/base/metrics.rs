//! The kernel's Prometheus metrics (SPEC §23), in the text exposition
//! format (0.0.4) of the `prometheus` crate, every name prefixed
//! `opkernel_`. Counters and histograms count what this process saw since
//! it started (Prometheus's `rate()` absorbs a restart); the levels (live
//! ops, pending deliveries, containers) are read from the control plane and
//! Docker at each scrape, so they are right after any crash.

use std::collections::BTreeMap;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::lifecycle::Status;

/// Latency buckets, in seconds: 1 ms to about 2 minutes.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
];

/// Store transaction buckets, in seconds: 100 µs to 5 s.
const STORE_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
];

/// The levels read at each scrape.
#[derive(Debug, Default, Clone)]
pub struct Levels {
    /// Ops not yet terminal (pending, awaiting approval, starting, running).
    pub live_ops: i64,
    /// Resolved background ops not yet delivered in a report.
    pub reports_pending: i64,
    /// Webhook posts the receiver has not taken yet.
    pub webhook_pending: i64,
    /// Managed containers by Docker state (`running`, `exited`, …).
    pub containers: BTreeMap<String, i64>,
    /// Warm-pool containers by role (`free`, `adopting`, `bound`, …).
    pub pool: BTreeMap<String, i64>,
    /// A cluster's nodes: milliseconds since each renewed its lease (the
    /// database's clock); empty for a single kernel.
    pub node_lease_age_ms: BTreeMap<String, i64>,
}

/// One kernel process's metrics.
pub struct Metrics {
    registry: Registry,
    ops: IntCounterVec,
    op_starts: IntCounter,
    op_start_seconds: Histogram,
    op_report_seconds: Histogram,
    store_transaction_seconds: HistogramVec,
    store_commits: IntCounter,
    live_ops: IntGauge,
    reports_pending: IntGauge,
    webhook_pending: IntGauge,
    containers: IntGaugeVec,
    pool_containers: IntGaugeVec,
    node_lease_age: prometheus::GaugeVec,
    egress_connections: IntCounterVec,
    egress_bytes: IntCounterVec,
    /// One render at a time: the levels are set, then gathered.
    rendering: crate::base::sync::Lock<()>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> HistogramOpts {
    HistogramOpts::new(name, help).buckets(buckets.to_vec())
}

/// A counter with one label.
fn counter_vec(name: &str, help: &str, label: &str) -> IntCounterVec {
    built(IntCounterVec::new(Opts::new(name, help), &[label]))
}

/// A counter.
fn counter(name: &str, help: &str) -> IntCounter {
    built(IntCounter::new(name, help))
}

/// A gauge by `state`.
fn gauge_vec(name: &str, help: &str) -> IntGaugeVec {
    built(IntGaugeVec::new(Opts::new(name, help), &["state"]))
}

/// Names and label sets are constants: building them cannot fail.
fn built<T>(made: prometheus::Result<T>) -> T {
    match made {
        Ok(v) => v,
        Err(e) => unreachable!("a constant metric definition was refused: {e}"),
    }
}

impl Metrics {
    /// Every metric, registered, at zero; one series per terminal status.
    pub fn new() -> Metrics {
        let registry = built(Registry::new_custom(Some("opkernel".into()), None));
        let m = Metrics {
            ops: counter_vec(
                "ops_total",
                "Ops that reached a terminal status, by status.",
                "status",
            ),
            op_starts: counter(
                "op_starts_total",
                "Ops admitted (run_command accepted, schedules fired).",
            ),
            op_start_seconds: built(Histogram::with_opts(histogram(
                "op_start_seconds",
                "From an op's request to its command running (approval waits excluded).",
                BUCKETS,
            ))),
            op_report_seconds: built(Histogram::with_opts(histogram(
                "op_report_seconds",
                "From a background op's end to the report that delivered it.",
                BUCKETS,
            ))),
            store_transaction_seconds: built(HistogramVec::new(
                histogram(
                    "store_transaction_seconds",
                    "Control-plane transactions, by kind (read, write), commit included.",
                    STORE_BUCKETS,
                ),
                &["kind"],
            )),
            store_commits: counter(
                "store_commits_total",
                "Commits of control-plane writes (SQLite commits waiting writes together).",
            ),
            live_ops: built(IntGauge::new("live_ops", "Ops not yet terminal.")),
            reports_pending: built(IntGauge::new(
                "reports_pending",
                "Resolved background ops waiting to be delivered in a report.",
            )),
            webhook_pending: built(IntGauge::new(
                "webhook_posts_pending",
                "Webhook posts in the outbox, not yet taken by the receiver.",
            )),
            containers: gauge_vec("containers", "Managed run containers, by Docker state."),
            pool_containers: gauge_vec(
                "pool_containers",
                "Warm-pool containers, by role (free, making, adopting, bound, unconfirmed, stray).",
            ),
            node_lease_age: built(prometheus::GaugeVec::new(
                Opts::new(
                    "node_lease_age_seconds",
                    "Seconds since each cluster node renewed its lease (the database's clock).",
                ),
                &["node"],
            )),
            egress_connections: counter_vec(
                "egress_connections_total",
                "Connections to the egress proxy, by outcome (allowed, denied, failed: allowed but unreachable).",
                "outcome",
            ),
            egress_bytes: counter_vec(
                "egress_bytes_total",
                "Bytes through the egress proxy, by direction (in: to the container).",
                "direction",
            ),
            registry,
            rendering: crate::base::sync::Lock::new(()),
        };
        m.register();
        m.zero_series();
        m
    }

    /// The labelled series known in advance, shown at zero from the start.
    fn zero_series(&self) {
        for status in Status::TERMINAL {
            self.ops.with_label_values(&[status.as_str()]);
        }
        for kind in ["read", "write"] {
            self.store_transaction_seconds.with_label_values(&[kind]);
        }
        for outcome in ["allowed", "denied", "failed"] {
            self.egress_connections.with_label_values(&[outcome]);
        }
        for direction in ["in", "out"] {
            self.egress_bytes.with_label_values(&[direction]);
        }
    }

    fn register(&self) {
        let all: [Box<dyn prometheus::core::Collector>; 14] = [
            Box::new(self.ops.clone()),
            Box::new(self.op_starts.clone()),
            Box::new(self.op_start_seconds.clone()),
            Box::new(self.op_report_seconds.clone()),
            Box::new(self.store_transaction_seconds.clone()),
            Box::new(self.store_commits.clone()),
            Box::new(self.live_ops.clone()),
            Box::new(self.reports_pending.clone()),
            Box::new(self.webhook_pending.clone()),
            Box::new(self.containers.clone()),
            Box::new(self.pool_containers.clone()),
            Box::new(self.node_lease_age.clone()),
            Box::new(self.egress_connections.clone()),
            Box::new(self.egress_bytes.clone()),
        ];
        for c in all {
            built(self.registry.register(c));
        }
    }

    /// An op reached `status` (counted once: by the write that won).
    pub fn op_settled(&self, status: Status) {
        self.ops.with_label_values(&[status.as_str()]).inc();
    }

    /// An op was admitted.
    pub fn op_admitted(&self) {
        self.op_starts.inc();
    }

    /// An op's command started `waited_ms` after its request.
    pub fn op_running(&self, waited_ms: i64) {
        self.op_start_seconds.observe(seconds(waited_ms));
    }

    /// A background op was delivered `waited_ms` after it ended.
    pub fn op_reported(&self, waited_ms: i64) {
        self.op_report_seconds.observe(seconds(waited_ms));
    }

    /// A connection to the egress proxy was judged `outcome`: `allowed`,
    /// `denied` (by a run's policy), `failed` (the target did not answer),
    /// `invalid` (not a proxy request), `unknown` (from no run's
    /// container), `busy` (over the connection limits).
    pub fn egress(&self, outcome: &str) {
        self.egress_connections.with_label_values(&[outcome]).inc();
    }

    /// Bytes moved through the egress proxy: in (to containers), out.
    pub fn egress_bytes(&self, bytes_in: u64, bytes_out: u64) {
        if bytes_in > 0 {
            self.egress_bytes
                .with_label_values(&["in"])
                .inc_by(bytes_in);
        }
        if bytes_out > 0 {
            self.egress_bytes
                .with_label_values(&["out"])
                .inc_by(bytes_out);
        }
    }

    /// A control-plane transaction took `secs`, commit included.
    pub fn transaction(&self, read_only: bool, secs: f64) {
        let kind = if read_only { "read" } else { "write" };
        self.store_transaction_seconds
            .with_label_values(&[kind])
            .observe(secs);
    }

    /// A write (on SQLite a batch of waiting writes) was committed.
    pub fn committed(&self) {
        self.store_commits.inc();
    }

    /// The text exposition of every metric, with `levels` as the gauges.
    pub fn render(&self, levels: &Levels) -> String {
        let _one = self.rendering.lock();
        self.live_ops.set(levels.live_ops);
        self.reports_pending.set(levels.reports_pending);
        self.webhook_pending.set(levels.webhook_pending);
        // a state no container is in any more leaves the exposition
        self.containers.reset();
        for state in ["running", "exited", "created", "paused"] {
            self.containers.with_label_values(&[state]).set(0);
        }
        for (state, n) in &levels.containers {
            self.containers.with_label_values(&[state.as_str()]).set(*n);
        }
        self.pool_containers.reset();
        for state in ["free", "bound"] {
            self.pool_containers.with_label_values(&[state]).set(0);
        }
        for (state, n) in &levels.pool {
            self.pool_containers
                .with_label_values(&[state.as_str()])
                .set(*n);
        }
        self.node_lease_age.reset();
        for (node, age) in &levels.node_lease_age_ms {
            self.node_lease_age
                .with_label_values(&[node.as_str()])
                .set(seconds(*age));
        }
        match TextEncoder::new().encode_to_string(&self.registry.gather()) {
            Ok(text) => text,
            Err(e) => format!("# the metrics could not be encoded: {e}\n"),
        }
    }
}

fn seconds(ms: i64) -> f64 {
    ms.max(0) as f64 / 1000.0
}

/// The exposition's content type (text format 0.0.4).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_metric_with_help_and_type() {
        let m = Metrics::new();
        m.op_settled(Status::Completed);
        m.op_settled(Status::Completed);
        m.op_running(12);
        m.transaction(false, 0.002);
        m.committed();
        let mut levels = Levels {
            live_ops: 3,
            reports_pending: 1,
            ..Levels::default()
        };
        levels.containers.insert("running".into(), 2);
        levels.node_lease_age_ms.insert("n1".into(), 1500);
        let text = m.render(&levels);
        for name in [
            "opkernel_ops_total",
            "opkernel_op_starts_total",
            "opkernel_op_start_seconds",
            "opkernel_op_report_seconds",
            "opkernel_store_transaction_seconds",
            "opkernel_store_commits_total",
            "opkernel_live_ops",
            "opkernel_reports_pending",
            "opkernel_webhook_posts_pending",
            "opkernel_containers",
            "opkernel_node_lease_age_seconds",
        ] {
            assert!(text.contains(&format!("# HELP {name} ")), "{name}: {text}");
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}");
        }
        assert!(text.contains("opkernel_ops_total{status=\"completed\"} 2"));
        assert!(text.contains("opkernel_ops_total{status=\"lost\"} 0"));
        assert!(text.contains("opkernel_live_ops 3"));
        assert!(text.contains("opkernel_containers{state=\"running\"} 2"));
        assert!(text.contains("opkernel_node_lease_age_seconds{node=\"n1\"} 1.5"));
        assert!(text.contains("opkernel_containers{state=\"exited\"} 0"));
        assert!(text.contains("opkernel_op_start_seconds_count 1"));
        assert!(text.contains("opkernel_store_transaction_seconds_count{kind=\"write\"} 1"));
        assert!(text.contains("opkernel_store_commits_total 1"));
    }
}
