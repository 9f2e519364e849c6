//! `opkernel-shim probe` and `opkernel-shim signal`: one pass over `/proc`.
//!
//! The probe lists every process that carries an op marker, with its start
//! ticks, and closes the listing with `end` (a listing without it proves
//! nothing). The signaller sends TERM or KILL to every process of one op
//! except its launcher, each identity-checked through a pidfd: the marker
//! and a start no earlier than the launcher's are read after the pidfd is
//! open, so the signal reaches that very process or none.

use std::ffi::OsString;
use std::io::{self, Write};

use opkernel_shim::format::{render_signalled, END_LINE};
use opkernel_shim::procfs::{environ_marker, stat_start_ticks};
use opkernel_shim::{validate_op_id, MarkedProcess, Signal};

use crate::sys;

fn pids() -> io::Result<Vec<u32>> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

/// The marked identity of a live process; `None` for unmarked processes and
/// for processes gone mid-read.
fn marked(pid: u32) -> Option<MarkedProcess> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let op_id = environ_marker(&environ)?.to_owned();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(MarkedProcess {
        pid,
        start_ticks: stat_start_ticks(&stat)?,
        op_id,
    })
}

/// The probe listing: every marked process but this one, then `end`.
pub fn listing() -> io::Result<String> {
    let me = std::process::id();
    let mut out = String::new();
    for pid in pids()?.into_iter().filter(|&p| p != me) {
        if let Some(p) = marked(pid) {
            out.push_str(&p.render());
        }
    }
    out.push_str(END_LINE);
    out.push('\n');
    Ok(out)
}

pub fn probe(args: Vec<OsString>) -> i32 {
    if !args.is_empty() {
        eprintln!("opkernel-shim probe: takes no arguments");
        return 2;
    }
    let result = listing().and_then(|text| {
        let mut out = io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("opkernel-shim probe: {e}");
            1
        }
    }
}

struct Target {
    op: String,
    launcher: u32,
    since: u64,
    signal: Signal,
}

fn parse(args: Vec<OsString>) -> Result<Target, String> {
    let args: Vec<String> = args
        .into_iter()
        .map(|a| {
            a.into_string()
                .map_err(|_| "arguments must be utf-8".to_owned())
        })
        .collect::<Result<_, _>>()?;
    let [op, launcher, since, signal] = args.as_slice() else {
        return Err("usage: signal <op id> <launcher pid> <launcher start ticks> TERM|KILL".into());
    };
    validate_op_id(op)?;
    Ok(Target {
        op: op.clone(),
        launcher: launcher
            .parse()
            .map_err(|_| format!("bad launcher pid {launcher:?}"))?,
        since: since
            .parse()
            .map_err(|_| format!("bad start ticks {since:?}"))?,
        signal: Signal::parse(signal).ok_or_else(|| format!("bad signal {signal:?}"))?,
    })
}

/// Sends the signal to `pid` if it is (still) one of the target's processes
/// and not its launcher.
fn signal_if_ours(pid: u32, t: &Target) -> io::Result<bool> {
    let pidfd = match sys::pidfd_open(pid) {
        Ok(fd) => Some(fd),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => None,
        Err(_) => return Ok(false),
    };
    // the launcher itself (pid and start ticks) is never signalled; a process
    // that reused its pid after it died is judged like any other
    let ours = marked(pid).is_some_and(|p| {
        let launcher = p.pid == t.launcher && p.start_ticks == t.since;
        p.op_id == t.op && p.start_ticks >= t.since && !launcher
    });
    if !ours {
        return Ok(false);
    }
    let sent = match &pidfd {
        Some(fd) => sys::pidfd_send_signal(fd, t.signal.number()),
        None => sys::kill(pid, t.signal.number()),
    };
    Ok(sent.is_ok())
}

pub fn signal(args: Vec<OsString>) -> i32 {
    let target = match parse(args) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("opkernel-shim signal: {e}");
            return 2;
        }
    };
    let me = std::process::id();
    let result = (|| -> io::Result<()> {
        let mut out = io::stdout().lock();
        for pid in pids()? {
            if pid == me {
                continue;
            }
            if signal_if_ours(pid, &target)? {
                out.write_all(render_signalled(pid).as_bytes())?;
            }
        }
        writeln!(out, "{END_LINE}")?;
        out.flush()
    })();
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("opkernel-shim signal: {e}");
            1
        }
    }
}
