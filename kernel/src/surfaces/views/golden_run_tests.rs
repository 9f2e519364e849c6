//! Golden tests of the run views: a run with its family and amounts, the
//! run list, usage, schedules, events and nodes.

use super::*;

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
            ..Amounts::default()
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
        image: "default".into(),
        origin: Some(
            crate::origin::Origin::new(crate::origin::Surface::Cli, "opkernel 0.1.0", "operator")
                .with_route("POST /v1/runs"),
        ),
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
            r#""state_changed_at":1795910401000,"summary":null,"decided_by":null,"node":null,"image":"default","#,
            r#""origin":{{"surface":"cli","channel":"opkernel 0.1.0","principal":"operator","route":"POST /v1/runs"}}}}"#
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
        image: "python".into(),
        forked_from: Some("a@v1".into()),
    };
    let wire = format!(
        r#"{{"run_id":"a.b","token":"tok","parent_run_id":"a","chain":["a"],"state":"active","envelope":{ENVELOPE},"budget":{{}},"image":"python","forked_from":"a@v1"}}"#
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
            ..Amounts::default()
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
        source: "config".into(),
        declared_in: Some("/etc/opkernel/schedules.toml".into()),
    }
}

const SCHEDULE: &str = concat!(
    r#"{"schedule_id":"5f1d3c0a-8a43-4b7e-9a0e-6f1c2d3e4b5a","run_id":"agent-1","command":["date"],"#,
    r#""timeout_sec":60,"every_sec":90,"catch_up":false,"delete_after_success":false,"enabled":true,"#,
    r#""paused":false,"state":"running","when":"every 90s","next_due_at":"2026-11-29T00:01:30.000Z","#,
    r#""current_operation_id":"op-9","last_due_at":null,"last_operation_id":null,"last_status":null,"#,
    r#""last_exit_code":null,"last_output_tail":null,"last_finished_at":null,"#,
    r#""created_at":"2026-11-29T00:00:00.000Z","source":"config","#,
    r#""declared_in":"/etc/opkernel/schedules.toml"}"#
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
