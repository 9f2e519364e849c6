//! This kernel as a cluster node (SPEC §20): its settings and the epoch it
//! holds now, which fences every exec claim it makes.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use super::Kernel;
use crate::runtime::config::NodeConfig;

/// A node's identity in the cluster.
#[derive(Debug)]
pub struct NodeState {
    /// Its settings (name, advertised URL, lease TTL).
    pub config: NodeConfig,
    /// The epoch of its current membership (0 until it joined, and while
    /// it knows itself fenced: no claim can match 0).
    epoch: AtomicI64,
    /// Until when its lease surely holds, by this host's monotonic clock:
    /// the start of the last successful renewal (or join) plus the TTL.
    held_until: crate::base::sync::Lock<Option<Instant>>,
    /// Since when it has held its lease without a break (no failed
    /// renewal, no rejoin): it sweeps others only after a full TTL of it.
    held_since: crate::base::sync::Lock<Option<Instant>>,
    /// How many times it joined (each join: a new epoch).
    joins: std::sync::atomic::AtomicU64,
    /// Stoppers of the processes of the ops it lost while it was away
    /// under way (SPEC §24): it starts nothing until none is.
    stopping: std::sync::atomic::AtomicU64,
    /// The lost ops it stopped on its return (their late result says so).
    stopped: crate::base::sync::Lock<std::collections::HashSet<String>>,
}

impl NodeState {
    /// A node not yet joined.
    pub fn new(config: NodeConfig) -> NodeState {
        NodeState {
            config,
            epoch: AtomicI64::new(0),
            held_until: Default::default(),
            held_since: Default::default(),
            joins: Default::default(),
            stopping: Default::default(),
            stopped: Default::default(),
        }
    }

    /// A stop of the lost ops' processes begins: nothing starts until it
    /// (and every other one under way) ends.
    pub fn begin_stopping(&self) {
        self.stopping.fetch_add(1, Ordering::SeqCst);
    }

    /// A stop of the lost ops' processes ended.
    pub fn end_stopping(&self) {
        self.stopping.fetch_sub(1, Ordering::SeqCst);
    }

    /// Notes a lost op whose processes it stopped on its return.
    pub fn note_stopped(&self, op_id: &str) {
        self.stopped.lock().insert(op_id.to_owned());
    }

    /// Whether it stopped this lost op on its return.
    pub fn stopped(&self, op_id: &str) -> bool {
        self.stopped.lock().contains(op_id)
    }

    /// Forgets the note once the op's late result is recorded.
    pub fn forget_stopped(&self, op_id: &str) {
        self.stopped.lock().remove(op_id);
    }

    /// A join landed.
    pub fn joined(&self) {
        self.joins.fetch_add(1, Ordering::SeqCst);
    }

    /// How many joins landed so far.
    pub fn joins(&self) -> u64 {
        self.joins.load(Ordering::SeqCst)
    }

    /// A join or renewal asked at `asked` succeeded: the lease holds until
    /// `asked` + TTL at least.
    pub fn renewed(&self, asked: Instant) {
        *self.held_until.lock() = Some(asked + self.config.ttl);
        self.held_since.lock().get_or_insert(asked);
    }

    /// A renewal failed or the node rejoined: the unbroken hold ends.
    pub fn broken(&self) {
        *self.held_since.lock() = None;
    }

    /// Whether the lease surely still holds for another fifth of the TTL
    /// (a command is started only then: the sweep of a lapsed node must
    /// never meet a command it did not know of).
    pub fn lease_fresh(&self) -> bool {
        let margin = self.config.renew_every();
        self.held_until
            .lock()
            .is_some_and(|until| Instant::now() + margin < until)
    }

    /// Whether it has held its lease without a break for a full TTL: only
    /// then does it judge other nodes' leases (after a store outage every
    /// node rejoins first, and none is swept for the outage).
    pub fn may_sweep(&self) -> bool {
        self.epoch() != 0
            && self.lease_fresh()
            && self
                .held_since
                .lock()
                .is_some_and(|since| since.elapsed() >= self.config.judge_hold())
    }

    /// The epoch it holds (0: none).
    pub fn epoch(&self) -> i64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Records the epoch of a join; 0 when the lease is found lapsed (no
    /// claim is tried until the next join).
    pub fn set_epoch(&self, epoch: i64) {
        self.epoch.store(epoch, Ordering::SeqCst)
    }
}

impl Kernel {
    /// The fence of this kernel's exec claims: its node and epoch (`None`
    /// for a single kernel).
    pub fn fence(&self) -> Option<(String, i64)> {
        self.node
            .as_ref()
            .map(|n| (n.config.name.clone(), n.epoch()))
    }

    /// Whether this kernel may start a command now: always for a single
    /// kernel; a node only while its lease surely holds (see
    /// [`NodeState::lease_fresh`]) and the ops it lost are stopped.
    pub fn may_start(&self) -> bool {
        self.node.as_ref().is_none_or(|n| {
            n.epoch() != 0 && n.lease_fresh() && n.stopping.load(Ordering::SeqCst) == 0
        })
    }

    /// Whether an op placed on `node` is this kernel's to run (always, for
    /// a single kernel).
    pub fn runs_here(&self, node: Option<&str>) -> bool {
        match (&self.node, node) {
            (Some(me), Some(node)) => me.config.name == node,
            (Some(_), None) => false,
            (None, _) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn node() -> NodeState {
        NodeState::new(
            NodeConfig::new("n1", "http://n1:7700", std::time::Duration::from_secs(2)).unwrap(),
        )
    }

    #[test]
    fn a_lease_is_fresh_only_with_a_fifth_of_it_to_spare() {
        let n = node();
        assert!(!n.lease_fresh(), "not joined: nothing is held");
        n.renewed(Instant::now());
        assert!(n.lease_fresh());
        // asked 1.7 s ago with a 2 s lease: 0.3 s left, less than a fifth
        n.renewed(Instant::now() - Duration::from_millis(1700));
        assert!(
            !n.lease_fresh(),
            "too close to the lapse to start a command"
        );
    }

    #[test]
    fn a_node_sweeps_only_after_holding_its_lease_a_whole_ttl() {
        let n = node();
        let long_ago = Instant::now() - Duration::from_secs(3);
        n.renewed(long_ago);
        n.renewed(Instant::now());
        assert!(!n.may_sweep(), "no epoch: not joined, or fenced");
        n.set_epoch(4);
        assert!(n.may_sweep(), "held without a break since 3 s ago");
        // a failed renewal (a store outage) breaks the hold: a fresh
        // renewal does not make it a judge again before a whole TTL
        n.broken();
        n.renewed(Instant::now());
        assert!(!n.may_sweep());
        assert!(n.lease_fresh());
    }

    #[test]
    fn a_judge_also_waits_out_the_others_reconnecting() {
        // a store whose connections take up to 1 s to open: the hold is
        // 2 s + 2 × 1 s + 0.4 s, so 3 s of it is not enough
        let mut config = NodeConfig::new("n1", "http://n1:7700", Duration::from_secs(2)).unwrap();
        config.store_open = Duration::from_secs(1);
        let n = NodeState::new(config);
        n.set_epoch(1);
        n.renewed(Instant::now() - Duration::from_secs(3));
        n.renewed(Instant::now());
        assert!(!n.may_sweep(), "held 3 s of the 4.4 s a judge needs");
        let m = node();
        m.set_epoch(1);
        m.renewed(Instant::now() - Duration::from_secs(3));
        m.renewed(Instant::now());
        assert!(m.may_sweep(), "with SQLite's instant opens 2.4 s is enough");
    }
}
