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
    r#""escalated_at":null,"decided_by":null,"decided_at":null},"schedule_id":"sch-1"}"#
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

fn envelope() -> Envelope {
    serde_json::from_value(json!({
        "max_timeout_sec": null, "memory_bytes": 1024, "cpus": 1.0, "pids_limit": 64,
        "network": "none", "max_live_ops": 8, "max_children": 32
    }))
    .unwrap()
}

const ENVELOPE: &str = concat!(
    r#"{"max_timeout_sec":null,"memory_bytes":1024,"cpus":1.0,"pids_limit":64,"network":"none","#,
    r#""max_live_ops":8,"max_children":32}"#
);

fn budget() -> Budget {
    Budget {
        op_seconds: Some(60),
        tokens: Some(1000),
        ..Budget::default()
    }
}

fn run_view() -> RunView {
    RunView {
        run_id: "a.b".into(),
        state: RunState::Paused,
        parent_run_id: Some("a".into()),
        chain: vec!["a".into()],
        principal: "run:a".into(),
        children: vec![ChildView {
            run_id: "a.b.c".into(),
            state: RunState::Active,
        }],
        envelope: envelope(),
        budget: budget(),
        used: Amounts {
            op_seconds: Some(1.5),
            cpu_seconds: Some(0.0),
            tokens: Some(10),
            cost_micros: Some(0),
        },
        remaining: Amounts {
            op_seconds: Some(58.5),
            tokens: Some(990),
            ..Amounts::default()
        },
        created_at: 1_795_910_400_000,
        state_changed_at: Some(1_795_910_401_000),
        summary: None,
        decided_by: None,
        node: None,
    }
}

fn run_view_wire() -> String {
    format!(
        concat!(
            r#"{{"run_id":"a.b","state":"paused","parent_run_id":"a","chain":["a"],"principal":"run:a","#,
            r#""children":[{{"run_id":"a.b.c","state":"active"}}],"envelope":{},"#,
            r#""budget":{{"op_seconds":60,"tokens":1000}},"#,
            r#""used":{{"op_seconds":1.5,"cpu_seconds":0.0,"tokens":10,"cost_micros":0}},"#,
            r#""remaining":{{"op_seconds":58.5,"tokens":990}},"created_at":1795910400000,"#,
            r#""state_changed_at":1795910401000,"summary":null,"decided_by":null,"node":null}}"#
        ),
        ENVELOPE
    )
}

#[test]
fn run_view_with_its_family_and_amounts() {
    golden(&run_view(), &run_view_wire());
}

#[test]
fn run_created() {
    let created = RunCreated {
        run_id: "a.b".into(),
        token: "tok".into(),
        parent_run_id: Some("a".into()),
        chain: vec!["a".into()],
        state: RunState::Active,
        envelope: envelope(),
        budget: Budget::default(),
    };
    let wire = format!(
        r#"{{"run_id":"a.b","token":"tok","parent_run_id":"a","chain":["a"],"state":"active","envelope":{ENVELOPE},"budget":{{}}}}"#
    );
    golden(&created, &wire);
}

#[test]
fn run_list() {
    let list = RunList {
        runs: vec![RunSummary {
            run_id: "a".into(),
            parent_run_id: None,
            depth: 0,
            state: RunState::Active,
            live_ops: 2,
            budget: budget(),
            created_at: 5,
        }],
    };
    golden(
        &list,
        concat!(
            r#"{"runs":[{"run_id":"a","parent_run_id":null,"depth":0,"state":"active","live_ops":2,"#,
            r#""budget":{"op_seconds":60,"tokens":1000},"created_at":5}]}"#
        ),
    );
}

#[test]
fn run_change_answer() {
    let answer = RunChangeAnswer {
        run: run_view(),
        changed: vec!["a.b".into(), "a.b.c".into()],
        kill_requested: vec!["op-1".into()],
        denied: vec![],
    };
    let wire = format!(
        r#"{{"run":{},"changed":["a.b","a.b.c"],"kill_requested":["op-1"],"denied":[]}}"#,
        run_view_wire()
    );
    golden(&answer, &wire);
}

#[test]
fn usage_answer() {
    let answer = UsageAnswer {
        run_id: "a".into(),
        seq: 4,
        recorded: false,
        used: Amounts {
            op_seconds: Some(0.0),
            cpu_seconds: Some(0.0),
            tokens: Some(15),
            cost_micros: Some(30),
        },
        remaining: Amounts::default(),
    };
    golden(
        &answer,
        concat!(
            r#"{"run_id":"a","seq":4,"recorded":false,"#,
            r#""used":{"op_seconds":0.0,"cpu_seconds":0.0,"tokens":15,"cost_micros":30},"remaining":{}}"#
        ),
    );
}

fn schedule() -> ScheduleView {
    ScheduleView {
        schedule_id: "5f1d3c0a-8a43-4b7e-9a0e-6f1c2d3e4b5a".into(),
        run_id: "agent-1".into(),
        command: vec!["date".into()],
        timeout_sec: 60,
        cron: None,
        every_sec: Some(90),
        at: None,
        catch_up: false,
        delete_after_success: false,
        enabled: true,
        paused: false,
        state: ScheduleState::Running,
        when: "every 90s".into(),
        next_due_at: Some("2026-11-29T00:01:30.000Z".into()),
        current_operation_id: Some("op-9".into()),
        last_due_at: None,
        last_operation_id: None,
        last_status: None,
        last_exit_code: None,
        last_output_tail: None,
        last_finished_at: None,
        created_at: "2026-11-29T00:00:00.000Z".into(),
    }
}

const SCHEDULE: &str = concat!(
    r#"{"schedule_id":"5f1d3c0a-8a43-4b7e-9a0e-6f1c2d3e4b5a","run_id":"agent-1","command":["date"],"#,
    r#""timeout_sec":60,"every_sec":90,"catch_up":false,"delete_after_success":false,"enabled":true,"#,
    r#""paused":false,"state":"running","when":"every 90s","next_due_at":"2026-11-29T00:01:30.000Z","#,
    r#""current_operation_id":"op-9","last_due_at":null,"last_operation_id":null,"last_status":null,"#,
    r#""last_exit_code":null,"last_output_tail":null,"last_finished_at":null,"#,
    r#""created_at":"2026-11-29T00:00:00.000Z"}"#
);

#[test]
fn schedule_view() {
    golden(&schedule(), SCHEDULE);
}

#[test]
fn schedule_created() {
    let created = ScheduleCreated {
        schedule_id: "5f1d3c0a-8a43-4b7e-9a0e-6f1c2d3e4b5a".into(),
        next_due_at: Some("2026-11-29T00:01:30.000Z".into()),
        schedule: schedule(),
    };
    let wire = format!(
        r#"{{"schedule_id":"5f1d3c0a-8a43-4b7e-9a0e-6f1c2d3e4b5a","next_due_at":"2026-11-29T00:01:30.000Z","schedule":{SCHEDULE}}}"#
    );
    golden(&created, &wire);
}

#[test]
fn schedule_list() {
    let list = ScheduleList {
        schedules: vec![schedule()],
    };
    golden(&list, &format!(r#"{{"schedules":[{SCHEDULE}]}}"#));
}

#[test]
fn schedule_deleted() {
    let deleted = ScheduleDeleted {
        schedule_id: "s".into(),
        deleted: true,
        running_operation_id: None,
    };
    golden(
        &deleted,
        r#"{"schedule_id":"s","deleted":true,"running_operation_id":null}"#,
    );
}

#[test]
fn events_page() {
    let page = EventsPage {
        run_id: "agent-1".into(),
        events: vec![Event {
            seq: 3,
            at: 1_795_910_400_000,
            operation_id: None,
            kind: EventKind::RunResumed(crate::event_kind::RunChanged::by("operator")),
        }],
        next_after: 3,
        last_seq: 5,
    };
    golden(
        &page,
        concat!(
            r#"{"run_id":"agent-1","events":[{"seq":3,"at":1795910400000,"operation_id":null,"#,
            r#""kind":"run.resumed","data":{"by":"operator"}}],"next_after":3,"last_seq":5}"#
        ),
    );
}

#[test]
fn report_list() {
    let list = ReportList {
        run_id: "agent-1".into(),
        reports: vec![ReportSummary {
            report_id: Some("r-1".into()),
            created_at: "2026-11-29T00:00:00.000Z".into(),
            acked_at: None,
            resolved: 2,
            text: "[Background operations report]\n".into(),
        }],
    };
    golden(
        &list,
        concat!(
            r#"{"run_id":"agent-1","reports":[{"report_id":"r-1","created_at":"2026-11-29T00:00:00.000Z","#,
            r#""acked_at":null,"resolved":2,"text":"[Background operations report]\n"}]}"#
        ),
    );
}

#[test]
fn report_ack() {
    let ack = ReportAck {
        report_id: "r-1".into(),
        acked: true,
    };
    golden(&ack, r#"{"report_id":"r-1","acked":true}"#);
}

#[test]
fn note_added() {
    let note = NoteAdded {
        run_id: "agent-1".into(),
        note_id: 7,
    };
    golden(&note, r#"{"run_id":"agent-1","note_id":7}"#);
}

#[test]
fn health() {
    let health = Health {
        ok: true,
        kernel_id: "boot:1:2".into(),
    };
    golden(&health, r#"{"ok":true,"kernel_id":"boot:1:2"}"#);
}

#[test]
fn whoami() {
    let operator = WhoAmI {
        principal: PrincipalKind::Operator,
        run_id: None,
    };
    golden(&operator, r#"{"principal":"operator","run_id":null}"#);
    let run = WhoAmI {
        principal: PrincipalKind::Run,
        run_id: Some("agent-1".into()),
    };
    golden(&run, r#"{"principal":"run","run_id":"agent-1"}"#);
}

#[test]
fn tools_view() {
    let tools = ToolsView {
        tools: vec![ToolDefinition {
            name: "kill_operation".into(),
            description: "Cancel".into(),
            parameters: json!({"type": "object"}),
        }],
    };
    golden(
        &tools,
        r#"{"tools":[{"name":"kill_operation","description":"Cancel","parameters":{"type":"object"}}]}"#,
    );
}

#[test]
fn drill_answers() {
    let counts = ProbeCounts {
        by_launcher: 3,
        launcher_silent: 1,
        by_exec: 0,
    };
    golden(
        &counts,
        r#"{"by_launcher":3,"launcher_silent":1,"by_exec":0}"#,
    );
    let fault = DrillFault {
        operation_id: "op-1".into(),
        fault: "observer attempt fails at its next step".into(),
    };
    golden(
        &fault,
        r#"{"operation_id":"op-1","fault":"observer attempt fails at its next step"}"#,
    );
    let woken = DrillWoken {
        operation_id: "op-1".into(),
        woken: true,
    };
    golden(&woken, r#"{"operation_id":"op-1","woken":true}"#);
    let stepped = ClockStepped {
        stepped_ms: -5000,
        now: "2026-11-29T00:00:00.000Z".into(),
    };
    golden(
        &stepped,
        r#"{"stepped_ms":-5000,"now":"2026-11-29T00:00:00.000Z"}"#,
    );
}
