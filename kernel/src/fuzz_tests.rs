//! Property tests ("fuzz_*") of request parsing and of the output shown to
//! agents. `scripts/fuzz.sh` runs them with many more cases.

use proptest::prelude::*;

use crate::lifecycle::Status;
use crate::report_text::{cut_tail, render, MAX_REPORT_TEXT, TAIL_BYTES};
use crate::store::ReportItem;

fn status() -> impl Strategy<Value = Status> {
    proptest::sample::select(Status::ALL.to_vec())
}

proptest! {
    #[test]
    fn fuzz_tail_cut(log in proptest::collection::vec(any::<u8>(), 0..6000)) {
        let tail = cut_tail(&log);
        // lossy decoding may widen an invalid byte to 3 bytes, never more
        prop_assert!(tail.len() <= TAIL_BYTES * 3);
        if log.is_ascii() {
            prop_assert!(String::from_utf8_lossy(&log).ends_with(&tail));
        }
    }

    #[test]
    fn fuzz_report_render(
        items in proptest::collection::vec((status(), any::<Option<i32>>(), any::<bool>(), ".{0,40}", ".{0,300}"), 0..40),
        notes in proptest::collection::vec(".{0,100}", 0..4),
    ) {
        let resolved: Vec<ReportItem> = items
            .iter()
            .map(|(st, code, killed, msg, tail)| ReportItem {
                operation_id: "op".into(),
                command: vec!["x".into()],
                status: *st,
                exit_code: *code,
                killed: *killed,
                effect: None,
                message: Some(msg.clone()),
                duration_sec: 1.0,
                timeout_sec: 10,
                output_tail: Some(tail.clone()),
                kill_reason: killed.then(|| "cancel".to_owned()),
                denied_by: None,
                leftovers: if *killed { 2 } else { 0 },
            })
            .collect();
        let text = render(&resolved, &[], &notes, 0);
        prop_assert!(text.starts_with("[Background operations report]\n"));
        prop_assert!(text.ends_with("Incorporate these results and continue.\n"));
        prop_assert!(text.len() <= MAX_REPORT_TEXT + 40 * 200 + 4 * 400);
        // a lost op is never shown with an exit code
        for line in text.lines().filter(|l| l.contains(" lost: ")) {
            prop_assert!(!line.contains("exit_code="));
        }
    }

    #[test]
    fn fuzz_run_command_bodies(body in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = crate::surfaces::api::parse_run_command(&body);
    }

    #[test]
    fn fuzz_run_command_json(
        cmd in proptest::collection::vec(".{0,20}", 0..4),
        background in any::<bool>(),
        timeout in proptest::option::of(any::<i64>()),
        extra in proptest::option::of("[a-z]{1,8}"),
    ) {
        let mut v = serde_json::json!({"command": cmd, "background": background});
        if let Some(t) = timeout { v["timeout_sec"] = serde_json::json!(t); }
        if let Some(k) = &extra { v[k.as_str()] = serde_json::json!(1); }
        let parsed = crate::surfaces::api::parse_run_command(v.to_string().as_bytes());
        if extra.as_deref().is_some_and(|k| !matches!(k, "command" | "background")) {
            prop_assert!(parsed.is_err(), "unknown fields are refused");
        }
    }
}
