//! Pure judgement of an op's liveness from a marker probe snapshot.

use crate::opfiles::PidRecord;
use crate::shim::MarkedProcess;

/// What a probe snapshot says about one op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpLiveness {
    /// The recorded wrapper pid is alive with the op's marker and the recorded start time.
    pub wrapper_alive: bool,
    /// The recorded pid is alive but is not the op's wrapper (reused pid).
    pub pid_reused: bool,
    /// Processes (wrapper excluded) that carry the op's marker and started
    /// no earlier than the wrapper.
    pub remaining: usize,
}

impl OpLiveness {
    /// True when anything of the op still runs.
    pub fn any_alive(&self) -> bool {
        self.wrapper_alive || self.remaining > 0
    }
}

/// One probe of a container, indexed once so that each op's identity check
/// is O(1). The only definition of "this pid is the op's wrapper".
#[derive(Debug, Default)]
pub struct Snapshot {
    by_pid: std::collections::HashMap<u32, MarkedProcess>,
    per_op: std::collections::HashMap<String, Vec<u64>>,
}

impl Snapshot {
    /// Indexes one probe listing.
    pub fn new(procs: Vec<MarkedProcess>) -> Snapshot {
        let mut per_op: std::collections::HashMap<String, Vec<u64>> =
            std::collections::HashMap::new();
        for p in &procs {
            per_op
                .entry(p.op_id.clone())
                .or_default()
                .push(p.start_ticks);
        }
        let by_pid = procs.into_iter().map(|p| (p.pid, p)).collect();
        Snapshot { by_pid, per_op }
    }

    /// The identity check of an op's wrapper: its recorded pid carries the
    /// op's marker and the recorded start time. `None` when the pid is
    /// absent; `Some(false)` when it belongs to another process.
    pub fn shim(&self, op_id: &str, rec: &PidRecord) -> Option<bool> {
        self.by_pid
            .get(&rec.pid)
            .map(|p| p.op_id == op_id && p.start_ticks == rec.start_ticks)
    }

    /// Whether any process carries the op's marker.
    pub fn has_op(&self, op_id: &str) -> bool {
        self.per_op.contains_key(op_id)
    }

    /// The op's liveness: its wrapper, and the rest of its tree (processes
    /// with its marker that started no earlier than the wrapper).
    pub fn liveness(&self, op_id: &str, rec: &PidRecord) -> OpLiveness {
        let wrapper = self.shim(op_id, rec);
        let marked_since = self.per_op.get(op_id).map_or(0, |starts| {
            starts.iter().filter(|&&s| s >= rec.start_ticks).count()
        });
        let wrapper_alive = wrapper == Some(true);
        OpLiveness {
            wrapper_alive,
            pid_reused: wrapper == Some(false),
            remaining: marked_since - usize::from(wrapper_alive),
        }
    }
}

/// The op's liveness in one probe listing (see [`Snapshot::liveness`]).
pub fn op_liveness(procs: &[MarkedProcess], op_id: &str, record: &PidRecord) -> OpLiveness {
    Snapshot::new(procs.to_vec()).liveness(op_id, record)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(pid: u32, start: u64, op: &str) -> MarkedProcess {
        MarkedProcess {
            pid,
            start_ticks: start,
            op_id: op.to_owned(),
        }
    }

    const REC: PidRecord = PidRecord {
        pid: 10,
        start_ticks: 500,
        hostname: String::new(),
    };

    #[test]
    fn wrapper_identity_needs_pid_start_and_marker() {
        let live = op_liveness(&[proc(10, 500, "a"), proc(11, 501, "a")], "a", &REC);
        assert_eq!(
            live,
            OpLiveness {
                wrapper_alive: true,
                pid_reused: false,
                remaining: 1
            }
        );
        let reused = op_liveness(&[proc(10, 900, "a")], "a", &REC);
        assert!(!reused.wrapper_alive && reused.pid_reused);
        let other_op = op_liveness(&[proc(10, 500, "b")], "a", &REC);
        assert!(!other_op.wrapper_alive && other_op.pid_reused);
        assert!(!op_liveness(&[], "a", &REC).any_alive());
    }

    #[test]
    fn processes_older_than_the_wrapper_are_not_the_ops() {
        let live = op_liveness(&[proc(7, 100, "a")], "a", &REC);
        assert_eq!(live.remaining, 0);
    }
}

#[cfg(test)]
mod snapshot_tests {
    use super::*;

    fn proc(pid: u32, start: u64, op: &str) -> MarkedProcess {
        MarkedProcess {
            pid,
            start_ticks: start,
            op_id: op.to_owned(),
        }
    }

    #[test]
    fn snapshot_checks_identity_by_pid_marker_and_start() {
        let snap = Snapshot::new(vec![
            proc(10, 500, "a"),
            proc(11, 501, "a"),
            proc(12, 9, "b"),
        ]);
        let rec = |pid, start| PidRecord {
            pid,
            start_ticks: start,
            hostname: String::new(),
        };
        assert_eq!(snap.shim("a", &rec(10, 500)), Some(true));
        assert_eq!(
            snap.shim("a", &rec(10, 499)),
            Some(false),
            "start time differs"
        );
        assert_eq!(
            snap.shim("a", &rec(12, 9)),
            Some(false),
            "another op's process"
        );
        assert_eq!(snap.shim("a", &rec(13, 500)), None);
        assert!(snap.has_op("b") && !snap.has_op("c"));
        assert_eq!(snap.liveness("a", &rec(10, 500)).remaining, 1);
    }
}
