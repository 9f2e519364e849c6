//! Client verbs of runs as tasks: the run tree, a run's state, its state
//! changes, its usage and its events.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::client::Client;
use super::{or_dash, print_json};

/// `opkernel runs`: every run the token reaches, as a tree.
pub(super) async fn runs(client: &Client, json: bool) -> anyhow::Result<i32> {
    let v = client.get("/v1/runs").await?;
    if json {
        print_json(&v);
        return Ok(0);
    }
    let runs = v["runs"].as_array().cloned().unwrap_or_default();
    let ids: std::collections::HashSet<&str> =
        runs.iter().filter_map(|r| r["run_id"].as_str()).collect();
    let mut children: BTreeMap<Option<&str>, Vec<&Value>> = BTreeMap::new();
    for r in &runs {
        // a run whose parent is out of view is a root of this view
        let parent = r["parent_run_id"].as_str().filter(|p| ids.contains(p));
        children.entry(parent).or_default().push(r);
    }
    println!("{:<48} {:<10} {:>5}  BUDGET", "RUN", "STATE", "LIVE");
    fn walk(children: &BTreeMap<Option<&str>, Vec<&Value>>, parent: Option<&str>, depth: usize) {
        for r in children.get(&parent).into_iter().flatten() {
            let id = r["run_id"].as_str().unwrap_or("-");
            let name = format!("{}{}", "  ".repeat(depth), id);
            let budget = r["budget"]
                .as_object()
                .filter(|b| !b.is_empty())
                .map(|b| {
                    b.iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_else(|| "-".to_owned());
            println!(
                "{:<48} {:<10} {:>5}  {budget}",
                name,
                r["state"].as_str().unwrap_or("-"),
                r["live_ops"].to_string()
            );
            walk(children, Some(id), depth + 1);
        }
    }
    walk(&children, None, 0);
    Ok(0)
}

fn print_run(v: &Value) {
    let s = |k: &str| v[k].as_str().map(str::to_owned);
    println!("run        {}", or_dash(&s("run_id")));
    println!("state      {}", or_dash(&s("state")));
    println!("parent     {}", or_dash(&s("parent_run_id")));
    let chain: Vec<&str> = v["chain"]
        .as_array()
        .map(|c| c.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    println!(
        "chain      {}",
        if chain.is_empty() {
            "-".to_owned()
        } else {
            chain.join(" > ")
        }
    );
    let children: Vec<String> = v["children"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| {
                    format!(
                        "{} ({})",
                        c["run_id"].as_str().unwrap_or("-"),
                        c["state"].as_str().unwrap_or("-")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    println!(
        "children   {}",
        if children.is_empty() {
            "-".to_owned()
        } else {
            children.join(", ")
        }
    );
    println!("envelope   {}", v["envelope"]);
    println!("budget     {}", v["budget"]);
    println!("used       {}", v["used"]);
    println!("remaining  {}", v["remaining"]);
    if let Some(summary) = s("summary") {
        println!("summary    {summary} (by {})", or_dash(&s("decided_by")));
    }
}

pub(super) async fn run_state(client: &Client, run: &str, json: bool) -> anyhow::Result<i32> {
    let v = client.get(&format!("/v1/runs/{run}")).await?;
    if json {
        print_json(&v);
    } else {
        print_run(&v);
    }
    Ok(0)
}

/// `opkernel pause|resume|cancel|complete RUN`.
pub(super) async fn change(
    client: &Client,
    run: &str,
    action: &str,
    summary: Option<String>,
    json: bool,
) -> anyhow::Result<i32> {
    let body = match summary {
        Some(s) => json!({ "summary": s }),
        None => json!({}),
    };
    let v = client
        .post(&format!("/v1/runs/{run}/{action}"), &body)
        .await?;
    if json {
        print_json(&v);
        return Ok(0);
    }
    println!("run {run}: {}", v["run"]["state"].as_str().unwrap_or("-"));
    let changed = v["changed"].as_array().map_or(0, Vec::len);
    if changed > 1 {
        println!("{} runs changed state (descendants included)", changed);
    }
    let kills = v["kill_requested"].as_array().map_or(0, Vec::len);
    if kills > 0 {
        println!("{kills} live operations are being killed; their results arrive in reports");
    }
    Ok(0)
}

pub(super) async fn usage(
    client: &Client,
    run: &str,
    record: Option<Value>,
    json: bool,
) -> anyhow::Result<i32> {
    let v = match record {
        Some(body) => client.post(&format!("/v1/runs/{run}/usage"), &body).await?,
        None => client.get(&format!("/v1/runs/{run}")).await?,
    };
    if json {
        print_json(&v);
        return Ok(0);
    }
    println!("used       {}", v["used"]);
    if let Some(budget) = v.get("budget") {
        println!("budget     {budget}");
    }
    println!("remaining  {}", v["remaining"]);
    Ok(0)
}

fn print_event(e: &Value, json: bool) {
    if json {
        println!("{e}");
        return;
    }
    let at = e["at"]
        .as_i64()
        .map(crate::views::rfc3339)
        .unwrap_or_default();
    println!(
        "{:>6} {at} {:<20} {} {}",
        e["seq"].to_string(),
        e["kind"].as_str().unwrap_or("-"),
        e["operation_id"].as_str().unwrap_or("-"),
        e["data"]
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
                    let e: Value = serde_json::from_str(data).unwrap_or(Value::Null);
                    print_event(&e, json);
                    true
                },
            )
            .await?;
        return Ok(0);
    }
    let mut after = after;
    loop {
        let v = client
            .get(&format!("/v1/runs/{run}/events?after={after}"))
            .await?;
        let events = v["events"].as_array().cloned().unwrap_or_default();
        if events.is_empty() {
            return Ok(0);
        }
        for e in &events {
            print_event(e, json);
        }
        after = v["next_after"].as_i64().unwrap_or(after);
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
            let mut body = json!({
                "command": command,
                "catch_up": catch_up,
                "delete_after_success": delete_after_success,
            });
            for (key, value) in [
                ("cron", cron.map(|c| json!(c))),
                ("every_sec", every.map(|e| json!(e))),
                ("at", at.map(|a| json!(a))),
                ("timeout_sec", timeout.map(|t| json!(t))),
            ] {
                if let Some(value) = value {
                    body[key] = value;
                }
            }
            let v = client
                .post(&format!("/v1/runs/{run}/schedules"), &body)
                .await?;
            if json {
                print_json(&v);
            } else {
                println!(
                    "schedule {} (next due {})",
                    v["schedule_id"].as_str().unwrap_or("-"),
                    v["next_due_at"].as_str().unwrap_or("-")
                );
            }
        }
        S::Ls { run, json } => schedule_ls(client, run, json).await?,
        S::Rm { run, schedule_id } => {
            client
                .request(
                    reqwest::Method::DELETE,
                    &format!("/v1/runs/{run}/schedules/{schedule_id}"),
                    None,
                    &[],
                )
                .await
                .and_then(ok_or_message)?;
            println!("schedule {schedule_id} deleted");
        }
        S::Pause { run, schedule_id } => {
            let path = format!("/v1/runs/{run}/schedules/{schedule_id}/pause");
            client.post(&path, &json!({})).await?;
            println!("schedule {schedule_id} paused");
        }
        S::Resume { run, schedule_id } => {
            let path = format!("/v1/runs/{run}/schedules/{schedule_id}/resume");
            let v = client.post(&path, &json!({})).await?;
            println!(
                "schedule {schedule_id} resumed (next due {})",
                v["next_due_at"].as_str().unwrap_or("-")
            );
        }
    }
    Ok(0)
}

/// `opkernel schedule ls`: a run's schedules (or every one the token
/// reaches), as a table or JSON.
async fn schedule_ls(client: &Client, run: Option<String>, json: bool) -> anyhow::Result<()> {
    let path = match &run {
        Some(run) => format!("/v1/runs/{run}/schedules"),
        None => "/v1/schedules".to_owned(),
    };
    let v = client.get(&path).await?;
    if json {
        print_json(&v);
        return Ok(());
    }
    println!(
        "{:<36} {:<24} {:<16} {:<8} {:<24} {:<12} COMMAND",
        "SCHEDULE", "RUN", "WHEN", "STATE", "NEXT DUE", "LAST"
    );
    for s in v["schedules"].as_array().into_iter().flatten() {
        println!("{}", schedule_line(s));
    }
    Ok(())
}

/// One schedule's line of `opkernel schedule ls`.
fn schedule_line(s: &Value) -> String {
    let when = if let Some(c) = s["cron"].as_str() {
        c.to_owned()
    } else if let Some(e) = s["every_sec"].as_u64() {
        format!("every {e}s")
    } else {
        format!("at {}", s["at"].as_str().unwrap_or("-"))
    };
    let state = if !s["enabled"].as_bool().unwrap_or(true) {
        "done"
    } else if s["paused"].as_bool().unwrap_or(false) {
        "paused"
    } else if s["current_operation_id"].is_string() {
        "running"
    } else {
        "waiting"
    };
    let last = match (s["last_status"].as_str(), s["last_exit_code"].as_i64()) {
        (Some(st), Some(code)) => format!("{st} {code}"),
        (Some(st), None) => st.to_owned(),
        _ => "-".to_owned(),
    };
    format!(
        "{:<36} {:<24} {:<16} {:<8} {:<24} {:<12} {}",
        s["schedule_id"].as_str().unwrap_or("-"),
        s["run_id"].as_str().unwrap_or("-"),
        when,
        state,
        s["next_due_at"].as_str().unwrap_or("-"),
        last,
        crate::report_text::command_line_json(&s["command"])
    )
}

/// A raw request's answer, or its error message as an error.
fn ok_or_message((status, body): (u16, Value)) -> anyhow::Result<Value> {
    if (200..300).contains(&status) {
        Ok(body)
    } else {
        anyhow::bail!(
            "{} (HTTP {status})",
            body["error"]["message"]
                .as_str()
                .unwrap_or("request failed")
        )
    }
}

/// `opkernel approvals`: ops waiting for an operator.
pub(super) async fn approvals(client: &Client, json: bool) -> anyhow::Result<i32> {
    let v = client.get("/v1/approvals").await?;
    if json {
        print_json(&v);
        return Ok(0);
    }
    println!(
        "{:<36} {:<24} {:>8}  {:<24} {:<9} COMMAND",
        "OPERATION", "RUN", "WAITING", "RULE", "ESCALATED"
    );
    for op in v["operations"].as_array().into_iter().flatten() {
        println!(
            "{:<36} {:<24} {:>8}  {:<24} {:<9} {}",
            op["operation_id"].as_str().unwrap_or("-"),
            op["run_id"].as_str().unwrap_or("-"),
            crate::report_text::human_duration(op["duration_sec"].as_f64().unwrap_or(0.0) as u64),
            op["approval"]["rule"].as_str().unwrap_or("-"),
            if op["approval"]["escalated_at"].is_string() {
                "yes"
            } else {
                "no"
            },
            crate::report_text::command_line_json(&op["command"])
        );
    }
    Ok(0)
}

/// `opkernel approve OP` / `opkernel deny OP --reason TEXT`.
pub(super) async fn decide(
    client: &Client,
    op: &str,
    deny_reason: Option<String>,
    json: bool,
) -> anyhow::Result<i32> {
    let v = match deny_reason {
        None => {
            client
                .post(&format!("/v1/operations/{op}/approve"), &json!({}))
                .await?
        }
        Some(reason) => {
            client
                .post(
                    &format!("/v1/operations/{op}/deny"),
                    &json!({ "reason": reason }),
                )
                .await?
        }
    };
    if json {
        print_json(&v);
    } else {
        println!("{op}: {}", v["message"].as_str().unwrap_or("-"));
    }
    Ok(0)
}
