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
/// Every how many flushes the firewall rules are checked again.
const RECHECK_EVERY: u64 = 5;
/// How often one refused host of one run is recorded.
const DENIAL_EVERY: Duration = Duration::from_secs(60);

/// Connections, bytes in (to the container), bytes out.
type Counts = (u64, u64, u64);

/// At most this many `net.denied` events per run and minute, whatever
/// the hosts (a command naming a new host each time is one run's noise).
const DENIALS_PER_RUN: u32 = 30;
/// At most this many (run, host) pairs remembered.
const MAX_REMEMBERED: usize = 10_000;

#[derive(Default)]
pub(super) struct Tally {
    counts: Lock<HashMap<String, Counts>>,
    denials: Lock<Denials>,
}

/// When each refused (run, host) was last recorded, and each run's
/// records in its current minute.
#[derive(Default)]
struct Denials {
    at: HashMap<(String, String), Instant>,
    per_run: HashMap<String, (Instant, u32)>,
}

impl Tally {
    /// One allowed connection of `run` was made.
    pub(super) fn connection(&self, run: &str) {
        self.add(run, (1, 0, 0));
    }

    /// Bytes moved on an allowed connection of `run`, as they go.
    pub(super) fn bytes(&self, run: &str, bytes_in: u64, bytes_out: u64) {
        self.add(run, (0, bytes_in, bytes_out));
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

    /// Whether a refusal of `host` for `run` is recorded now: not within
    /// the last minute already, not past the run's [`DENIALS_PER_RUN`]
    /// this minute, and never past [`MAX_REMEMBERED`] pairs.
    pub(super) fn record_denial(&self, run: &str, host: &str) -> bool {
        let mut d = self.denials.lock();
        let now = Instant::now();
        let fresh = |at: &Instant| now.duration_since(*at) < DENIAL_EVERY;
        if d.at.len() >= MAX_REMEMBERED {
            d.at.retain(|_, at| fresh(at));
            d.per_run.retain(|_, (at, _)| fresh(at));
        }
        let key = (run.to_owned(), host.to_owned());
        if d.at.get(&key).is_some_and(fresh) || d.at.len() >= MAX_REMEMBERED {
            return false;
        }
        let minute = d.per_run.entry(run.to_owned()).or_insert((now, 0));
        if !fresh(&minute.0) {
            *minute = (now, 0);
        }
        if minute.1 >= DENIALS_PER_RUN {
            return false;
        }
        minute.1 += 1;
        d.at.insert(key, now);
        true
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
    for round in 0u64.. {
        tokio::time::sleep(FLUSH).await;
        let Some(k) = k.upgrade() else {
            return;
        };
        if round % RECHECK_EVERY == 0 {
            recheck_firewall(&k).await;
        }
        for (run, (c, i, o)) in k.egress.tally.take() {
            if let Err(e) = k.store.record_net_usage(&run, c, i, o).await {
                tracing::warn!(%run, %e, "egress usage not recorded yet; kept for the next round");
                k.egress.tally.add(&run, (c, i, o));
            }
        }
    }
}

/// Puts the firewall rules back when something (a firewall reload, an
/// `iptables -F`) removed them; stops the proxy whose network was removed
/// (Docker removes none with containers on it), to be made again by the
/// next allow-list container.
async fn recheck_firewall(k: &Kernel) {
    let Some(active) = k.egress.current() else {
        return;
    };
    if let Err(sandbox::SandboxError::NotFound(_)) = k.backend.network_peers(&active.net.name).await
    {
        tracing::warn!(network = %active.net.name, "the egress network was removed: the proxy stops until the next allow-list container");
        k.egress.reset();
        return;
    }
    let checked =
        tokio::task::spawn_blocking(move || super::firewall::confine(&active.net, active.port))
            .await;
    match checked {
        Ok(Ok(true)) => tracing::warn!("the egress firewall rules were missing: put back"),
        Ok(Ok(false)) => {}
        Ok(Err(e)) => tracing::error!(%e, "the egress firewall rules could not be checked"),
        Err(e) => tracing::error!(%e, "the egress firewall check failed"),
    }
}
