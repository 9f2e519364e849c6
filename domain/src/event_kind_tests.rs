//! Every kind's wire string and payload, pinned: the journal's `kind` and
//! `data` columns and the API's event items must not change.

use serde_json::json;

use super::*;
use crate::runs::{Budget, Envelope, OnTimeout};

fn envelope() -> Envelope {
    serde_json::from_value(json!({
        "max_timeout_sec": 600, "memory_bytes": 536870912, "cpus": 1.5,
        "pids_limit": 256, "network": "none", "max_live_ops": 8, "max_children": 4
    }))
    .unwrap()
}

/// One event of each kind, with its wire string and its `data` exactly
/// as the journal stores it (keys in order, as before kinds were typed).
fn every_kind() -> Vec<(EventKind, &'static str, &'static str)> {
    vec![
        (
            EventKind::ToolStarted(ToolStarted {
                command: vec!["bash".into(), "-lc".into(), "make".into()],
                background: true,
                timeout_sec: 900,
                schedule_id: None,
                origin: None,
            }),
            "tool.started",
            r#"{"background":true,"command":["bash","-lc","make"],"schedule_id":null,"timeout_sec":900}"#,
        ),
        (
            EventKind::ToolCompleted(ToolCompleted {
                background: true,
                exit_code: Some(143),
                killed: true,
                op_seconds: Some(1.25),
                cpu_seconds: None,
            }),
            "tool.completed",
            r#"{"background":true,"cpu_seconds":null,"exit_code":143,"killed":true,"op_seconds":1.25}"#,
        ),
        (
            EventKind::ToolFailed(ToolFailed {
                background: false,
                status: "lost".into(),
                effect: Some("uncertain".into()),
                exit_code: None,
                killed: false,
                error: Some("container unreachable for 60s".into()),
                op_seconds: Some(61.0),
            }),
            "tool.failed",
            r#"{"background":false,"effect":"uncertain","error":"container unreachable for 60s","exit_code":null,"killed":false,"op_seconds":61.0,"status":"lost"}"#,
        ),
        (
            EventKind::NoteReceived(NoteReceived {
                note_id: 7,
                bytes: 12,
            }),
            "note.received",
            r#"{"bytes":12,"note_id":7}"#,
        ),
        (
            EventKind::ReportDelivered(ReportDelivered {
                report_id: "r-1".into(),
                operation_ids: vec!["op-1".into(), "op-2".into()],
                notes: 1,
            }),
            "report.delivered",
            r#"{"notes":1,"operation_ids":["op-1","op-2"],"report_id":"r-1"}"#,
        ),
        (
            EventKind::RunPaused(RunChanged::by("operator")),
            "run.paused",
            r#"{"by":"operator"}"#,
        ),
        (
            EventKind::RunPaused(RunChanged {
                over: Some(None),
                ..RunChanged::by("run:a")
            }),
            "run.paused",
            r#"{"by":"run:a","over":null}"#,
        ),
        (
            EventKind::RunPaused(RunChanged {
                over: Some(Some("run:a.b".into())),
                ..RunChanged::by("run:a")
            }),
            "run.paused",
            r#"{"by":"run:a","over":"run:a.b"}"#,
        ),
        (
            EventKind::RunResumed(RunChanged::by("run:a")),
            "run.resumed",
            r#"{"by":"run:a"}"#,
        ),
        (
            EventKind::RunCompleted(RunChanged {
                summary: Some("done".into()),
                ..RunChanged::by("run:a")
            }),
            "run.completed",
            r#"{"by":"run:a","summary":"done"}"#,
        ),
        (
            EventKind::RunCancelled(RunChanged {
                cancelled_with: Some("a".into()),
                ..RunChanged::by("operator")
            }),
            "run.cancelled",
            r#"{"by":"operator","cancelled_with":"a"}"#,
        ),
        (
            EventKind::RunChildCreated(ChildCreated {
                child_run_id: "a.b".into(),
                envelope: Some(envelope()),
                budget: Budget {
                    tokens: Some(1000),
                    ..Budget::default()
                },
            }),
            "run.child_created",
            r#"{"budget":{"tokens":1000},"child_run_id":"a.b","envelope":{"cpus":1.5,"max_children":4,"max_live_ops":8,"max_timeout_sec":600,"memory_bytes":536870912,"network":"none","pids_limit":256}}"#,
        ),
        (
            EventKind::UsageRecorded(ModelUsage {
                model: "m".into(),
                input_tokens: 10,
                output_tokens: 5,
                cost_micros: 30,
            }),
            "usage.recorded",
            r#"{"cost_micros":30,"input_tokens":10,"model":"m","output_tokens":5}"#,
        ),
        (
            EventKind::ApprovalRequested(ApprovalRequested {
                rule: "^rm ".into(),
                timeout_sec: Some(60),
                on_timeout: OnTimeout::Escalate,
            }),
            "approval.requested",
            r#"{"on_timeout":"escalate","rule":"^rm ","timeout_sec":60}"#,
        ),
        (
            EventKind::ApprovalGranted(ApprovalGranted {
                by: "operator".into(),
                waited_sec: 3,
            }),
            "approval.granted",
            r#"{"by":"operator","waited_sec":3}"#,
        ),
        (
            EventKind::ApprovalDenied(ApprovalDenied {
                reason: "no".into(),
                by: "timeout".into(),
            }),
            "approval.denied",
            r#"{"by":"timeout","reason":"no"}"#,
        ),
        (
            EventKind::ApprovalEscalated(ApprovalEscalated {
                waited_sec: 60,
                still_waiting: true,
            }),
            "approval.escalated",
            r#"{"still_waiting":true,"waited_sec":60}"#,
        ),
        (
            EventKind::ToolLateResult(ToolLateResult {
                exit_code: 143,
                ended_at: 1_795_910_400_000,
                node: "n2".into(),
                stopped_on_rejoin: true,
            }),
            "tool.late_result",
            r#"{"ended_at":1795910400000,"exit_code":143,"node":"n2","stopped_on_rejoin":true}"#,
        ),
        (
            EventKind::ToolStdin(ToolStdin {
                bytes: 4,
                eof: true,
            }),
            "tool.stdin",
            r#"{"bytes":4,"eof":true}"#,
        ),
        (
            EventKind::FileWritten(FileWritten {
                path: "/scratch/a.txt".into(),
                bytes: 3,
            }),
            "file.written",
            r#"{"bytes":3,"path":"/scratch/a.txt"}"#,
        ),
        (
            EventKind::RunForked(RunForked {
                from: "r@v1".into(),
                bytes: 9,
                consistent: true,
            }),
            "run.forked",
            r#"{"bytes":9,"consistent":true,"from":"r@v1"}"#,
        ),
        (
            EventKind::SnapshotMade(SnapshotMade {
                name: "v1".into(),
                bytes: 9,
            }),
            "snapshot.made",
            r#"{"bytes":9,"name":"v1"}"#,
        ),
        (
            EventKind::NetDenied(NetDenied {
                host: "evil.org".into(),
                port: 443,
            }),
            "net.denied",
            r#"{"host":"evil.org","port":443}"#,
        ),
        (
            EventKind::NetPolicy(NetPolicy {
                allow: vec!["pypi.org".into()],
                by: "run:r".into(),
                from_run: "r".into(),
            }),
            "net.policy",
            r#"{"allow":["pypi.org"],"by":"run:r","from_run":"r"}"#,
        ),
        (
            EventKind::ToolNudged(ToolNudged { bytes: 6 }),
            "tool.nudged",
            r#"{"bytes":6}"#,
        ),
        (
            EventKind::ToolSignalled(ToolSignalled {
                signal: "INT".into(),
                processes: 1,
            }),
            "tool.signalled",
            r#"{"processes":1,"signal":"INT"}"#,
        ),
        (
            EventKind::ScheduleFired(ScheduleFired {
                schedule_id: "s".into(),
                due_at: "2026-11-29T00:00:00.000Z".into(),
                missed_slots: 2,
            }),
            "schedule.fired",
            r#"{"due_at":"2026-11-29T00:00:00.000Z","missed_slots":2,"schedule_id":"s"}"#,
        ),
        (
            EventKind::ScheduleSkipped(ScheduleSkipped::slots(
                "s",
                "previous still running",
                "2026-11-29T00:00:00.000Z".into(),
                3,
            )),
            "schedule.skipped",
            r#"{"due_at":"2026-11-29T00:00:00.000Z","reason":"previous still running","schedule_id":"s","slots":3}"#,
        ),
        (
            EventKind::ScheduleSkipped(ScheduleSkipped::ended("s", "run cancelled")),
            "schedule.skipped",
            r#"{"disabled":true,"reason":"run cancelled","schedule_id":"s"}"#,
        ),
        (
            EventKind::ScheduleSkipped(ScheduleSkipped::postponed("s", "run paused", 5)),
            "schedule.skipped",
            r#"{"reason":"run paused","retry_in_sec":5,"schedule_id":"s"}"#,
        ),
    ]
}

#[test]
fn every_kind_has_its_wire_string_and_payload() {
    for (kind, name, data) in every_kind() {
        assert_eq!(kind.name(), name);
        // the serde tag and the journal's kind column agree
        let tagged = serde_json::to_value(&kind).unwrap();
        assert_eq!(tagged["kind"], name, "{name}");
        assert_eq!(kind.data().unwrap().to_string(), data, "{name}");
        // and it reads back as itself from the journal's two columns
        let back = EventKind::from_parts(name, serde_json::from_str(data).unwrap()).unwrap();
        assert_eq!(back, kind, "{name}");
    }
}

#[test]
fn an_event_item_is_seq_at_operation_id_kind_and_data() {
    let event = Event {
        seq: 12,
        at: 1_795_910_400_000,
        operation_id: Some("op-1".into()),
        kind: EventKind::NoteReceived(NoteReceived {
            note_id: 7,
            bytes: 12,
        }),
    };
    let wire = r#"{"seq":12,"at":1795910400000,"operation_id":"op-1","kind":"note.received","data":{"note_id":7,"bytes":12}}"#;
    assert_eq!(serde_json::to_string(&event).unwrap(), wire);
    assert_eq!(serde_json::from_str::<Event>(wire).unwrap(), event);
    let none: Event = serde_json::from_value(json!({
        "seq": 1, "at": 2, "operation_id": null, "kind": "run.paused", "data": {"by": "operator"}
    }))
    .unwrap();
    assert_eq!(none.kind, EventKind::RunPaused(RunChanged::by("operator")));
}

#[test]
fn unknown_kinds_and_wrong_payloads_are_refused() {
    assert!(EventKind::from_parts("tool.exploded", json!({})).is_err());
    assert!(EventKind::from_parts("tool.started", json!({"background": "yes"})).is_err());
    assert!(EventKind::from_parts("approval.requested", json!({"rule": "x"})).is_err());
}

#[test]
fn rows_written_before_a_field_existed_still_read() {
    // tool.completed before cpu_seconds, tool.started before schedule_id
    let completed = EventKind::from_parts(
        "tool.completed",
        json!({"background": true, "exit_code": 0, "killed": false, "op_seconds": 1.0}),
    )
    .unwrap();
    let EventKind::ToolCompleted(completed) = completed else {
        panic!("{completed:?}")
    };
    assert_eq!(completed.cpu_seconds, None);
    let started = EventKind::from_parts(
        "tool.started",
        json!({"command": ["true"], "background": false, "timeout_sec": 5}),
    )
    .unwrap();
    assert_eq!(started.resolution_background(), None);
    // a pause with no pauser to take over from keeps its explicit null
    let paused = EventKind::from_parts("run.paused", json!({"by": "x", "over": null})).unwrap();
    assert_eq!(paused.data().unwrap(), json!({"by": "x", "over": null}));
    let plain = EventKind::from_parts("run.paused", json!({"by": "x"})).unwrap();
    assert_eq!(plain.data().unwrap(), json!({"by": "x"}));
}
