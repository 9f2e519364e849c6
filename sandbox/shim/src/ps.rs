//! `opkernel-shim ps`: the process table of every marked process (the
//! operator's inspect, SPEC §23), read from `/proc` in one pass.

use std::io;

use opkernel_shim::format::END_LINE;
use opkernel_shim::table::{
    cmdline_text, passwd_name, stat_cpu_ticks, stat_name, status_uid_rss, ProcessRow,
};

use crate::tree::{marked, pids};

/// Milliseconds since boot, from `/proc/uptime`.
fn uptime_ms() -> io::Result<u64> {
    let text = std::fs::read_to_string("/proc/uptime")?;
    let secs: f64 = text
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other("unreadable /proc/uptime"))?;
    Ok((secs * 1000.0) as u64)
}

/// One marked process's row; `None` when it is gone mid-read.
fn row(
    pid: u32,
    op_id: String,
    start_ticks: u64,
    clock: (u64, u64),
    passwd: &str,
) -> Option<ProcessRow> {
    let (tick, now_ms) = clock;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let (uid, rss_kb) = status_uid_rss(&status)?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut command = cmdline_text(&cmdline);
    if command.is_empty() {
        command = format!("[{}]", stat_name(&stat).unwrap_or("?"));
    }
    Some(ProcessRow {
        pid,
        op_id,
        uid,
        user: passwd_name(passwd, uid).unwrap_or_else(|| uid.to_string()),
        cpu_ms: stat_cpu_ticks(&stat)? * 1000 / tick,
        rss_kb,
        age_ms: now_ms.saturating_sub(start_ticks * 1000 / tick),
        command,
    })
}

/// The table: every marked process but this one, then `end`.
pub fn table() -> io::Result<String> {
    listing(false)
}

/// Every process but this one, marked or not (an unmarked one's op is
/// empty): the container's whole table, where the engine's `docker top`
/// cannot see inside (gVisor), then `end`.
pub fn all() -> io::Result<String> {
    listing(true)
}

fn listing(every: bool) -> io::Result<String> {
    let me = std::process::id();
    let clock = (crate::sys::clock_ticks_per_sec(), uptime_ms()?);
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let mut out = String::new();
    for pid in pids()?.into_iter().filter(|&p| p != me) {
        let (op_id, start_ticks) = match marked(pid) {
            Some(m) => (m.op_id, m.start_ticks),
            None if every => match std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .as_deref()
                .and_then(opkernel_shim::procfs::stat_start_ticks)
            {
                Some(ticks) => (String::new(), ticks),
                None => continue,
            },
            None => continue,
        };
        if let Some(r) = row(pid, op_id, start_ticks, clock, &passwd) {
            out.push_str(&r.render());
        }
    }
    out.push_str(END_LINE);
    out.push('\n');
    Ok(out)
}

/// `ps`: the marked processes; `ps --all`: every process.
pub fn main(mut args: Vec<std::ffi::OsString>) -> i32 {
    if args.len() == 1 && args[0] == "--all" {
        args.clear();
        return crate::scan::print_listing("ps", args, all);
    }
    crate::scan::print_listing("ps", args, table)
}
