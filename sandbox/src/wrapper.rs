//! The in-container scripts, built by pure functions: the op wrapper (pid,
//! log and code files), the marker probe and the identity-checked signaller,
//! plus the parser of the probe's output.
//!
//! The wrapper runs as root in the container and the command runs in its own
//! session (so a signal to the command's process group never hits the
//! wrapper), dropped to the profile's user, with stdout+stderr going through
//! a size-capping copier into `.ops/<id>.log`. The exit code is written to a
//! temp file and renamed to `.ops/<id>.code`.

use crate::error::{Result, SandboxError};
use crate::profile::OPS_MOUNT;

/// Environment variable that marks every process of an op.
pub const MARKER_VAR: &str = "__OPKERNEL_OP";
/// argv[0] of the wrapper shell, visible in `docker top`.
pub const WRAPPER_ARG0: &str = "opkernel-wrapper";

/// `__OPKERNEL_OP=<id>`.
pub fn marker(op_id: &str) -> String {
    format!("{MARKER_VAR}={op_id}")
}

/// Op ids are UUIDs in their hyphenated lowercase form; nothing else may be
/// spliced into a script or a path.
pub fn validate_op_id(op_id: &str) -> Result<()> {
    let ok = op_id.len() == 36
        && op_id.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        });
    if ok {
        Ok(())
    } else {
        Err(SandboxError::Invalid(format!(
            "operation id must be a lowercase uuid, got {:?}",
            op_id.chars().take(64).collect::<String>()
        )))
    }
}

fn validate_user(user: &str) -> Result<()> {
    let ok = !user.is_empty()
        && user.len() <= 32
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(SandboxError::Invalid(format!(
            "run_as user {user:?} is not a plain user name"
        )))
    }
}

/// What the wrapper needs to know about one op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrapperSpec<'a> {
    pub op_id: &'a str,
    pub run_as: Option<&'a str>,
    /// Log size cap in bytes; what passes it is dropped (and counted in a mark).
    pub log_cap_bytes: u64,
}

/// The wrapper script. Run as `sh -c SCRIPT opkernel-wrapper ARGV...`.
pub fn wrapper_script(spec: &WrapperSpec<'_>) -> Result<String> {
    validate_op_id(spec.op_id)?;
    if let Some(user) = spec.run_as {
        validate_user(user)?;
    }
    let cap = spec.log_cap_bytes.max(1);
    let run_as = spec.run_as.unwrap_or("");
    Ok(format!(
        r#"id={id}; ops={ops}; cap={cap}; run_as='{run_as}'
umask 022
read -r l < /proc/$$/stat; r=${{l##*) }}; i=0
while [ "$i" -lt 19 ]; do r=${{r#* }}; i=$((i+1)); done
st=${{r%% *}}
read -r host < /proc/sys/kernel/hostname || host=
printf '%s %s %s\n' "$$" "$st" "$host" > "$ops/$id.pid" || exit 125
if [ -n "$run_as" ]; then set -- su -m -s /bin/sh -c 'exec "$@"' -- "$run_as" opkernel-op "$@"; fi
if command -v setsid >/dev/null 2>&1; then set -- setsid "$@"; fi
: > "$ops/$id.log"
fifo="$ops/$id.fifo"
capper=
if mkfifo -m 600 "$fifo" 2>/dev/null; then
  (unset {marker_var}; exec /bin/sh -c 'dd bs=65536 count="$1" iflag=count_bytes 2>/dev/null; n=$(wc -c); if [ "$n" -gt 0 ]; then printf "\n[opkernel: output truncated: %s bytes over the %s byte cap dropped]\n" "$n" "$1"; fi' opkernel-capper "$cap") < "$fifo" >> "$ops/$id.log" 2>/dev/null &
  capper=$!
  "$@" > "$fifo" 2>&1 < /dev/null &
else
  "$@" >> "$ops/$id.log" 2>&1 < /dev/null &
fi
child=$!
wait "$child"; code=$?
rm -f "$fifo"
if [ -n "$capper" ]; then
  # a process the command left behind may hold the fifo open: wait for the
  # capper at most 2 s, then stop it, so the log is final before the code
  trap : USR1
  (unset {marker_var}; exec /bin/sh -c 'trap "kill \$! 2>/dev/null; exit 0" TERM; sleep 2 & wait "$!"; kill -USR1 "$1"' opkernel-timer "$$") </dev/null >/dev/null 2>&1 &
  timer=$!
  wait "$capper"; st=$?
  if [ "$st" -gt 128 ] && kill -0 "$capper" 2>/dev/null; then
    kids=
    for s in /proc/[0-9]*/stat; do
      read -r l < "$s" 2>/dev/null || continue
      r=${{l##*) }}; r=${{r#* }}; pp=${{r%% *}}
      [ "$pp" = "$capper" ] && {{ p=${{s#/proc/}}; kids="$kids ${{p%/stat}}"; }}
    done
    kill -9 "$capper" $kids 2>/dev/null
    wait "$capper" 2>/dev/null
    printf '\n[opkernel: output written after the command exited is not captured]\n' >> "$ops/$id.log"
  fi
  kill "$timer" 2>/dev/null
  wait "$timer" 2>/dev/null
fi
printf '%s\n' "$code" > "$ops/$id.code.tmp" && mv -f "$ops/$id.code.tmp" "$ops/$id.code" && exit "$code"
exit 125
"#,
        id = spec.op_id,
        ops = OPS_MOUNT,
        cap = cap,
        marker_var = MARKER_VAR,
    ))
}

/// The exec argv of an op: `/bin/sh -c WRAPPER opkernel-wrapper ARGV...`.
pub fn wrapper_argv(spec: &WrapperSpec<'_>, command: &[String]) -> Result<Vec<String>> {
    validate_command(command)?;
    let mut argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        wrapper_script(spec)?,
        WRAPPER_ARG0.to_owned(),
    ];
    argv.extend(command.iter().cloned());
    Ok(argv)
}

/// Total argv size bound (bytes, including one separator per argument).
pub const MAX_COMMAND_BYTES: usize = 256 * 1024;

/// A command is a non-empty argv without NUL bytes and of bounded size.
pub fn validate_command(command: &[String]) -> Result<()> {
    if command.is_empty() {
        return Err(SandboxError::Invalid(
            "command must be a non-empty argv array".into(),
        ));
    }
    if command[0].is_empty() {
        return Err(SandboxError::Invalid("command[0] must not be empty".into()));
    }
    if let Some(i) = command.iter().position(|a| a.contains('\0')) {
        return Err(SandboxError::Invalid(format!(
            "command[{i}] contains a NUL byte"
        )));
    }
    let total: usize = command.iter().map(|a| a.len() + 1).sum();
    if total > MAX_COMMAND_BYTES {
        return Err(SandboxError::Invalid(format!(
            "command is {total} bytes, the limit is {MAX_COMMAND_BYTES}"
        )));
    }
    Ok(())
}

/// Lists every process that carries an op marker, in a handful of processes
/// whatever the number of processes: one `grep` over all environs, then the
/// start times of the marked processes only. Output: `markers`,
/// `/proc/<pid>/environ:<marker>` lines, `stats`, `<pid> <start>` lines (or
/// whole stat lines where the image has no awk), `end`. `cat` skips a
/// process that exits mid-scan and goes on; the parser then drops it.
pub fn probe_script() -> String {
    format!(
        r#"m=$(grep -a -z -o -H '^{var}=[0-9a-f-]*' /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n')
echo markers
[ -n "$m" ] && printf '%s\n' "$m"
echo stats
if [ -n "$m" ]; then
  if command -v awk >/dev/null 2>&1; then
    printf '%s\n' "$m" | sed 's,/environ:.*,/stat,' | xargs cat 2>/dev/null | awk '{{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); print $1, f[20] }}'
  else
    printf '%s\n' "$m" | sed 's,/environ:.*,/stat,' | xargs cat 2>/dev/null
  fi
fi
echo end
"#,
        var = MARKER_VAR
    )
}

/// A process that carries an op marker, as the probe saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkedProcess {
    pub pid: u32,
    pub start_ticks: u64,
    pub op_id: String,
}

/// Field 22 (start time) of a `/proc/<pid>/stat` line, with its pid. The
/// command name may hold spaces and parentheses: fields are counted after
/// the last `") "`.
pub fn parse_stat_line(line: &str) -> Option<(u32, u64)> {
    // the reduced form `<pid> <start>`
    if let Some((pid, start)) = line.split_once(' ') {
        if let (Ok(pid), Ok(start)) = (pid.parse(), start.parse()) {
            return Some((pid, start));
        }
    }
    let (head, rest) = line.split_once(" (")?;
    let pid = head.parse().ok()?;
    let (_, after) = rest.rsplit_once(") ")?;
    let start = after.split(' ').nth(19)?.parse().ok()?;
    Some((pid, start))
}

/// Parses the probe output. The trailing `end` line proves the listing is complete.
pub fn parse_probe(output: &str) -> Result<Vec<MarkedProcess>, String> {
    let mut lines = output.lines();
    if lines.next() != Some("markers") {
        return Err("probe output does not start with its markers line".into());
    }
    let mut markers = Vec::new();
    let mut in_stats = false;
    let mut starts = std::collections::HashMap::new();
    let mut complete = false;
    for line in lines {
        match (in_stats, line) {
            (_, "end") => {
                complete = true;
                break;
            }
            (false, "stats") => in_stats = true,
            (false, marker) => {
                let (path, value) = marker
                    .split_once(":")
                    .ok_or_else(|| format!("bad marker line {marker:?}"))?;
                let pid: u32 = path
                    .strip_prefix("/proc/")
                    .and_then(|p| p.strip_suffix("/environ"))
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| format!("bad marker path {path:?}"))?;
                let op = value
                    .strip_prefix(MARKER_VAR)
                    .and_then(|v| v.strip_prefix('='))
                    .ok_or_else(|| format!("bad marker {value:?}"))?;
                markers.push((pid, op.to_owned()));
            }
            (true, stat) => {
                // the first line for a pid wins; a command name cannot hold a whole stat line
                if let Some((pid, start)) = parse_stat_line(stat) {
                    starts.entry(pid).or_insert(start);
                }
            }
        }
    }
    if !complete {
        return Err("probe output ended before its end line".into());
    }
    Ok(markers
        .into_iter()
        .filter_map(|(pid, op_id)| {
            starts.get(&pid).map(|&start_ticks| MarkedProcess {
                pid,
                start_ticks,
                op_id,
            })
        })
        .collect())
}

/// Unix signals the kernel sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
}

impl Signal {
    pub fn name(self) -> &'static str {
        match self {
            Signal::Term => "TERM",
            Signal::Kill => "KILL",
        }
    }
}

/// Signals every process of an op except its wrapper, checking immediately
/// before each signal that the process carries the op's marker and started no
/// earlier than the wrapper (a reused pid fails one of the two). Prints one
/// `signalled <pid>` line per signal and a final `end` line.
pub fn signal_script(
    op_id: &str,
    wrapper_pid: u32,
    wrapper_start_ticks: u64,
    signal: Signal,
) -> Result<String> {
    validate_op_id(op_id)?;
    Ok(format!(
        r#"want='{var}={op_id}'; wrapper={wrapper_pid}; since={wrapper_start_ticks}
for f in $(grep -l -a -z -x "$want" /proc/[0-9]*/environ 2>/dev/null); do
  p=${{f#/proc/}}; p=${{p%/environ}}
  [ "$p" = "$$" ] && continue
  [ "$p" = "$wrapper" ] && continue
  grep -q -a -z -x "$want" "/proc/$p/environ" 2>/dev/null || continue
  l=$(cat "/proc/$p/stat" 2>/dev/null) || continue
  st=$(set -f; set -- ${{l##*) }}; shift 19; echo "$1")
  [ "$st" -ge "$since" ] 2>/dev/null || continue
  kill -{sig} "$p" 2>/dev/null && echo "signalled $p"
done
echo end
"#,
        var = MARKER_VAR,
        sig = signal.name(),
    ))
}

/// Pids reported as signalled by [`signal_script`]; `None` when incomplete.
pub fn parse_signalled(output: &str) -> Option<Vec<u32>> {
    let mut pids = Vec::new();
    let mut complete = false;
    for line in output.lines() {
        if line.trim() == "end" {
            complete = true;
        } else if let Some(pid) = line.trim().strip_prefix("signalled ") {
            pids.push(pid.parse().ok()?);
        }
    }
    complete.then_some(pids)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0b6f1c2e-8a47-4c1e-9d3a-5f2b7c9e1a0d";

    #[test]
    fn op_ids_must_be_uuids() {
        assert!(validate_op_id(ID).is_ok());
        for bad in [
            "",
            "x",
            "0B6F1C2E-8A47-4C1E-9D3A-5F2B7C9E1A0D",
            "../../etc/passwd",
            &ID.replace('-', "_"),
        ] {
            assert!(validate_op_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn wrapper_writes_all_three_files_and_isolates_the_command() {
        let spec = WrapperSpec {
            op_id: ID,
            run_as: Some("agent"),
            log_cap_bytes: 1500,
        };
        let script = wrapper_script(&spec).unwrap();
        assert!(script.contains(&format!(
            "id={ID}; ops=/scratch/.ops; cap=1500; run_as='agent'"
        )));
        // one short write: a reader may see it empty or partial, never wrong
        assert!(script.contains(r#"> "$ops/$id.pid" || exit 125"#));
        assert!(script
            .contains(r#"> "$ops/$id.code.tmp" && mv -f "$ops/$id.code.tmp" "$ops/$id.code""#));
        assert!(script.contains("set -- setsid"));
        assert!(script.contains("(unset __OPKERNEL_OP; exec /bin/sh"));
        // the pid file is written before the command is started
        assert!(script.find("$id.pid\"").unwrap() < script.find("child=$!").unwrap());
    }

    #[test]
    fn wrapper_refuses_odd_users_and_ids() {
        let spec = WrapperSpec {
            op_id: ID,
            run_as: Some("a'b"),
            log_cap_bytes: 1,
        };
        assert!(wrapper_script(&spec).is_err());
        let spec = WrapperSpec {
            op_id: "x; rm -rf /",
            run_as: None,
            log_cap_bytes: 1,
        };
        assert!(wrapper_script(&spec).is_err());
    }

    #[test]
    fn wrapper_argv_passes_the_command_verbatim() {
        let spec = WrapperSpec {
            op_id: ID,
            run_as: None,
            log_cap_bytes: 1024,
        };
        let cmd = vec![
            "bash".to_owned(),
            "-lc".to_owned(),
            "echo 'a b' \"$X\"".to_owned(),
        ];
        let argv = wrapper_argv(&spec, &cmd).unwrap();
        assert_eq!(argv[0], "/bin/sh");
        assert_eq!(argv[3], WRAPPER_ARG0);
        assert_eq!(&argv[4..], &cmd[..]);
    }

    #[test]
    fn commands_are_validated() {
        assert!(validate_command(&[]).is_err());
        assert!(validate_command(&["".to_owned()]).is_err());
        assert!(validate_command(&["a\0b".to_owned()]).is_err());
        assert!(validate_command(&["x".repeat(MAX_COMMAND_BYTES)]).is_err());
        assert!(validate_command(&["true".to_owned()]).is_ok());
    }

    #[test]
    fn probe_output_parses_joins_and_requires_end() {
        let out = format!(
            "markers\n/proc/12/environ:__OPKERNEL_OP={ID}\n/proc/13/environ:__OPKERNEL_OP={ID}\n/proc/99/environ:__OPKERNEL_OP={ID}\n\
             stats\n1 (sh) S 0 1 1 0 -1 4194560 1078 0 26 0 1 1 0 0 20 0 1 0 209 1 2\n\
             12 (bash) S 0 12 12 0 -1 4194560 1078 0 26 0 1 1 0 0 20 0 1 0 3456 1 2\n\
             13 (a) b) S 0 12 12 0 -1 4194560 1078 0 26 0 1 1 0 0 20 0 1 0 3460 1 2\nend\n"
        );
        let procs = parse_probe(&out).unwrap();
        // pid 99 exited between the grep and the cat: left out
        assert_eq!(procs.len(), 2);
        assert_eq!(
            procs[0],
            MarkedProcess {
                pid: 12,
                start_ticks: 3456,
                op_id: ID.to_owned()
            }
        );
        assert_eq!(
            procs[1].start_ticks, 3460,
            "a command name with ') ' is parsed"
        );
        assert!(parse_probe("markers\nstats\n").is_err());
        assert!(parse_probe("markers\nnonsense\nstats\nend\n").is_err());
        assert_eq!(parse_probe("markers\nstats\nend\n").unwrap(), vec![]);
        let reduced =
            format!("markers\n/proc/12/environ:__OPKERNEL_OP={ID}\nstats\n12 3456\nend\n");
        assert_eq!(parse_probe(&reduced).unwrap()[0].start_ticks, 3456);
    }

    #[test]
    fn signal_script_checks_identity_before_each_kill() {
        let script = signal_script(ID, 42, 1000, Signal::Kill).unwrap();
        assert!(script.contains(&format!(
            "want='__OPKERNEL_OP={ID}'; wrapper=42; since=1000"
        )));
        let check = script.find("grep -q -a -z -x").unwrap();
        let start = script.find("-ge \"$since\"").unwrap();
        let kill = script.find("kill -KILL").unwrap();
        assert!(check < kill && start < kill);
        assert_eq!(
            parse_signalled("signalled 5\nsignalled 7\nend\n"),
            Some(vec![5, 7])
        );
        assert_eq!(parse_signalled("signalled 5\n"), None);
    }
}
