//! What the proxy counts per run: its allowed connections and their bytes
//! (recorded in the run's usage ledger every few seconds, as one fact per
//! run), and when each refused host was last recorded (a `net.denied`
//! event at most once a minute per run and host).

use std::collections::HashMap;
use std::sync::Weak;
use std::time::{Duration, Instant};

use crate::base::sync::Lock;
use crate::runtime::kernel::Kernel;

/// How often counted connections are recorded.
const FLUSH: Duration = Duration::from_secs(2);
/// How often one refused host of one run is recorded.
const DENIAL_EVERY: Duration = Duration::from_secs(60);

/// Connections, bytes in (to the container), bytes out.
type Counts = (u64, u64, u64);

#[derive(Default)]
pub(super) struct Tally {
    counts: Lock<HashMap<String, Counts>>,
    denied_at: Lock<HashMap<(String, String), Instant>>,
}

impl Tally {
    /// One allowed connection of `run` ended, having moved these bytes.
    pub(super) fn connection(&self, run: &str, bytes_in: u64, bytes_out: u64) {
        self.add(run, (1, bytes_in, bytes_out));
    }

    fn add(&self, run: &str, (c, i, o): Counts) {
        let mut counts = self.counts.lock();
        let e = counts.entry(run.to_owned()).or_default();
        *e = (e.0 + c, e.1.saturating_add(i), e.2.saturating_add(o));
    }

    /// Counted for `run` and not yet recorded.
    pub(super) fn pending(&self, run: &str) -> Counts {
        self.counts.lock().get(run).copied().unwrap_or_default()
    }

    /// Whether a refusal of `host` for `run` is recorded now (not within
    /// the last minute already).
    pub(super) fn record_denial(&self, run: &str, host: &str) -> bool {
        let mut seen = self.denied_at.lock();
        let now = Instant::now();
        if seen.len() > 10_000 {
            seen.retain(|_, at| now.duration_since(*at) < DENIAL_EVERY);
        }
        let key = (run.to_owned(), host.to_owned());
        match seen.get(&key) {
            Some(at) if now.duration_since(*at) < DENIAL_EVERY => false,
            _ => {
                seen.insert(key, now);
                true
            }
        }
    }

    fn take(&self) -> Vec<(String, Counts)> {
        std::mem::take(&mut *self.counts.lock())
            .into_iter()
            .collect()
    }
}

/// Records what was counted, every [`FLUSH`], while the kernel lives; a
/// fact the store refused is counted again for the next round.
pub(super) async fn flush_loop(k: Weak<Kernel>) {
    loop {
        tokio::time::sleep(FLUSH).await;
        let Some(k) = k.upgrade() else {
            return;
        };
        for (run, (c, i, o)) in k.egress.tally.take() {
            if let Err(e) = k.store.record_net_usage(&run, c, i, o).await {
                tracing::warn!(%run, %e, "egress usage not recorded yet; kept for the next round");
                k.egress.tally.add(&run, (c, i, o));
            }
        }
    }
}
