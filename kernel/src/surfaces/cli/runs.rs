//! Client verbs of runs as tasks: the run tree, a run's state, its state
//! changes, its usage and its events; schedules and approvals. Each reads
//! the API's answer as its typed view.

use std::collections::BTreeMap;

use super::client::Client;
use super::{compact, or_dash, print_answer};
use crate::runs::{Budget, RunAction};
use crate::surfaces::requests::{Complete, CreateSchedule, Deny, UsageRequest};
use crate::surfaces::views::{
    Event, EventsPage, OpList, OpView, RunChangeAnswer, RunList, RunSummary, RunView,
    ScheduleCreated, ScheduleDeleted, ScheduleList, ScheduleView, UsageAnswer,
};

/// A budget's limits as `name=value` words (`-` for none).
fn budget_text(budget: &Budget) -> String {
    match serde_json::to_value(budget) {
        Ok(serde_json::Value::Object(limits)) if !limits.is_empty() => limits
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        _ => "-".to_owned(),
    }
}

/// `opkernel runs`: every run the token reaches, as a tree.
pub(super) async fn runs(client: &Client, json: bool) -> anyhow::Result<i32> {
    let list: RunList = client.get_as("/v1/runs").await?;
    if json {
        print_answer(&list);
        return Ok(0);
    }
    let ids: std::collections::HashSet<&str> =
        list.runs.iter().map(|r| r.run_id.as_str()).collect();
    let mut children: BTreeMap<Option<&str>, Vec<&RunSummary>> = BTreeMap::new();
    for r in &list.runs {
        // a run whose parent is out of view is a root of this view
        let parent = r.parent_run_id.as_deref().filter(|p| ids.contains(p));
        children.entry(parent).or_default().push(r);
    }
    println!("{:<48} {:<10} {:>5}  BUDGET", "RUN", "STATE", "LIVE");
    fn walk(
        children: &BTreeMap<Option<&str>, Vec<&RunSummary>>,
        parent: Option<&str>,
        depth: usize,
    ) {
        for r in children.get(&parent).into_iter().flatten() {
            let name = format!("{}{}", "  ".repeat(depth), r.run_id);
            println!(
                "{:<48} {:<10} {:>5}  {}",
                name,
                r.state.as_str(),
                r.live_ops.to_string(),
                budget_text(&r.budget)
            );
            walk(children, Some(&r.run_id), depth + 1);
        }
    }
    walk(&children, None, 0);
    Ok(0)
}

/// `-` for an empty list, else its items joined by `sep`.
fn joined_or_dash(items: &[String], sep: &str) -> String {
    if items.is_empty() {
        "-".to_owned()
    } else {
        items.join(sep)
    }
}

fn print_run(v: &RunView) {
    println!("run        {}", v.run_id);
    println!("state      {}", v.state.as_str());
    println!("parent     {}", or_dash(&v.parent_run_id));
    println!("chain      {}", joined_or_dash(&v.chain, " > "));
    let children: Vec<String> = v
        .children
        .iter()
        .map(|c| format!("{} ({})", c.run_id, c.state.as_str()))
        .collect();
    println!("children   {}", joined_or_dash(&children, ", "));
    println!("envelope   {}", compact(&v.envelope));
    println!("budget     {}", compact(&v.budget));
    println!("used       {}", compact(&v.used));
    println!("remaining  {}", compact(&v.remaining));
    if let Some(o) = &v.origin {
        println!(
            "origin     {} ({}) by {}",
            o.surface, o.channel, o.principal
        );
    }
    if let Some(summary) = &v.summary {
        println!("summary    {summary} (by {})", or_dash(&v.decided_by));
    }
}

pub(super) async fn run_state(client: &Client, run: &str, json: bool) -> anyhow::Result<i32> {
    let v: RunView = client.get_as(&format!("/v1/runs/{run}")).await?;
    if json {
        print_answer(&v);
    } else {
        print_run(&v);
    }
    Ok(0)
}

/// `opkernel pause|resume|cancel|complete RUN` (a completion carries its
/// summary).
pub(super) async fn change(
    client: &Client,
    run: &str,
    action: RunAction,
    summary: Option<String>,
    json: bool,
) -> anyhow::Result<i32> {
    let path = format!("/v1/runs/{run}/{}", action.as_str());
    let v: RunChangeAnswer = match summary {
        Some(summary) => client.post_as(&path, &Complete { summary }, None).await?,
        None => client.post_empty_as(&path).await?,
    };
    if json {
        print_answer(&v);
        return Ok(0);
    }
    println!("run {run}: {}", v.run.state.as_str());
    if v.changed.len() > 1 {
        println!(
            "{} runs changed state (descendants included)",
            v.changed.len()
        );
    }
    let kills = v.kill_requested.len();
    if kills > 0 {
        println!("{kills} live operations are being killed; their results arrive in reports");
    }
    Ok(0)
}

/// `opkernel network RUN --allow …`: the run's allow list from now on.
pub(super) async fn network(
    client: &Client,
    run: &str,
    allow: Vec<String>,
    json: bool,
) -> anyhow::Result<i32> {
    let path = format!("/v1/runs/{run}/network");
    let body = crate::surfaces::requests::ChangeNetwork { allow };
    let v: crate::surfaces::views::NetworkView = client.post_as(&path, &body, None).await?;
    if json {
        print_answer(&v);
        return Ok(0);
    }
    println!("run {run}: allow [{}]", v.allow.join(", "));
    if !v.narrowed.is_empty() {
        println!("narrowed with it: {}", v.narrowed.join(", "));
    }
    Ok(0)
}

/// `opkernel usage RUN`: the run's usage, budget and what remains; with a
/// model, records its usage first (the answer has no budget).
pub(super) async fn usage(
    client: &Client,
    run: &str,
    record: Option<UsageRequest>,
    json: bool,
) -> anyhow::Result<i32> {
    let (used, budget, remaining) = match record {
        Some(body) => {
            let v: UsageAnswer = client
                .post_as(&format!("/v1/runs/{run}/usage"), &body, None)
                .await?;
            if json {
                print_answer(&v);
                return Ok(0);
            }
            (v.used, None, v.remaining)
        }
        None => {
            let v: RunView = client.get_as(&format!("/v1/runs/{run}")).await?;
            if json {
                print_answer(&v);
                return Ok(0);
            }
            (v.used, Some(v.budget), v.remaining)
        }
    };
    println!("used       {}", compact(&used));
    if let Some(budget) = budget {
        println!("budget     {}", compact(&budget));
    }
    println!("remaining  {}", compact(&remaining));
    Ok(0)
}

fn print_event(e: &Event, json: bool) {
    if json {
        println!("{}", compact(e));
        return;
    }
    let data = e.kind.data().unwrap_or_default();
    println!(
        "{:>6} {} {:<20} {} {data}",
        e.seq.to_string(),
        crate::surfaces::views::rfc3339(e.at),
        e.kind.name(),
        e.operation_id.as_deref().unwrap_or("-"),
    );
}

/// `opkernel events RUN`: the run's trace; `--follow` keeps streaming.
pub(super) async fn events(
    client: &Client,
    run: &str,
    after: i64,
    follow: bool,
    json: bool,
) -> anyhow::Result<i32> {
    if follow {
        client
            .sse(
                &format!("/v1/runs/{run}/events/stream?after={after}"),
                |_, data| {
                    match serde_json::from_str::<Event>(data) {
                        Ok(e) => print_event(&e, json),
                        Err(e) => eprintln!("opkernel: an event of an unknown shape: {e}"),
                    }
                    true
                },
            )
            .await?;
        return Ok(0);
    }
    let mut after = after;
    loop {
        let page: EventsPage = client
            .get_as(&format!("/v1/runs/{run}/events?after={after}"))
            .await?;
        if page.events.is_empty() {
            return Ok(0);
        }
        for e in &page.events {
            print_event(e, json);
        }
        after = page.next_after;
    }
}

/// `opkernel schedule add|ls|rm|pause|resume`.
pub(super) async fn schedule(client: &Client, action: super::ScheduleCmd) -> anyhow::Result<i32> {
    use super::ScheduleCmd as S;
    match action {
        S::Add {
            run,
            cron,
            every,
            at,
            timeout,
            catch_up,
            delete_after_success,
            json,
            command,
        } => {
            let body = CreateSchedule {
                command,
                catch_up,
                delete_after_success,
                cron,
                every_sec: every,
                at,
                timeout_sec: timeout,
            };
            schedule_add(client, &run, &body, json).await?
        }
        S::Ls { run, json } => schedule_ls(client, run, json).await?,
        S::Rm { run, schedule_id } => {
            let path = format!("/v1/runs/{run}/schedules/{schedule_id}");
            let _: ScheduleDeleted = client.delete_as(&path).await?;
            println!("schedule {schedule_id} deleted");
        }
        S::Pause { run, schedule_id } => {
            let path = format!("/v1/runs/{run}/schedules/{schedule_id}/pause");
            let _: ScheduleView = client.post_empty_as(&path).await?;
            println!("schedule {schedule_id} paused");
        }
        S::Resume { run, schedule_id } => {
            let path = format!("/v1/runs/{run}/schedules/{schedule_id}/resume");
            let v: ScheduleView = client.post_empty_as(&path).await?;
            println!(
                "schedule {schedule_id} resumed (next due {})",
                or_dash(&v.next_due_at)
            );
        }
    }
    Ok(0)
}

/// `opkernel schedule add`.
async fn schedule_add(
    client: &Client,
    run: &str,
    body: &CreateSchedule,
    json: bool,
) -> anyhow::Result<()> {
    let v: ScheduleCreated = client
        .post_as(&format!("/v1/runs/{run}/schedules"), body, None)
        .await?;
    if json {
        print_answer(&v);
    } else {
        println!(
            "schedule {} (next due {})",
            v.schedule_id,
            or_dash(&v.next_due_at)
        );
    }
    Ok(())
}

/// `opkernel schedule ls`: a run's schedules (or every one the token
/// reaches), as a table or JSON.
async fn schedule_ls(client: &Client, run: Option<String>, json: bool) -> anyhow::Result<()> {
    let path = match &run {
        Some(run) => format!("/v1/runs/{run}/schedules"),
        None => "/v1/schedules".to_owned(),
    };
    let list: ScheduleList = client.get_as(&path).await?;
    if json {
        print_answer(&list);
        return Ok(());
    }
    println!(
        "{:<36} {:<24} {:<16} {:<8} {:<24} {:<12} COMMAND",
        "SCHEDULE", "RUN", "WHEN", "STATE", "NEXT DUE", "LAST"
    );
    for s in &list.schedules {
        println!("{}", schedule_line(s));
    }
    Ok(())
}

/// One schedule's line of `opkernel schedule ls`: the server derives its
/// timing text and state.
fn schedule_line(s: &ScheduleView) -> String {
    let last = match (&s.last_status, s.last_exit_code) {
        (Some(st), Some(code)) => format!("{st} {code}"),
        (Some(st), None) => st.clone(),
        _ => "-".to_owned(),
    };
    format!(
        "{:<36} {:<24} {:<16} {:<8} {:<24} {:<12} {}",
        s.schedule_id,
        s.run_id,
        s.when,
        s.state.as_str(),
        or_dash(&s.next_due_at),
        last,
        crate::report_text::command_line(&s.command)
    )
}

/// `opkernel approvals`: ops waiting for an operator.
pub(super) async fn approvals(client: &Client, json: bool) -> anyhow::Result<i32> {
    let list: OpList = client.get_as("/v1/approvals").await?;
    if json {
        print_answer(&list);
        return Ok(0);
    }
    println!(
        "{:<36} {:<24} {:>8}  {:<24} {:<9} COMMAND",
        "OPERATION", "RUN", "WAITING", "RULE", "ESCALATED"
    );
    for op in &list.operations {
        let approval = op.approval.as_ref();
        let escalated = approval.is_some_and(|a| a.escalated_at.is_some());
        println!(
            "{:<36} {:<24} {:>8}  {:<24} {:<9} {}",
            op.operation_id,
            op.run_id,
            crate::report_text::human_duration(op.duration_sec as u64),
            approval.map_or("-", |a| a.rule.as_str()),
            if escalated { "yes" } else { "no" },
            crate::report_text::command_line(&op.command)
        );
    }
    Ok(0)
}

/// `opkernel approvals --follow`: each approval once as it starts waiting
/// and once more when it escalates, polled each second; an unreachable
/// kernel is said once and waited for.
pub(super) async fn follow_approvals(client: &Client, json: bool) -> anyhow::Result<i32> {
    use std::collections::HashMap;
    use std::io::Write as _;
    // op id → escalated, for the ops seen waiting
    let mut seen: HashMap<String, bool> = HashMap::new();
    let mut down = false;
    loop {
        match client.get_as::<OpList>("/v1/approvals").await {
            Ok(list) => {
                down = false;
                for op in &list.operations {
                    let escalated = op
                        .approval
                        .as_ref()
                        .is_some_and(|a| a.escalated_at.is_some());
                    let event = match seen.insert(op.operation_id.clone(), escalated) {
                        None if escalated => "approval.escalated",
                        None => "approval.requested",
                        Some(false) if escalated => "approval.escalated",
                        Some(_) => continue,
                    };
                    print_follow(op, event, json);
                }
                // an op no longer waiting was decided: it may not come back
                seen.retain(|id, _| list.operations.iter().any(|o| &o.operation_id == id));
            }
            Err(e) if !down => {
                down = true;
                eprintln!("opkernel approvals --follow: {e:#}; trying again each second");
            }
            Err(_) => {}
        }
        let _ = std::io::stdout().flush();
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

fn print_follow(op: &crate::surfaces::views::OpView, event: &str, json: bool) {
    if json {
        let mut v = serde_json::to_value(op).unwrap_or_default();
        v["event"] = serde_json::Value::String(event.to_owned());
        println!("{v}");
        return;
    }
    let rule = op.approval.as_ref().map_or("-", |a| a.rule.as_str());
    println!(
        "{event:<19} {} run={} rule={rule} waiting={} {}",
        op.operation_id,
        op.run_id,
        crate::report_text::human_duration(op.duration_sec as u64),
        crate::report_text::command_line(&op.command)
    );
}

/// `opkernel approve OP` / `opkernel deny OP --reason TEXT`.
pub(super) async fn decide(
    client: &Client,
    op: &str,
    deny_reason: Option<String>,
    json: bool,
) -> anyhow::Result<i32> {
    let v: OpView = match deny_reason {
        None => {
            let path = format!("/v1/operations/{op}/approve");
            client.post_empty_as(&path).await?
        }
        Some(reason) => {
            let path = format!("/v1/operations/{op}/deny");
            let body = Deny {
                reason: Some(reason),
            };
            client.post_as(&path, &body, None).await?
        }
    };
    if json {
        print_answer(&v);
    } else {
        println!("{op}: {}", or_dash(&v.message));
    }
    Ok(0)
}
