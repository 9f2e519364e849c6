//! The byte formats between the shim and the kernel, each with its writer
//! and its strict parser side by side: `.pid`, `.code`, the probe listing
//! and the signaller's report. A parser accepts exactly what the writer
//! produces (canonical decimals, single spaces, one trailing newline) and
//! nothing else, so a damaged or foreign file is never mistaken for a record.

/// Environment variable that marks every process of an op.
pub const MARKER_VAR: &str = "__OPKERNEL_OP";

/// `__OPKERNEL_OP=<id>`.
pub fn marker(op_id: &str) -> String {
    format!("{MARKER_VAR}={op_id}")
}

/// Op ids are UUIDs in their hyphenated lowercase form; nothing else may be
/// spliced into a path or an argv.
pub fn validate_op_id(op_id: &str) -> Result<(), String> {
    let ok = op_id.len() == 36
        && op_id.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "operation id must be a lowercase uuid, got {:?}",
            op_id.chars().take(64).collect::<String>()
        ))
    }
}

/// Why a record could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// The file is empty: its writer has not written yet (or died first).
    Empty,
    /// No trailing newline yet (or too few fields): a writer may be mid-way.
    Partial(String),
    /// Complete but not what the writer produces: never read as a record.
    Garbage(String),
}

fn clip(text: &str) -> String {
    text.chars().take(64).collect()
}

/// A number exactly as the shim writes it: digits only, no sign, no
/// leading zero.
fn canonical_decimal<T: std::str::FromStr>(s: &str) -> Option<T> {
    let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits && (s == "0" || !s.starts_with('0')))
        .then(|| s.parse().ok())
        .flatten()
}

/// The line without its trailing newline; empty and unterminated text are
/// told apart from garbage.
fn one_line(text: &str) -> Result<&str, FormatError> {
    if text.is_empty() {
        return Err(FormatError::Empty);
    }
    text.strip_suffix('\n')
        .ok_or_else(|| FormatError::Partial(clip(text)))
}

/// The launcher's identity as recorded in `<id>.pid`, written before the
/// command starts: `<pid> <start ticks> <hostname>\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidRecord {
    /// The launcher's pid inside the container.
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat`: start time in clock ticks since boot.
    pub start_ticks: u64,
    /// The container's hostname, telling containers that share a run's `.ops`
    /// apart (may be empty).
    pub hostname: String,
}

impl PidRecord {
    /// The one line the launcher writes: `<pid> <start ticks> <hostname>\n`.
    pub fn render(&self) -> String {
        format!("{} {} {}\n", self.pid, self.start_ticks, self.hostname)
    }

    /// Reads a `.pid` file strictly; a partial line is `Partial`, never a
    /// record.
    pub fn parse(text: &str) -> Result<PidRecord, FormatError> {
        let line = one_line(text)?;
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 2 {
            return Err(FormatError::Partial(clip(text)));
        }
        let garbage = || FormatError::Garbage(clip(text));
        let pid: u32 = canonical_decimal(fields[0]).ok_or_else(garbage)?;
        let start_ticks: u64 = canonical_decimal(fields[1]).ok_or_else(garbage)?;
        if pid == 0 || fields.len() > 3 {
            return Err(garbage());
        }
        let hostname = fields.get(2).copied().unwrap_or("").to_owned();
        if hostname.len() > 255 || !hostname.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(garbage());
        }
        Ok(PidRecord {
            pid,
            start_ticks,
            hostname,
        })
    }
}

/// What the command's process tree used, from `wait4`/`getrusage` of the
/// launcher's reaped children.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// User plus system CPU time, milliseconds.
    pub cpu_ms: u64,
    /// Largest resident set of any one process of the tree, KiB.
    pub max_rss_kb: u64,
}

/// How the command ended: `<code> <cpu ms> <max rss KiB>`, then
/// ` <leftovers>` when the shim stopped any process the command left
/// behind. A record without the count (what shims of earlier versions
/// wrote, and what is written when nothing was left) means 0; an explicit
/// `0` is not the canonical form and is refused. A bare `<code>` (what the
/// wrapper of earlier versions wrote) is read as a code without usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitRecord {
    /// 0..=255; 128+N for a command ended by signal N.
    pub code: i32,
    /// What the command's tree used; `None` for a bare `<code>` record.
    pub usage: Option<Usage>,
    /// Processes the command left behind that the shim stopped (TERM,
    /// grace, KILL) before writing the record. Recorded with usage only:
    /// the bare form has no place for it.
    pub leftovers: u32,
}

/// Longest reason a `not-started` record carries.
pub const MAX_REASON: usize = 240;

/// The content of `<id>.code`, one line: how the command ended, or that the
/// shim could not start it at all (`not-started <reason>`: nothing ran).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    /// The command ran and ended.
    Exited(ExitRecord),
    /// The shim could not start the command (nothing ran); the reason.
    NotStarted(String),
}

const NOT_STARTED: &str = "not-started ";

impl OpResult {
    /// A not-started record; the reason is cut to [`MAX_REASON`] bytes of
    /// printable ASCII (anything else becomes `?`).
    pub fn not_started(reason: &str) -> OpResult {
        let clean: String = reason
            .chars()
            .map(|c| {
                if c == ' ' || c.is_ascii_graphic() {
                    c
                } else {
                    '?'
                }
            })
            .take(MAX_REASON)
            .collect();
        let clean = clean.trim();
        OpResult::NotStarted(if clean.is_empty() {
            "unknown".into()
        } else {
            clean.into()
        })
    }

    /// What the command's tree used, when the record carries it.
    pub fn usage(&self) -> Option<Usage> {
        match self {
            OpResult::Exited(e) => e.usage,
            OpResult::NotStarted(_) => None,
        }
    }

    /// Processes the command left behind that the shim stopped (0 when
    /// nothing ran or nothing was left).
    pub fn leftovers(&self) -> u32 {
        match self {
            OpResult::Exited(e) => e.leftovers,
            OpResult::NotStarted(_) => 0,
        }
    }

    /// The one `.code` line: the canonical form [`OpResult::parse`] accepts.
    pub fn render(&self) -> String {
        match self {
            OpResult::Exited(ExitRecord {
                code,
                usage: Some(u),
                leftovers: 0,
            }) => format!("{code} {} {}\n", u.cpu_ms, u.max_rss_kb),
            OpResult::Exited(ExitRecord {
                code,
                usage: Some(u),
                leftovers,
            }) => format!("{code} {} {} {leftovers}\n", u.cpu_ms, u.max_rss_kb),
            OpResult::Exited(ExitRecord {
                code, usage: None, ..
            }) => format!("{code}\n"),
            OpResult::NotStarted(reason) => format!("{NOT_STARTED}{reason}\n"),
        }
    }

    /// Reads a `.code` file strictly: only what [`OpResult::render`] writes.
    pub fn parse(text: &str) -> Result<OpResult, FormatError> {
        let line = one_line(text)?;
        let garbage = || FormatError::Garbage(clip(text));
        if let Some(reason) = line.strip_prefix(NOT_STARTED) {
            let ok = !reason.is_empty()
                && reason.len() <= MAX_REASON
                && reason == reason.trim()
                && reason.bytes().all(|b| b == b' ' || b.is_ascii_graphic());
            return if ok {
                Ok(OpResult::NotStarted(reason.to_owned()))
            } else {
                Err(garbage())
            };
        }
        let fields: Vec<&str> = line.split(' ').collect();
        let code = canonical_decimal::<i32>(fields[0])
            .filter(|c| (0..=255).contains(c))
            .ok_or_else(garbage)?;
        let (usage, leftovers) = match fields[1..] {
            [] => (None, 0),
            [cpu, rss, ref rest @ ..] if rest.len() <= 1 => {
                let usage = Usage {
                    cpu_ms: canonical_decimal(cpu).ok_or_else(garbage)?,
                    max_rss_kb: canonical_decimal(rss).ok_or_else(garbage)?,
                };
                // written only when some were stopped: `0` is not canonical
                let leftovers = match rest {
                    [n] => canonical_decimal(n)
                        .filter(|&n| n > 0)
                        .ok_or_else(garbage)?,
                    _ => 0,
                };
                (Some(usage), leftovers)
            }
            _ => return Err(garbage()),
        };
        Ok(OpResult::Exited(ExitRecord {
            code,
            usage,
            leftovers,
        }))
    }
}

/// An op handed to the resident launcher: `.ops/inbox/<id>.req`, written
/// by the kernel (temp + rename) after it won the op's exec claim. Fields
/// end with NUL: a tag, the hostname of the container meant to run it (all
/// containers of a run share its `.ops`), the op id, the run-as spec, the
/// log cap, then the argv (no NUL can be in any of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Only the launcher of the container with this hostname claims it.
    pub host: String,
    /// The op's id (a lowercase UUID).
    pub op_id: String,
    /// Who the command runs as, a [`crate::RunAs`] spelling.
    pub run_as: String,
    /// Bytes of output kept in `<id>.log` (at least 1).
    pub log_cap: u64,
    /// How its stdin is wired (SPEC §25).
    pub io: crate::Io,
    /// The command and its arguments (the first non-empty).
    pub argv: Vec<String>,
}

const REQUEST_TAG: &str = "opkernel-request-2";
/// A request with a stdin mode (after the log cap): launchers older than
/// SPEC §25 refuse it (the op is then `failed`, never started wrong).
const REQUEST_TAG_IO: &str = "opkernel-request-3";
/// Largest request file read (the kernel bounds an argv to 256 KiB).
pub const MAX_REQUEST: usize = 320 * 1024;

impl Request {
    /// The NUL-terminated fields as written to `<id>.req`.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let cap = self.log_cap.to_string();
        let io = self.io.spec();
        let head = match self.io {
            crate::Io::Null => vec![REQUEST_TAG, &self.host, &self.op_id, &self.run_as, &cap],
            _ => vec![
                REQUEST_TAG_IO,
                &self.host,
                &self.op_id,
                &self.run_as,
                &cap,
                &io,
            ],
        };
        for field in head.into_iter().chain(self.argv.iter().map(String::as_str)) {
            out.extend_from_slice(field.as_bytes());
            out.push(0);
        }
        out
    }

    /// Reads a request file strictly (at most [`MAX_REQUEST`] bytes).
    pub fn parse(bytes: &[u8]) -> Result<Request, String> {
        if bytes.len() > MAX_REQUEST {
            return Err(format!("request larger than {MAX_REQUEST} bytes"));
        }
        let body = bytes
            .strip_suffix(&[0])
            .ok_or("request does not end with its terminator")?;
        let mut fields = body.split(|&b| b == 0).map(std::str::from_utf8);
        let mut next = |what: &str| -> Result<&str, String> {
            fields
                .next()
                .ok_or_else(|| format!("request has no {what}"))?
                .map_err(|_| format!("request {what} is not utf-8"))
        };
        let with_io = match next("tag")? {
            REQUEST_TAG => false,
            REQUEST_TAG_IO => true,
            _ => return Err("not an opkernel request".into()),
        };
        let host = next("host")?.to_owned();
        if host.is_empty() || host.len() > 255 || !host.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!("bad host {:?}", clip(&host)));
        }
        let op_id = next("op id")?.to_owned();
        validate_op_id(&op_id)?;
        let run_as = next("run-as")?.to_owned();
        crate::user::RunAs::parse(&run_as)?;
        let cap = next("log cap")?;
        let log_cap = canonical_decimal::<u64>(cap)
            .filter(|&c| c > 0)
            .ok_or_else(|| format!("bad log cap {:?}", clip(cap)))?;
        let io = match with_io {
            true => match crate::Io::parse(next("stdin mode")?)? {
                crate::Io::Null => return Err("a request with a stdin mode names none".into()),
                io => io,
            },
            false => crate::Io::Null,
        };
        let argv = fields
            .map(|f| {
                f.map(str::to_owned)
                    .map_err(|_| "request argv is not utf-8".to_owned())
            })
            .collect::<Result<Vec<String>, String>>()?;
        if argv.first().is_none_or(String::is_empty) {
            return Err("request has no command".into());
        }
        Ok(Request {
            host,
            op_id,
            run_as,
            log_cap,
            io,
            argv,
        })
    }
}

/// A process that carries an op marker, as the probe saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkedProcess {
    /// The process's pid inside the container.
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat`: start time in clock ticks since boot.
    pub start_ticks: u64,
    /// The op whose marker the process carries.
    pub op_id: String,
}

impl MarkedProcess {
    /// One probe line: `<pid> <start ticks> <op id>\n`.
    pub fn render(&self) -> String {
        format!("{} {} {}\n", self.pid, self.start_ticks, self.op_id)
    }
}

/// The line that closes a complete probe or signaller listing.
pub const END_LINE: &str = "end";

/// Parses the probe listing; only a listing closed by its `end` line counts
/// (a probe that died mid-scan is no evidence of absence).
pub fn parse_probe(output: &str) -> Result<Vec<MarkedProcess>, String> {
    let mut procs = Vec::new();
    for line in output.lines() {
        if line == END_LINE {
            return Ok(procs);
        }
        let bad = || format!("bad probe line {:?}", clip(line));
        let mut f = line.split(' ');
        let (Some(pid), Some(start), Some(op), None) = (f.next(), f.next(), f.next(), f.next())
        else {
            return Err(bad());
        };
        validate_op_id(op).map_err(|_| bad())?;
        procs.push(MarkedProcess {
            pid: canonical_decimal(pid).filter(|&p| p > 0).ok_or_else(bad)?,
            start_ticks: canonical_decimal(start).ok_or_else(bad)?,
            op_id: op.to_owned(),
        });
    }
    Err("probe output ended before its end line".into())
}

/// Unix signals the kernel sends to an op's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: asks the tree to end; KILL follows after the grace.
    Term,
    /// SIGKILL: ends it.
    Kill,
    /// SIGINT: what Ctrl-C sends (SPEC §25).
    Int,
    /// SIGHUP: the terminal hung up; many servers reload on it.
    Hup,
    /// SIGQUIT: what Ctrl-\ sends.
    Quit,
    /// SIGUSR1.
    Usr1,
    /// SIGUSR2.
    Usr2,
}

impl Signal {
    /// Every signal an agent may send, by name.
    pub const ALL: [Signal; 7] = [
        Signal::Int,
        Signal::Term,
        Signal::Kill,
        Signal::Hup,
        Signal::Quit,
        Signal::Usr1,
        Signal::Usr2,
    ];

    /// The name on the signaller's command line (`TERM`, `KILL`, `INT`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Signal::Term => "TERM",
            Signal::Kill => "KILL",
            Signal::Int => "INT",
            Signal::Hup => "HUP",
            Signal::Quit => "QUIT",
            Signal::Usr1 => "USR1",
            Signal::Usr2 => "USR2",
        }
    }

    /// The signal of a name; `None` for any other.
    pub fn parse(name: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The signal's number for `kill(2)`.
    pub fn number(self) -> i32 {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
            Signal::Int => libc::SIGINT,
            Signal::Hup => libc::SIGHUP,
            Signal::Quit => libc::SIGQUIT,
            Signal::Usr1 => libc::SIGUSR1,
            Signal::Usr2 => libc::SIGUSR2,
        }
    }
}

/// One signaller line: `signalled <pid>\n`.
pub fn render_signalled(pid: u32) -> String {
    format!("signalled {pid}\n")
}

/// Pids reported as signalled; `None` unless the listing is complete and
/// every line is well formed.
pub fn parse_signalled(output: &str) -> Option<Vec<u32>> {
    let mut pids = Vec::new();
    for line in output.lines() {
        if line == END_LINE {
            return Some(pids);
        }
        pids.push(canonical_decimal(line.strip_prefix("signalled ")?)?);
    }
    None
}

/// Where a request handed to the launcher stands once the kernel asks for it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handback {
    /// Taken back (now or by an earlier attempt): the launcher never ran it.
    Withdrawn,
    /// The launcher claimed it: it runs (or ran) there, never elsewhere.
    Claimed,
    /// No request was ever renamed into place (the kernel stopped before
    /// that): nothing ran.
    NeverFiled,
}

#[cfg(test)]
#[path = "format_tests.rs"]
mod tests;
