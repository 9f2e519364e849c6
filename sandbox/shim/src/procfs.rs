//! Pure parsing of what `/proc/<pid>/` says about a process.

use crate::format::{validate_op_id, MARKER_VAR};

/// Field 22 (start time, clock ticks since boot) of a `/proc/<pid>/stat`
/// line. The command name may hold spaces and parentheses: fields are
/// counted after the last `") "`.
pub fn stat_start_ticks(stat: &str) -> Option<u64> {
    let (_, after) = stat.rsplit_once(") ")?;
    after.split(' ').nth(19)?.parse().ok()
}

/// Where a process stands among sessions and groups (fields 4 to 8 of a
/// stat line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Groups {
    /// Its parent.
    pub ppid: u32,
    /// Its process group.
    pub pgrp: i32,
    /// Its session.
    pub session: i32,
    /// The foreground process group of its controlling terminal; -1 or 0
    /// when it has none.
    pub tpgid: i32,
}

/// Fields 4 (ppid), 5 (pgrp), 6 (session) and 8 (tpgid) of a stat line.
pub fn stat_groups(stat: &str) -> Option<Groups> {
    let (_, after) = stat.rsplit_once(") ")?;
    let f: Vec<&str> = after.split(' ').take(6).collect();
    let [_, ppid, pgrp, session, _, tpgid] = f.as_slice() else {
        return None;
    };
    Some(Groups {
        ppid: ppid.parse().ok()?,
        pgrp: pgrp.parse().ok()?,
        session: session.parse().ok()?,
        tpgid: tpgid.parse().ok()?,
    })
}

/// The op id a process is marked with: the value of its first
/// `__OPKERNEL_OP=` entry in `/proc/<pid>/environ` (NUL-separated), when
/// that value is a well-formed op id.
pub fn environ_marker(environ: &[u8]) -> Option<&str> {
    let prefix = MARKER_VAR.as_bytes();
    let entry = environ
        .split(|&b| b == 0)
        .find(|e| e.len() > prefix.len() && e.starts_with(prefix) && e[prefix.len()] == b'=')?;
    let value = std::str::from_utf8(&entry[prefix.len() + 1..]).ok()?;
    validate_op_id(value).ok().map(|()| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0b6f1c2e-8a47-4c1e-9d3a-5f2b7c9e1a0d";

    #[test]
    fn start_ticks_survive_odd_command_names() {
        let plain = "12 (bash) S 0 12 12 0 -1 4194560 1078 0 26 0 1 1 0 0 20 0 1 0 3456 1 2";
        assert_eq!(stat_start_ticks(plain), Some(3456));
        let odd = "13 (a) b) S 0 12 12 0 -1 4194560 1078 0 26 0 1 1 0 0 20 0 1 0 3460 1 2";
        assert_eq!(stat_start_ticks(odd), Some(3460));
        assert_eq!(stat_start_ticks("13 (x) S 0"), None);
        assert_eq!(stat_start_ticks(""), None);
    }

    #[test]
    fn groups_are_read_after_the_command_name() {
        let stat = "40 (sl (e) ep) S 12 40 12 34816 41 4194560 1 0 0 0 0 0 0 0 20 0 1 0 3456 1 2";
        let g = stat_groups(stat).unwrap();
        assert_eq!((g.ppid, g.pgrp, g.session, g.tpgid), (12, 40, 12, 41));
        assert_eq!(stat_groups("13 (x) S 0 1"), None);
    }

    #[test]
    fn the_marker_is_an_exact_entry_with_a_valid_id() {
        let env = format!("PATH=/bin\0{MARKER_VAR}={ID}\0HOME=/scratch\0");
        assert_eq!(environ_marker(env.as_bytes()), Some(ID));
        let first_wins = format!("{MARKER_VAR}={ID}\0{MARKER_VAR}=x\0");
        assert_eq!(environ_marker(first_wins.as_bytes()), Some(ID));
        for bad in [
            format!("X{MARKER_VAR}={ID}\0"),
            format!("{MARKER_VAR}X={ID}\0"),
            format!("{MARKER_VAR}={ID}x\0"),
            format!("{MARKER_VAR}=\0"),
            String::new(),
        ] {
            assert_eq!(environ_marker(bad.as_bytes()), None, "{bad:?}");
        }
    }
}
