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
    Empty,
    /// No trailing newline yet (or too few fields): a writer may be mid-way.
    Partial(String),
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
    pub hostname: String,
}

impl PidRecord {
    pub fn render(&self) -> String {
        format!("{} {} {}\n", self.pid, self.start_ticks, self.hostname)
    }

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

/// How the command ended: `<code> <cpu ms> <max rss KiB>`. A bare `<code>`
/// (what the wrapper of earlier versions wrote) is read as a code without
/// usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitRecord {
    /// 0..=255; 128+N for a command ended by signal N.
    pub code: i32,
    pub usage: Option<Usage>,
}

/// Longest reason a `not-started` record carries.
pub const MAX_REASON: usize = 240;

/// The content of `<id>.code`, one line: how the command ended, or that the
/// shim could not start it at all (`not-started <reason>`: nothing ran).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    Exited(ExitRecord),
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

    pub fn usage(&self) -> Option<Usage> {
        match self {
            OpResult::Exited(e) => e.usage,
            OpResult::NotStarted(_) => None,
        }
    }

    pub fn render(&self) -> String {
        match self {
            OpResult::Exited(ExitRecord {
                code,
                usage: Some(u),
            }) => format!("{code} {} {}\n", u.cpu_ms, u.max_rss_kb),
            OpResult::Exited(ExitRecord { code, usage: None }) => format!("{code}\n"),
            OpResult::NotStarted(reason) => format!("{NOT_STARTED}{reason}\n"),
        }
    }

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
        let usage = match fields[1..] {
            [] => None,
            [cpu, rss] => Some(Usage {
                cpu_ms: canonical_decimal(cpu).ok_or_else(garbage)?,
                max_rss_kb: canonical_decimal(rss).ok_or_else(garbage)?,
            }),
            _ => return Err(garbage()),
        };
        Ok(OpResult::Exited(ExitRecord { code, usage }))
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
    pub op_id: String,
    pub run_as: String,
    pub log_cap: u64,
    pub argv: Vec<String>,
}

const REQUEST_TAG: &str = "opkernel-request-2";
/// Largest request file read (the kernel bounds an argv to 256 KiB).
pub const MAX_REQUEST: usize = 320 * 1024;

impl Request {
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let cap = self.log_cap.to_string();
        let head = [REQUEST_TAG, &self.host, &self.op_id, &self.run_as, &cap];
        for field in head.into_iter().chain(self.argv.iter().map(String::as_str)) {
            out.extend_from_slice(field.as_bytes());
            out.push(0);
        }
        out
    }

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
        if next("tag")? != REQUEST_TAG {
            return Err("not an opkernel request".into());
        }
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
            argv,
        })
    }
}

/// A process that carries an op marker, as the probe saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkedProcess {
    pub pid: u32,
    pub start_ticks: u64,
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

    pub fn parse(name: &str) -> Option<Signal> {
        match name {
            "TERM" => Some(Signal::Term),
            "KILL" => Some(Signal::Kill),
            _ => None,
        }
    }

    pub fn number(self) -> i32 {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
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
    fn pid_records_round_trip_and_refuse_the_rest() {
        let rec = PidRecord {
            pid: 7,
            start_ticks: 12345,
            hostname: "c0ffee".into(),
        };
        assert_eq!(PidRecord::parse(&rec.render()), Ok(rec));
        assert_eq!(PidRecord::parse(""), Err(FormatError::Empty));
        assert!(matches!(
            PidRecord::parse("7 12"),
            Err(FormatError::Partial(_))
        ));
        for bad in [
            "0 1 h\n",
            "07 1 h\n",
            "7 -1 h\n",
            "7 1 h x\n",
            "7 1 h\u{7}\n",
        ] {
            assert!(
                matches!(PidRecord::parse(bad), Err(FormatError::Garbage(_))),
                "{bad:?}"
            );
        }
        assert_eq!(PidRecord::parse("7 1\n").map(|r| r.hostname), Ok("".into()));
    }

    #[test]
    fn results_carry_usage_read_the_old_form_and_say_not_started() {
        let exited = |code, usage| OpResult::Exited(ExitRecord { code, usage });
        let rec = exited(
            143,
            Some(Usage {
                cpu_ms: 2500,
                max_rss_kb: 10240,
            }),
        );
        assert_eq!(rec.render(), "143 2500 10240\n");
        assert_eq!(OpResult::parse(&rec.render()), Ok(rec));
        assert_eq!(OpResult::parse("3\n"), Ok(exited(3, None)));
        assert!(matches!(OpResult::parse("3"), Err(FormatError::Partial(_))));
        let failed = OpResult::not_started("cannot fork: Resource temporarily unavailable\n\u{1}é");
        assert_eq!(
            failed.render(),
            "not-started cannot fork: Resource temporarily unavailable???\n"
        );
        assert_eq!(OpResult::parse(&failed.render()), Ok(failed));
        assert_eq!(
            OpResult::not_started(&"x".repeat(999)).render().len(),
            12 + MAX_REASON + 1
        );
        for bad in [
            "256\n",
            "-1\n",
            "03\n",
            "3 1\n",
            "3 1 2 3\n",
            "3  1 2\n",
            "3 01 2\n",
            "3 1 2 \n",
            "3\n\n",
            " 3\n",
            "not-started \n",
            "not-started  x\n",
            "not-started x \n",
            "not-started x\ty\n",
            "not-startedx\n",
        ] {
            assert!(
                matches!(OpResult::parse(bad), Err(FormatError::Garbage(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn requests_round_trip_and_refuse_the_rest() {
        let req = Request {
            host: "c0ffee".into(),
            op_id: ID.into(),
            run_as: "1000:1000".into(),
            log_cap: 65536,
            argv: vec![
                "sh".into(),
                "-c".into(),
                "echo 'a\nb' \"$X\"".into(),
                String::new(),
                "end".into(),
            ],
        };
        let bytes = req.render();
        assert_eq!(Request::parse(&bytes), Ok(req.clone()));
        assert!(
            Request::parse(&bytes[..bytes.len() - 1]).is_err(),
            "unterminated"
        );
        let swap = |from: &str, to: &str| {
            let text = String::from_utf8(bytes.clone())
                .unwrap()
                .replacen(from, to, 1);
            Request::parse(text.as_bytes())
        };
        assert!(swap("opkernel-request-2", "opkernel-request-1").is_err());
        assert!(swap("c0ffee", "c0 ffee").is_err());
        assert!(swap(ID, "../../x").is_err());
        assert!(swap("1000:1000", "0:0").is_err());
        assert!(swap("65536", "0").is_err());
        assert!(swap("65536", "065536").is_err());
        let empty = Request {
            argv: vec![String::new()],
            ..req.clone()
        };
        assert!(Request::parse(&empty.render()).is_err());
        let none = Request {
            argv: vec![],
            ..req
        };
        assert!(Request::parse(&none.render()).is_err());
        assert!(Request::parse(&vec![b'x'; MAX_REQUEST + 1]).is_err());
    }

    #[test]
    fn probe_listings_parse_only_when_complete() {
        let p = MarkedProcess {
            pid: 12,
            start_ticks: 3456,
            op_id: ID.into(),
        };
        let out = format!("{}{}end\n", p.render(), p.render());
        assert_eq!(parse_probe(&out), Ok(vec![p.clone(), p.clone()]));
        assert_eq!(parse_probe("end\n"), Ok(vec![]));
        assert!(parse_probe(&p.render()).is_err());
        assert!(parse_probe("").is_err());
        assert!(parse_probe(&format!("12 3456 {ID} x\nend\n")).is_err());
        assert!(parse_probe("12 3456 not-an-op\nend\n").is_err());
        assert!(parse_probe(&format!("0 3456 {ID}\nend\n")).is_err());
    }

    #[test]
    fn signaller_output_needs_its_end() {
        let out = format!("{}{}end\n", render_signalled(5), render_signalled(7));
        assert_eq!(parse_signalled(&out), Some(vec![5, 7]));
        assert_eq!(parse_signalled("signalled 5\n"), None);
        assert_eq!(parse_signalled("signalled x\nend\n"), None);
        assert_eq!(parse_signalled("end\n"), Some(vec![]));
        assert_eq!(Signal::parse("TERM"), Some(Signal::Term));
        assert_eq!(Signal::parse("HUP"), None);
    }
}
