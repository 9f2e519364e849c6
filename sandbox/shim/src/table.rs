//! The process table of `opkernel-shim ps` (the operator's inspect, SPEC
//! §23): every marked process with its owner, CPU time, resident memory,
//! age and command line. One tab-separated line per process, the command
//! last and escaped (`\t`, `\n`, `\\`), closed by the `end` line like the
//! probe: a table without it proves nothing.

use crate::format::{validate_op_id, END_LINE};

/// One marked process, as `ps` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRow {
    /// The process's pid inside the container.
    pub pid: u32,
    /// The op whose marker it carries.
    pub op_id: String,
    /// Its real uid.
    pub uid: u32,
    /// The uid's name in the container's `/etc/passwd`, else the number.
    pub user: String,
    /// User and system CPU time, milliseconds.
    pub cpu_ms: u64,
    /// Resident memory, KiB.
    pub rss_kb: u64,
    /// Time since it started, milliseconds.
    pub age_ms: u64,
    /// Its command line, arguments joined by spaces (the name in `stat`
    /// when it has none: a kernel thread or a zombie).
    pub command: String,
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next()? {
            '\\' => '\\',
            't' => '\t',
            'n' => '\n',
            _ => return None,
        });
    }
    Some(out)
}

impl ProcessRow {
    /// Its line: pid, op, uid, user, cpu ms, rss KiB, age ms, command.
    pub fn render(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            self.pid,
            self.op_id,
            self.uid,
            escape(&self.user),
            self.cpu_ms,
            self.rss_kb,
            self.age_ms,
            escape(&self.command)
        )
    }

    fn parse(line: &str) -> Option<ProcessRow> {
        let f: Vec<&str> = line.splitn(8, '\t').collect();
        let [pid, op, uid, user, cpu, rss, age, command] = f[..] else {
            return None;
        };
        // empty: a process of no op (`ps --all`)
        if !op.is_empty() {
            validate_op_id(op).ok()?;
        }
        Some(ProcessRow {
            pid: pid.parse().ok()?,
            op_id: op.to_owned(),
            uid: uid.parse().ok()?,
            user: unescape(user)?,
            cpu_ms: cpu.parse().ok()?,
            rss_kb: rss.parse().ok()?,
            age_ms: age.parse().ok()?,
            command: unescape(command)?,
        })
    }
}

/// Parses a whole table; only one closed by its `end` line counts.
pub fn parse_table(output: &str) -> Result<Vec<ProcessRow>, String> {
    let mut rows = Vec::new();
    for line in output.lines() {
        if line == END_LINE {
            return Ok(rows);
        }
        let shown: String = line.chars().take(120).collect();
        rows.push(ProcessRow::parse(line).ok_or_else(|| format!("bad ps line {shown:?}"))?);
    }
    Err("ps output ended before its end line".into())
}

/// utime + stime (fields 14 and 15 of `/proc/<pid>/stat`), clock ticks.
pub fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, after) = stat.rsplit_once(") ")?;
    let mut f = after.split(' ').skip(11);
    Some(f.next()?.parse::<u64>().ok()? + f.next()?.parse::<u64>().ok()?)
}

/// The command name of a `/proc/<pid>/stat` line (between its parentheses).
pub fn stat_name(stat: &str) -> Option<&str> {
    let open = stat.find('(')?;
    let close = stat.rfind(") ")?;
    stat.get(open + 1..close)
}

/// The real uid and `VmRSS` (KiB; 0 when absent) of a `/proc/<pid>/status`.
pub fn status_uid_rss(status: &str) -> Option<(u32, u64)> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.split_whitespace().next())
    };
    let uid = field("Uid:")?.parse().ok()?;
    let rss = field("VmRSS:").and_then(|v| v.parse().ok()).unwrap_or(0);
    Some((uid, rss))
}

/// A command line from `/proc/<pid>/cmdline` (NUL-separated arguments).
pub fn cmdline_text(cmdline: &[u8]) -> String {
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    args.join(" ")
}

/// The name of `uid` in `/etc/passwd` text.
pub fn passwd_name(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        let name = f.next()?;
        let _password = f.next()?;
        (f.next()?.parse::<u32>().ok()? == uid).then(|| name.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0b6f1c2e-8a47-4c1e-9d3a-5f2b7c9e1a0d";

    #[test]
    fn rows_round_trip_with_awkward_commands() {
        let row = ProcessRow {
            pid: 42,
            op_id: ID.into(),
            uid: 1000,
            user: "agent".into(),
            cpu_ms: 1230,
            rss_kb: 2048,
            age_ms: 5000,
            command: "sh -c echo a\tb\nc \\ d".into(),
        };
        let text = format!("{}{}\n", row.render(), END_LINE);
        assert_eq!(parse_table(&text), Ok(vec![row]));
        assert!(parse_table(&text.replace("end\n", "")).is_err());
        assert!(parse_table("1\tnot-an-op\t0\troot\t0\t0\t0\tsh\nend\n").is_err());
        assert_eq!(parse_table("end\n"), Ok(vec![]));
    }

    #[test]
    fn proc_fields_are_read_past_odd_names() {
        let stat = "13 (a) b) S 0 12 12 0 -1 4194560 1078 0 26 0 150 25 0 0 20 0 1 0 3460 1 2";
        assert_eq!(stat_cpu_ticks(stat), Some(175));
        assert_eq!(stat_name(stat), Some("a) b"));
        let status = "Name:\tsleep\nUid:\t1000\t1000\t1000\t1000\nVmRSS:\t    1234 kB\n";
        assert_eq!(status_uid_rss(status), Some((1000, 1234)));
        assert_eq!(status_uid_rss("Uid:\t0\t0\t0\t0\n"), Some((0, 0)));
        assert_eq!(cmdline_text(b"sleep\x0030\x00"), "sleep 30");
        let passwd = "root:x:0:0::/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\n";
        assert_eq!(passwd_name(passwd, 1000).as_deref(), Some("agent"));
        assert_eq!(passwd_name(passwd, 7), None);
    }
}
