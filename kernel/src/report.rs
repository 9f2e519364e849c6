//! Pure rendering of `[Background operations report]` texts and of the
//! bounded output tail. No I/O here.

use crate::lifecycle::Status;
use crate::store::{ReportItem, RunningItem};

/// Bytes of output kept as an op's tail.
pub const TAIL_BYTES: usize = 2048;
/// Lines of output tail shown per op in a report.
pub const TAIL_LINES: usize = 20;
/// Bound of a report's text; tails that would pass it are left out.
pub const MAX_REPORT_TEXT: usize = 64 * 1024;

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

/// The headline of one resolved op.
pub fn resolution_line(item: &ReportItem) -> String {
    let id = &item.operation_id;
    let took = human_duration(item.duration_sec.round() as u64);
    match item.status {
        Status::Completed if item.killed => format!(
            "- {id} killed: exit_code={} ({took})",
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
        Status::Starting | Status::Running => format!("- {id} is still running"),
    }
}

/// The full report text.
pub fn render(resolved: &[ReportItem], running: &[RunningItem], notes: &[String]) -> String {
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
    if !running.is_empty() {
        out.push_str("Still running in the background:\n");
        for r in running {
            out.push_str(&format!(
                "- {} `{}` (running {}, timeout {}s)\n",
                r.operation_id,
                command_line(&r.command),
                human_duration(r.running_sec),
                r.timeout_sec
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
        }];
        let text = render(&resolved, &running, &[]);
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
    fn killed_failed_and_notes_are_rendered() {
        let text = render(
            &[
                item(Status::Completed, Some(143), true, None, None),
                item(Status::Failed, None, false, Some("no such image"), None),
            ],
            &[],
            &["use the staging db".into()],
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
        let text = render(&many, &[], &[]);
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
