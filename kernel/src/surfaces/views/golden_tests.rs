//! One golden test per view: a view with fixed values serializes to this
//! exact JSON (the wire format, field names from the SPEC), and the JSON
//! reads back as the same view (what the CLI and MCP do).

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;

use super::*;
use crate::lifecycle::Status;
use crate::runs::{Budget, Envelope, RunState};
use crate::runtime::reaper::{ReapAction, ReapDecision};
use crate::store::{ReportItem, RunningItem};
use crate::timing::ScheduleState;

/// `view` is `wire` on the wire, and `wire` reads back as `view`.
fn golden<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(view: &T, wire: &str) {
    assert_eq!(serde_json::to_string(view).unwrap(), wire);
    assert_eq!(&serde_json::from_str::<T>(wire).unwrap(), view);
}

const OP: &str = concat!(
    r#"{"operation_id":"7d0c5c1e-3c39-4bb4-a2a5-0d3f2f6a9b10","run_id":"agent-1","#,
    r#""command":["bash","-lc","make"],"command_truncated":false,"background":true,"#,
    r#""status":"awaiting_approval","live":true,"exit_code":null,"killed":false,"effect":null,"#,
    r#""attempt":0,"container_id":null,"pid":null,"created_at":"2026-11-29T00:00:00.000Z","#,
    r#""started_at":null,"heartbeat_at":null,"finished_at":null,"duration_sec":4.5,"#,
    r#""timeout_sec":900,"kill_requested":false,"output_tail":null,"log_sha256":null,"#,
    r#""log_size":null,"cpu_ms":null,"max_rss_kb":null,"leftovers_stopped":0,"#,
    r#""message":"Awaiting operator approval","delivered":false,"report_id":null,"#,
    r#""approval":{"rule":"^make","timeout_sec":60,"on_timeout":"escalate","#,
    r#""escalated_at":null,"decided_by":null,"decided_at":null},"schedule_id":"sch-1","#,
    r#""origin":{"surface":"mcp","channel":"claude-code 2.1.0 session 3f2a","principal":"run:r1","#,
    r#""route":"POST /v1/runs/{run}/tools/run_command"}}"#
);

fn op() -> OpView {
    OpView {
        operation_id: "7d0c5c1e-3c39-4bb4-a2a5-0d3f2f6a9b10".into(),
        run_id: "agent-1".into(),
        command: vec!["bash".into(), "-lc".into(), "make".into()],
        command_truncated: false,
        background: true,
        status: Status::AwaitingApproval,
        live: true,
        exit_code: None,
        killed: false,
        effect: None,
        attempt: 0,
        container_id: None,
        pid: None,
        created_at: "2026-11-29T00:00:00.000Z".into(),
        started_at: None,
        heartbeat_at: None,
        finished_at: None,
        duration_sec: 4.5,
        timeout_sec: 900,
        kill_requested: false,
        output_tail: None,
        log_sha256: None,
        log_size: None,
        cpu_ms: None,
        max_rss_kb: None,
        leftovers_stopped: 0,
        message: Some("Awaiting operator approval".into()),
        delivered: false,
        report_id: None,
        output: None,
        running: None,
        next_offset: None,
        stdin: false,
        tty: false,
        approval: Some(ApprovalView {
            rule: "^make".into(),
            timeout_sec: Some(60),
            on_timeout: Some("escalate".into()),
            escalated_at: None,
            decided_by: None,
            decided_at: None,
        }),
        schedule_id: Some("sch-1".into()),
        node: None,
        origin: Some(
            crate::origin::Origin::new(
                crate::origin::Surface::Mcp,
                "claude-code 2.1.0 session 3f2a",
                "run:r1",
            )
            .with_route("POST /v1/runs/{run}/tools/run_command"),
        ),
    }
}

#[test]
fn op_view() {
    golden(&op(), OP);
    // a finished foreground op: its output, no approval, no schedule
    let done = OpView {
        status: Status::Completed,
        live: false,
        exit_code: Some(0),
        output: Some("hi\n".into()),
        approval: None,
        schedule_id: None,
        ..op()
    };
    let wire = serde_json::to_value(&done).unwrap();
    assert_eq!(wire["output"], "hi\n");
    assert_eq!(wire["live"], false);
    assert!(wire.get("approval").is_none() && wire.get("schedule_id").is_none());
    // on a cluster node the view names the op's node
    let placed = OpView {
        node: Some("n2".into()),
        ..op()
    };
    assert_eq!(serde_json::to_value(&placed).unwrap()["node"], "n2");
    assert!(
        wire.get("node").is_none(),
        "a single kernel's op names none"
    );
    // an answer from a kernel older than `live` still reads (a client
    // upgraded before its daemon must not fail a start that happened)
    let mut old: serde_json::Value = serde_json::from_str(OP).unwrap();
    old.as_object_mut().unwrap().remove("live");
    let read: OpView = serde_json::from_value(old).unwrap();
    assert!(!read.live);
    assert_eq!(read.is_live(), op().is_live());
    assert!(op().is_live() && !done.is_live());
}

#[test]
fn op_list() {
    let list = OpList {
        operations: vec![op()],
    };
    golden(&list, &format!(r#"{{"operations":[{OP}]}}"#));
}

fn report() -> Report {
    Report {
        report_id: Some("r-1".into()),
        run_id: "agent-1".into(),
        resolved: vec![ReportItem {
            operation_id: "op-1".into(),
            command: vec!["true".into()],
            status: Status::Completed,
            exit_code: Some(0),
            killed: false,
            effect: None,
            message: None,
            duration_sec: 1.5,
            timeout_sec: 900,
            output_tail: Some("ok".into()),
            kill_reason: None,
            denied_by: None,
            leftovers: 0,
        }],
        running: vec![RunningItem {
            operation_id: "op-2".into(),
            command: vec!["sleep".into(), "9".into()],
            running_sec: 3,
            timeout_sec: 60,
            awaiting_approval: false,
        }],
        notes: vec!["steer".into()],
        more_pending: 0,
        text: "[Background operations report]\n".into(),
    }
}

const REPORT: &str = concat!(
    r#"{"report_id":"r-1","run_id":"agent-1","resolved":[{"operation_id":"op-1","command":["true"],"#,
    r#""status":"completed","exit_code":0,"killed":false,"effect":null,"message":null,"#,
    r#""duration_sec":1.5,"timeout_sec":900,"output_tail":"ok"}],"running":[{"operation_id":"op-2","#,
    r#""command":["sleep","9"],"running_sec":3,"timeout_sec":60}],"notes":["steer"],"more_pending":0,"#,
    r#""text":"[Background operations report]\n"}"#
);

#[test]
fn report_view() {
    golden(&report(), REPORT);
}

#[test]
fn finish_view() {
    let finish = FinishView {
        run_id: "agent-1".into(),
        operations: vec![op()],
        report: Some(report()),
    };
    let wire = format!(r#"{{"run_id":"agent-1","operations":[{OP}],"report":{REPORT}}}"#);
    golden(&finish, &wire);
}

#[test]
fn console_events() {
    let output = ConsoleOutput {
        offset: 6,
        text: "hello\n".into(),
    };
    golden(&output, r#"{"offset":6,"text":"hello\n"}"#);
    let done = ConsoleDone {
        operation_id: "op-1".into(),
        status: Some(Status::Completed),
        exit_code: Some(3),
        killed: false,
        effect: None,
        message: None,
    };
    golden(
        &done,
        r#"{"operation_id":"op-1","status":"completed","exit_code":3,"killed":false,"effect":null,"message":null}"#,
    );
    // an op that is gone ends its console with only a status
    let gone: ConsoleDone = serde_json::from_str(r#"{"status":"unknown"}"#).unwrap();
    assert_eq!(gone.status, None);
    assert_eq!(serde_json::to_value(&gone).unwrap()["status"], "unknown");
}

#[test]
fn container_list() {
    let list = ContainerList {
        containers: vec![ContainerView {
            container_id: "c0ffee".into(),
            name: "opkernel-agent-1".into(),
            state: "running".into(),
            run_id: Some("agent-1".into()),
            pool: None,
            scratch_key: Some("agent-1-1a2b".into()),
            run_fingerprint: None,
            created_at: Some("2026-11-29T00:00:00.000Z".into()),
            registered: true,
            node: None,
        }],
        unreachable: vec![],
    };
    golden(
        &list,
        concat!(
            r#"{"containers":[{"container_id":"c0ffee","name":"opkernel-agent-1","state":"running","#,
            r#""run_id":"agent-1","pool":null,"scratch_key":"agent-1-1a2b","run_fingerprint":null,"#,
            r#""created_at":"2026-11-29T00:00:00.000Z","registered":true}]}"#
        ),
    );
}

#[test]
fn reap_list() {
    let list = ReapList {
        dry_run: true,
        decisions: vec![ReapDecision {
            container_id: "c0ffee".into(),
            name: "opkernel-x".into(),
            run_id: None,
            action: ReapAction::Keep,
            reason: "live op".into(),
            removed: false,
            node: None,
        }],
        unreachable: vec![],
    };
    golden(
        &list,
        concat!(
            r#"{"dry_run":true,"decisions":[{"container_id":"c0ffee","name":"opkernel-x","#,
            r#""run_id":null,"action":"keep","reason":"live op","removed":false}]}"#
        ),
    );
}

/// The run views' goldens (a second file: one file stays readable).
#[path = "golden_run_tests.rs"]
mod runs;
