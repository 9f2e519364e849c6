//! An op's process tree, as `/proc` shows it: which processes are the op's,
//! the identity-checked signal shared by the signaller and the launcher,
//! and the stop of what a command left behind when it exited.
//!
//! A process is the op's when it carries the op's marker and started no
//! earlier than the launcher, or when its parent chain leads to the
//! launcher (a child subreaper: orphans of the command are re-parented to
//! it, so this catches processes that cleared their environment). Before
//! each signal a pidfd is opened and the process is judged again through
//! fresh reads, so the signal reaches that very process or none.

use std::collections::{HashMap, HashSet};
use std::io;
use std::time::{Duration, Instant};

use opkernel_shim::procfs::{environ_marker, stat_start_ticks};
use opkernel_shim::{MarkedProcess, Signal};

use crate::sys;

/// How long processes the command left behind have after TERM before KILL.
pub const LEFTOVER_GRACE: Duration = Duration::from_secs(2);
/// How often the grace checks whether the leftovers are gone.
const GRACE_POLL: Duration = Duration::from_millis(20);
/// KILL rounds (one `/proc` pass each) for a tree that keeps forking.
const KILL_ROUNDS: usize = 100;
/// How long the killed tree has to be reaped before `.code` is written
/// anyway (a process stuck in the kernel must not hold the result).
const REAP_AFTER_KILL: Duration = Duration::from_secs(5);
/// Longest parent chain followed (a guard against a cycle read mid-change).
const MAX_DEPTH: usize = 4096;

/// Every pid in `/proc`, ascending.
pub fn pids() -> io::Result<Vec<u32>> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

/// The marked identity of a live process; `None` for unmarked processes and
/// for processes gone mid-read.
pub fn marked(pid: u32) -> Option<MarkedProcess> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let op_id = environ_marker(&environ)?.to_owned();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(MarkedProcess {
        pid,
        start_ticks: stat_start_ticks(&stat)?,
        op_id,
    })
}

/// Sends `signal` to `pid` if `ours` (asked after a pidfd on it is open)
/// says it is the one meant. Whether the signal was sent.
pub fn signal_checked(pid: u32, signal: Signal, ours: impl FnOnce() -> bool) -> bool {
    send_checked(pid, signal.number(), ours)
}

/// [`signal_checked`] with a signal by number.
pub fn send_checked(pid: u32, number: i32, ours: impl FnOnce() -> bool) -> bool {
    let pidfd = match sys::pidfd_open(pid) {
        Ok(fd) => Some(fd),
        // kernels before 5.3: the check and the kill stay as close as they can
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => None,
        Err(_) => return false,
    };
    if !ours() {
        return false;
    }
    let sent = match &pidfd {
        Some(fd) => sys::pidfd_send_signal(fd, number),
        None => sys::kill(pid, number),
    };
    sent.is_ok()
}

/// What `/proc/<pid>/stat` says about a process's place in the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    pub ppid: u32,
    /// Ended, not yet reaped (or being torn down): nothing left to stop.
    pub dead: bool,
    pub start_ticks: u64,
}

/// Fields 3 (state), 4 (ppid) and 22 (start ticks) of a stat line. The
/// command name may hold spaces and parentheses: fields are counted after
/// the last `") "`.
pub fn parse_node(stat: &str) -> Option<Node> {
    let (_, after) = stat.rsplit_once(") ")?;
    let mut fields = after.split(' ');
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some(Node {
        ppid,
        dead: matches!(state, "Z" | "X" | "x"),
        start_ticks: stat_start_ticks(stat)?,
    })
}

fn node(pid: u32) -> Option<Node> {
    parse_node(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The launcher whose op's tree is meant: its op id, pid and start ticks.
pub struct Owner<'a> {
    pub op: &'a str,
    pub pid: u32,
    pub since: u64,
}

impl Owner<'_> {
    /// Whether the parent chain of `pid` (as `lookup` reads it) reaches the
    /// owner.
    fn descends(&self, pid: u32, lookup: impl Fn(u32) -> Option<Node>) -> bool {
        let mut at = pid;
        for _ in 0..MAX_DEPTH {
            match lookup(at) {
                Some(n) if n.ppid == self.pid => return true,
                Some(n) if n.ppid > 1 => at = n.ppid,
                _ => return false,
            }
        }
        false
    }

    /// Whether the live process `pid` (read as `n`) is the op's.
    fn owns(&self, pid: u32, n: &Node, lookup: impl Fn(u32) -> Option<Node>) -> bool {
        if pid == self.pid || n.dead || n.start_ticks < self.since {
            return false;
        }
        self.descends(pid, lookup) || marked(pid).is_some_and(|m| m.op_id == self.op)
    }

    /// The op's live processes in one pass over `/proc` (the owner excluded),
    /// each with its start ticks.
    fn live(&self) -> io::Result<Vec<(u32, u64)>> {
        let nodes: HashMap<u32, Node> = pids()?
            .into_iter()
            .filter_map(|p| Some((p, node(p)?)))
            .collect();
        Ok(nodes
            .iter()
            .filter(|(&p, n)| self.owns(p, n, |q| nodes.get(&q).copied()))
            .map(|(&p, n)| (p, n.start_ticks))
            .collect())
    }

    /// Signals the op's live processes, each judged again through fresh
    /// reads once its pidfd is open; adds those reached to `stopped`.
    /// Whether any live process of the op was found.
    fn signal_all(&self, signal: Signal, stopped: &mut HashSet<(u32, u64)>) -> io::Result<bool> {
        let live = self.live()?;
        for &(pid, start) in &live {
            let still =
                || node(pid).is_some_and(|n| n.start_ticks == start && self.owns(pid, &n, node));
            if signal_checked(pid, signal, still) {
                stopped.insert((pid, start));
            }
        }
        Ok(!live.is_empty())
    }
}

/// Stops every process the command left behind: TERM, up to
/// [`LEFTOVER_GRACE`] for them to end, then KILL (again, while any is
/// found), then reaps the whole tree so the launcher's children usage
/// covers it. Returns how many distinct processes were signalled.
pub fn stop_leftovers(owner: &Owner<'_>) -> io::Result<u32> {
    let mut stopped = HashSet::new();
    reap_ended();
    if !owner.signal_all(Signal::Term, &mut stopped)? {
        return Ok(0);
    }
    let deadline = Instant::now() + LEFTOVER_GRACE;
    while Instant::now() < deadline {
        std::thread::sleep(GRACE_POLL);
        reap_ended();
        if owner.live()?.is_empty() {
            break;
        }
    }
    for _ in 0..KILL_ROUNDS {
        if !owner.signal_all(Signal::Kill, &mut stopped)? {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        reap_ended();
    }
    reap_all(Instant::now() + REAP_AFTER_KILL);
    Ok(stopped.len().try_into().unwrap_or(u32::MAX))
}

/// Reaps every child that has ended, without waiting.
pub fn reap_ended() {
    while let Ok(Some(_)) = sys::reap(true) {}
}

/// Reaps children until none is left, or until `deadline`.
fn reap_all(deadline: Instant) {
    loop {
        match sys::reap_or_none(true) {
            Ok(sys::Reaped::Child(..)) => continue,
            Ok(sys::Reaped::Running) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_state_parent_and_start() {
        let plain = "12 (sh) S 7 12 12 0 -1 4194560 1078 0 26 0 1 1 0 0 20 0 1 0 3456 1 2";
        assert_eq!(
            parse_node(plain),
            Some(Node {
                ppid: 7,
                dead: false,
                start_ticks: 3456
            })
        );
        let odd = "13 (a) Z b) Z 9 12 12 0 -1 4194560 1078 0 26 0 1 1 0 0 20 0 1 0 3460 1 2";
        assert_eq!(
            parse_node(odd),
            Some(Node {
                ppid: 9,
                dead: true,
                start_ticks: 3460
            })
        );
        assert_eq!(parse_node("13 (x) S"), None);
        assert_eq!(parse_node("13 (x) S x 1"), None);
        assert_eq!(parse_node(""), None);
    }

    #[test]
    fn descent_follows_parents_to_the_owner_only() {
        let owner = Owner {
            op: "0b6f1c2e-8a47-4c1e-9d3a-5f2b7c9e1a0d",
            pid: 50,
            since: 100,
        };
        // 60 → 55 → 50 (the owner); 70 → 1; 80 → 81 → 80 (a cycle)
        let tree: HashMap<u32, u32> = [(60, 55), (55, 50), (70, 1), (80, 81), (81, 80), (90, 0)]
            .into_iter()
            .collect();
        let lookup = |p: u32| {
            tree.get(&p).map(|&ppid| Node {
                ppid,
                dead: false,
                start_ticks: 200,
            })
        };
        assert!(owner.descends(60, lookup));
        assert!(owner.descends(55, lookup));
        for stranger in [70, 80, 90, 99] {
            assert!(!owner.descends(stranger, lookup), "{stranger}");
        }
        let live = |start_ticks, dead| Node {
            ppid: 50,
            dead,
            start_ticks,
        };
        assert!(owner.owns(55, &live(200, false), lookup));
        assert!(!owner.owns(55, &live(200, true), lookup), "already dead");
        assert!(
            !owner.owns(55, &live(99, false), lookup),
            "older than the owner"
        );
        assert!(
            !owner.owns(50, &live(200, false), lookup),
            "the owner itself"
        );
    }
}
