//! `opkernel-shim probe` and `opkernel-shim signal`: one pass over `/proc`.
//!
//! The probe lists every process that carries an op marker, with its start
//! ticks, and closes the listing with `end` (a listing without it proves
//! nothing). The signaller sends a signal to every process of one op
//! except its launcher (or, with `group`, to those of its foreground
//! process group only), each identity-checked through a pidfd: the marker
//! and a start no earlier than the launcher's are read after the pidfd is
//! open, so the signal reaches that very process or none.

use std::ffi::OsString;
use std::io::{self, Write};

use opkernel_shim::format::{render_signalled, END_LINE};
use opkernel_shim::procfs::{stat_groups, Groups};
use opkernel_shim::{validate_op_id, Signal};

use crate::tree::{marked, pids, send_checked, signal_checked};

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
    print_listing("probe", args, listing)
}

/// A verb that takes no arguments and prints one listing: 0 once it is
/// written, 2 for arguments, 1 when it cannot be made or written.
pub fn print_listing(verb: &str, args: Vec<OsString>, make: fn() -> io::Result<String>) -> i32 {
    if !args.is_empty() {
        eprintln!("opkernel-shim {verb}: takes no arguments");
        return 2;
    }
    let result = make().and_then(|text| {
        let mut out = io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("opkernel-shim {verb}: {e}");
            1
        }
    }
}

struct Target {
    op: String,
    launcher: u32,
    since: u64,
    signal: Signal,
    /// Only the op's foreground process group (`group`, SPEC §25): the
    /// terminal's foreground job, else the command's own group.
    group: bool,
}

fn parse(args: Vec<OsString>) -> Result<Target, String> {
    let args: Vec<String> = args
        .into_iter()
        .map(|a| {
            a.into_string()
                .map_err(|_| "arguments must be utf-8".to_owned())
        })
        .collect::<Result<_, _>>()?;
    let (args, group) = match args.split_last() {
        Some((last, rest)) if last == "group" => (rest, true),
        _ => (args.as_slice(), false),
    };
    let [op, launcher, since, signal] = args else {
        return Err(
            "usage: signal <op id> <launcher pid> <launcher start ticks> <SIGNAL> [group]".into(),
        );
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
        group,
    })
}

fn groups(pid: u32) -> Option<Groups> {
    stat_groups(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Where a `group` signal goes.
enum Aim {
    /// The terminal's foreground group, else the command's own group.
    Group(i32),
    /// The session's keeper, which asks the terminal (see `keep.rs`).
    Keeper(u32),
    /// Nowhere: the command ended.
    Nothing,
}

/// Where a `group` signal goes: the command (the launcher's child, leader
/// of its own session) names it: its terminal's foreground group when it
/// has a terminal, else its own group; a keeper in the command's place
/// asks the terminal itself.
fn target_group(t: &Target, pids: &[u32]) -> Aim {
    for &pid in pids {
        let Some(m) = marked(pid).filter(|m| m.op_id == t.op && m.start_ticks >= t.since) else {
            continue;
        };
        let Some(g) = groups(m.pid).filter(|g| g.ppid == t.launcher && g.session == pid as i32)
        else {
            continue;
        };
        if g.tpgid > 0 {
            return Aim::Group(g.tpgid);
        }
        if is_keeper(pid) {
            return Aim::Keeper(pid);
        }
        return Aim::Group(g.pgrp);
    }
    Aim::Nothing
}

/// Whether `pid` runs this very shim as a keeper.
fn is_keeper(pid: u32) -> bool {
    let exe = |p: &str| std::fs::read_link(format!("/proc/{p}/exe")).ok();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let verb = cmdline.split(|b| *b == 0).nth(1);
    verb == Some(crate::keep::VERB.as_bytes())
        && exe(&pid.to_string()).is_some_and(|its| exe("self") == Some(its))
}

/// Asks the keeper `pid` to send the target's signal to its terminal's
/// foreground group, if it is (still) the target's.
fn ask_keeper(pid: u32, t: &Target) -> bool {
    let number = crate::keep::request_number(t.signal);
    send_checked(pid, number, || {
        is_keeper(pid) && marked(pid).is_some_and(|p| p.op_id == t.op && p.start_ticks >= t.since)
    })
}

/// Sends the signal to `pid` if it is (still) one of the target's processes
/// (in `group` when one is given) and not its launcher.
fn signal_if_ours(pid: u32, t: &Target, group: Option<i32>) -> bool {
    // the launcher itself (pid and start ticks) is never signalled; a process
    // that reused its pid after it died is judged like any other
    let ours = || {
        let in_group = group.is_none_or(|g| groups(pid).is_some_and(|p| p.pgrp == g));
        in_group
            && marked(pid).is_some_and(|p| {
                let launcher = p.pid == t.launcher && p.start_ticks == t.since;
                p.op_id == t.op && p.start_ticks >= t.since && !launcher
            })
    };
    signal_checked(pid, t.signal, ours)
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
        let all = pids()?;
        // a group signal without its command (it ended) reaches nothing
        let group = match target.group {
            true => match target_group(&target, &all) {
                Aim::Group(g) => Some(g),
                Aim::Nothing => Some(0),
                Aim::Keeper(pid) => {
                    if ask_keeper(pid, &target) {
                        out.write_all(render_signalled(pid).as_bytes())?;
                    }
                    Some(0)
                }
            },
            false => None,
        };
        for pid in all {
            if pid == me || group == Some(0) {
                continue;
            }
            if signal_if_ours(pid, &target, group) {
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
