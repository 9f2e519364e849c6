//! Pure judgement of an op's liveness from a marker probe snapshot.

use crate::opfiles::PidRecord;
use crate::wrapper::MarkedProcess;

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

pub fn op_liveness(procs: &[MarkedProcess], op_id: &str, record: &PidRecord) -> OpLiveness {
    let mut live = OpLiveness {
        wrapper_alive: false,
        pid_reused: false,
        remaining: 0,
    };
    for p in procs {
        if p.pid == record.pid {
            if p.op_id == op_id && p.start_ticks == record.start_ticks {
                live.wrapper_alive = true;
            } else {
                live.pid_reused = true;
            }
        } else if p.op_id == op_id && p.start_ticks >= record.start_ticks {
            live.remaining += 1;
        }
    }
    live
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
