//! Pure rendering of `[Background operations report]` texts and of the
//! bounded output tail. No I/O here.

use crate::lifecycle::Status;
use serde::{Deserialize, Serialize};

/// One resolved op in a report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReportItem {
    /// The op's id (a UUID).
    pub operation_id: String,
    /// The op's argv, cut to [`MAX_VIEW_ARGV_BYTES`].
    pub command: Vec<String>,
    /// The op's terminal status.
    pub status: Status,
    /// The command's exit code; `None` when it has none (lost, failed, denied).
    pub exit_code: Option<i32>,
    /// A kill's signal reached the command.
    pub killed: bool,
    /// `uncertain` for a lost or timed-out op (it may or may not have done its
    /// work).
    pub effect: Option<String>,
    /// Why it was lost, failed or denied (the op's recorded error).
    pub message: Option<String>,
    /// Seconds from the op's start (after any approval) to its end.
    pub duration_sec: f64,
    /// The op's timeout, in seconds.
    pub timeout_sec: u64,
    /// The end of its output (at most [`TAIL_BYTES`]); `None` when none was
    /// kept.
    pub output_tail: Option<String>,
    /// Why a killed op was killed: `kill`, `timeout` or `cancel` (its run
    /// or an ancestor was cancelled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_reason: Option<String>,
    /// Who denied a denied op: `operator`, `timeout` or `kill`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied_by: Option<String>,
    /// Processes the command left behind that were stopped when it exited.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub leftovers: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One still-running op in a report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunningItem {
    /// The op's id (a UUID).
    pub operation_id: String,
    /// The op's argv, cut to [`MAX_VIEW_ARGV_BYTES`].
    pub command: Vec<String>,
    /// Seconds since the op started (or was admitted, while awaiting approval).
    pub running_sec: u64,
    /// The op's timeout, in seconds.
    pub timeout_sec: u64,
    /// Held for an operator's approval (`running_sec` is then its wait).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub awaiting_approval: bool,
}

/// One batched report for a run (SPEC §5): the results a drain delivered and
/// the text the agent reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Report {
    /// The id to acknowledge; `None` when a wait ended with nothing to deliver.
    pub report_id: Option<String>,
    /// The run the report is for.
    pub run_id: String,
    /// Ops whose result this report delivers (each in exactly one report).
    pub resolved: Vec<ReportItem>,
    /// The run's ops still live when the report was made.
    pub running: Vec<RunningItem>,
    /// Notes (steers) for the run, oldest first.
    pub notes: Vec<String>,
    /// Results and notes held back for the next report by the size bounds.
    #[serde(default)]
    pub more_pending: usize,
    /// The `[Background operations report]` text the agent reads.
    pub text: String,
}

/// Bytes of output kept as an op's tail.
pub const TAIL_BYTES: usize = 2048;
/// Lines of output tail shown per op in a report.
pub const TAIL_LINES: usize = 20;
/// Bound of a report's text; tails that would pass it are left out.
pub const MAX_REPORT_TEXT: usize = 64 * 1024;
/// Resolved ops in one report; the rest wait for the next one.
pub const MAX_REPORT_ITEMS: usize = 100;
/// Bytes of notes in one report; notes past it wait for the next one
/// (a note is never cut: each is at most [`MAX_NOTE_BYTES`]).
pub const MAX_REPORT_NOTE_BYTES: usize = 32 * 1024;
/// Bytes of one note.
pub const MAX_NOTE_BYTES: usize = 16 * 1024;
/// Still-running ops listed by name in one report.
pub const MAX_RUNNING_LINES: usize = 50;
/// Bytes of an op's argv kept in reports and list views.
pub const MAX_VIEW_ARGV_BYTES: usize = 4 * 1024;

/// An argv cut to at most `max` bytes (whole arguments first, then a cut
/// last argument, on a char boundary), and whether anything was cut.
pub fn bounded_argv(argv: &[String], max: usize) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    let mut used = 0;
    for arg in argv {
        if used + arg.len() <= max {
            used += arg.len();
            out.push(arg.clone());
            continue;
        }
        let mut end = max - used;
        while !arg.is_char_boundary(end) {
            end -= 1;
        }
        out.push(format!("{}…", &arg[..end]));
        return (out, true);
    }
    (out, false)
}

/// The last `TAIL_BYTES` of `log`, as text, cut at a line start when the
/// cut falls inside a line (unless that leaves nothing).
pub fn cut_tail(log: &[u8]) -> String {
    let start = log.len().saturating_sub(TAIL_BYTES);
    let mut slice = &log[start..];
    if start > 0 {
        if let Some(nl) = slice.iter().position(|&b| b == b'\n') {
            if nl + 1 < slice.len() {
                slice = &slice[nl + 1..];
            }
        }
    }
    String::from_utf8_lossy(slice).into_owned()
}

/// RFC 3339 UTC time of a unix-millisecond timestamp.
pub fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // civil-from-days (Howard Hinnant)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// `4m12s`, `12s`, `1h02m05s`.
pub fn human_duration(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s:02}s"),
        _ => format!("{h}h{m:02}m{s:02}s"),
    }
}

/// Shell-like one-line rendering of an argv, shortened for lists.
pub fn command_line(command: &[String]) -> String {
    let joined = command
        .iter()
        .map(|a| {
            if !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+".contains(&b))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    let clipped: String = joined.chars().take(120).collect();
    if clipped.len() < joined.len() {
        format!("{clipped}…")
    } else {
        clipped
    }
}

/// [`command_line`] of an argv as the API shows it (a JSON array).
pub fn command_line_json(argv: &serde_json::Value) -> String {
    let argv: Vec<String> = argv
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    command_line(&argv)
}

/// The headline of one resolved op, then how many processes it left
/// behind were stopped when it exited (SPEC §21), if any.
pub fn resolution_line(item: &ReportItem) -> String {
    let mut line = headline(item);
    match item.leftovers {
        0 => {}
        1 => line.push_str(" (1 leftover process stopped)"),
        n => line.push_str(&format!(" ({n} leftover processes stopped)")),
    }
    line
}

fn headline(item: &ReportItem) -> String {
    let id = &item.operation_id;
    let took = human_duration(item.duration_sec.round() as u64);
    match item.status {
        Status::Completed if item.killed => format!(
            "- {id} killed{}: exit_code={} ({took})",
            if item.kill_reason.as_deref() == Some("cancel") {
                " (run cancelled)"
            } else {
                ""
            },
            item.exit_code.map_or("?".to_owned(), |c| c.to_string())
        ),
        Status::Completed => format!(
            "- {id} finished: exit_code={} ({took})",
            item.exit_code.map_or("?".to_owned(), |c| c.to_string())
        ),
        Status::TimedOut => format!("- {id} timed out after {}s (killed)", item.timeout_sec),
        Status::Lost => format!(
            "- {id} lost: {} (effect uncertain)",
            item.message.as_deref().unwrap_or("no exit code recorded")
        ),
        Status::Failed => format!(
            "- {id} failed to start: {} (nothing ran)",
            item.message.as_deref().unwrap_or("unknown error")
        ),
        Status::Denied if item.denied_by.as_deref() == Some("operator") => format!(
            "- {id} denied by operator: {}",
            item.message.as_deref().unwrap_or("no reason given")
        ),
        Status::Denied => format!(
            "- {id} denied: {} (nothing ran)",
            item.message.as_deref().unwrap_or("not approved")
        ),
        Status::AwaitingApproval => format!("- {id} is awaiting approval"),
        Status::Starting | Status::Running => format!("- {id} is still running"),
    }
}

/// The full report text. `more` counts results and notes held back for
/// the next report (by the item and note bounds).
pub fn render(
    resolved: &[ReportItem],
    running: &[RunningItem],
    notes: &[String],
    more: usize,
) -> String {
    let mut out = String::from("[Background operations report]\n");
    if !notes.is_empty() {
        out.push_str("Notes from the user:\n");
        for note in notes {
            out.push_str(&format!("- {}\n", note.replace('\n', "\n  ")));
        }
    }
    for item in resolved {
        out.push_str(&resolution_line(item));
        out.push('\n');
        let Some(tail) = item.output_tail.as_deref().filter(|t| !t.trim().is_empty()) else {
            continue;
        };
        let lines: Vec<&str> = tail.trim_end_matches('\n').lines().collect();
        let shown = &lines[lines.len().saturating_sub(TAIL_LINES)..];
        let block: String = shown.iter().map(|l| format!("  {l}\n")).collect();
        if out.len() + block.len() > MAX_REPORT_TEXT {
            out.push_str(&format!(
                "  (output tail left out to keep this report short; see `opkernel logs {}`)\n",
                item.operation_id
            ));
        } else {
            out.push_str("  output tail:\n");
            out.push_str(&block);
        }
    }
    if more > 0 {
        out.push_str(&format!(
            "({more} more results or notes wait for the next report: ask for it right after this one.)\n"
        ));
    }
    if !running.is_empty() {
        out.push_str("Still running in the background:\n");
        for r in running.iter().take(MAX_RUNNING_LINES) {
            if r.awaiting_approval {
                out.push_str(&format!(
                    "- {} `{}` (awaiting approval for {}; it starts only if an operator approves it)\n",
                    r.operation_id,
                    command_line(&r.command),
                    human_duration(r.running_sec),
                ));
                continue;
            }
            out.push_str(&format!(
                "- {} `{}` (running {}, timeout {}s)\n",
                r.operation_id,
                command_line(&r.command),
                human_duration(r.running_sec),
                r.timeout_sec
            ));
        }
        if running.len() > MAX_RUNNING_LINES {
            out.push_str(&format!(
                "- … and {} more (see `opkernel ps`)\n",
                running.len() - MAX_RUNNING_LINES
            ));
        }
    }
    out.push_str("Incorporate these results and continue.\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(
        status: Status,
        exit_code: Option<i32>,
        killed: bool,
        message: Option<&str>,
        tail: Option<&str>,
    ) -> ReportItem {
        ReportItem {
            operation_id: "op1".into(),
            command: vec!["true".into()],
            status,
            exit_code,
            killed,
            effect: None,
            message: message.map(str::to_owned),
            duration_sec: 252.0,
            timeout_sec: 900,
            output_tail: tail.map(str::to_owned),
            kill_reason: None,
            denied_by: None,
            leftovers: 0,
        }
    }

    #[test]
    fn report_text_follows_the_spec() {
        let resolved = vec![
            item(
                Status::Completed,
                Some(0),
                false,
                None,
                Some("added 1284 packages in 42s\n"),
            ),
            item(Status::TimedOut, Some(137), true, None, None),
            item(
                Status::Lost,
                None,
                false,
                Some("container unreachable for 60s"),
                None,
            ),
        ];
        let running = vec![RunningItem {
            operation_id: "op2".into(),
            command: vec![
                "docker".into(),
                "build".into(),
                "-t".into(),
                "app".into(),
                ".".into(),
            ],
            running_sec: 130,
            timeout_sec: 900,
            awaiting_approval: false,
        }];
        let text = render(&resolved, &running, &[], 0);
        assert_eq!(
            text,
            "[Background operations report]\n\
             - op1 finished: exit_code=0 (4m12s)\n  output tail:\n  added 1284 packages in 42s\n\
             - op1 timed out after 900s (killed)\n\
             - op1 lost: container unreachable for 60s (effect uncertain)\n\
             Still running in the background:\n\
             - op2 `docker build -t app .` (running 2m10s, timeout 900s)\n\
             Incorporate these results and continue.\n"
        );
    }

    #[test]
    fn stopped_leftovers_are_counted_on_the_op_line() {
        let with = |status, code, killed, leftovers| ReportItem {
            leftovers,
            ..item(status, code, killed, None, None)
        };
        let text = render(
            &[
                with(Status::Completed, Some(0), false, 3),
                with(Status::Completed, Some(0), false, 1),
                with(Status::Completed, Some(0), false, 0),
                with(Status::Completed, Some(143), true, 2),
                with(Status::TimedOut, Some(137), true, 1),
            ],
            &[],
            &[],
            0,
        );
        assert_eq!(
            text,
            "[Background operations report]\n\
             - op1 finished: exit_code=0 (4m12s) (3 leftover processes stopped)\n\
             - op1 finished: exit_code=0 (4m12s) (1 leftover process stopped)\n\
             - op1 finished: exit_code=0 (4m12s)\n\
             - op1 killed: exit_code=143 (4m12s) (2 leftover processes stopped)\n\
             - op1 timed out after 900s (killed) (1 leftover process stopped)\n\
             Incorporate these results and continue.\n"
        );
    }

    #[test]
    fn killed_failed_and_notes_are_rendered() {
        let text = render(
            &[
                item(Status::Completed, Some(143), true, None, None),
                item(Status::Failed, None, false, Some("no such image"), None),
            ],
            &[],
            &["use the staging db".into()],
            0,
        );
        assert!(text.contains("Notes from the user:\n- use the staging db\n"));
        assert!(text.contains("- op1 killed: exit_code=143 (4m12s)"));
        assert!(text.contains("- op1 failed to start: no such image (nothing ran)"));
        assert!(!text.contains("Still running"));
    }

    #[test]
    fn report_text_is_bounded() {
        let tail = "x".repeat(2000);
        let many: Vec<_> = (0..200)
            .map(|_| item(Status::Completed, Some(0), false, None, Some(&tail)))
            .collect();
        let text = render(&many, &[], &[], 0);
        // tails stop at the bound; every op keeps its one headline line
        assert!(
            text.len() < MAX_REPORT_TEXT + many.len() * 120,
            "{}",
            text.len()
        );
        assert_eq!(text.matches("- op1 finished").count(), 200);
        assert!(text.contains("output tail left out"));
    }

    #[test]
    fn held_back_results_and_long_running_lists_are_marked() {
        let running: Vec<_> = (0..60)
            .map(|i| RunningItem {
                operation_id: format!("op{i}"),
                command: vec!["sleep".into(), "9".into()],
                running_sec: 1,
                timeout_sec: 9,
                awaiting_approval: false,
            })
            .collect();
        let text = render(&[], &running, &[], 7);
        assert!(text.contains("(7 more results or notes wait for the next report"));
        assert_eq!(text.matches("`sleep 9`").count(), MAX_RUNNING_LINES);
        assert!(text.contains("- … and 10 more"));
    }

    #[test]
    fn argv_views_are_bounded() {
        let argv = vec!["sh".to_owned(), "-c".to_owned(), "é".repeat(300_000)];
        let (cut, was_cut) = bounded_argv(&argv, MAX_VIEW_ARGV_BYTES);
        assert!(was_cut);
        assert_eq!(&cut[..2], &argv[..2]);
        assert!(cut.iter().map(String::len).sum::<usize>() <= MAX_VIEW_ARGV_BYTES + 3);
        assert!(cut[2].ends_with('…'));
        let short = vec!["true".to_owned()];
        assert_eq!(bounded_argv(&short, 10), (short.clone(), false));
    }

    #[test]
    fn tail_cut_keeps_the_end_and_whole_lines() {
        assert_eq!(cut_tail(b"a\nb\n"), "a\nb\n");
        let mut log = vec![b'y'; 5000];
        log.extend_from_slice(b"\nlast line\n");
        let tail = cut_tail(&log);
        assert!(tail.ends_with("last line\n"));
        assert!(tail.len() <= TAIL_BYTES);
        assert_eq!(cut_tail(b"\xff\xfe"), "\u{fffd}\u{fffd}");
    }

    #[test]
    fn durations_and_commands() {
        assert_eq!(human_duration(0), "0s");
        assert_eq!(human_duration(252), "4m12s");
        assert_eq!(human_duration(3725), "1h02m05s");
        assert_eq!(
            command_line(&["bash".into(), "-lc".into(), "yarn install".into()]),
            "bash -lc 'yarn install'"
        );
    }
}
