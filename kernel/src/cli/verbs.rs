//! One function per client verb: each calls the daemon's HTTP API, reads
//! the typed view back and prints it (as text, or as JSON with `--json`).

use std::io::Write;

use anyhow::bail;
use serde_json::{json, Value};

use super::client::Client;
use super::{describe, exit_status, or_dash, print_json, print_op, RunRequest};
use crate::store::Report;
use crate::views::{ContainerList, FinishView, OpList, OpView, ReapList};

/// `opkernel run`: a background op prints its start message; a foreground
/// one prints its output and exits with its code.
pub(super) async fn run(client: &Client, req: RunRequest, json: bool) -> anyhow::Result<i32> {
    let mut body = json!({"command": req.command, "background": req.background});
    if let Some(t) = req.timeout {
        body["timeout_sec"] = json!(t);
    }
    let path = match &req.run {
        Some(run) => format!("/v1/runs/{run}/tools/run_command"),
        None if req.background => {
            bail!("--background needs --run: a throwaway container supports foreground only")
        }
        None => "/v1/tools/run_command".into(),
    };
    let op: OpView = client
        .post_as(&path, &body, req.idempotency_key.as_deref())
        .await?;
    if json {
        print_json(&op);
        return Ok(0);
    }
    if req.background || op.status == "awaiting_approval" {
        println!("{}", or_dash(&op.message));
        return Ok(0);
    }
    if req.run.is_some() {
        let path = format!("/v1/operations/{}/log", op.operation_id);
        std::io::stdout().write_all(&client.get_bytes(&path).await?)?;
    } else {
        // the throwaway container's files are gone: the reply carries the output
        print!("{}", op.output.as_deref().unwrap_or(""));
    }
    std::io::stdout().flush()?;
    if op.status != "completed" {
        eprintln!("opkernel: {}", describe(&op));
    }
    Ok(exit_status(&op.status, op.exit_code))
}

pub(super) async fn kill(client: &Client, operation_id: &str, json: bool) -> anyhow::Result<i32> {
    let state: OpView = client
        .get_as(&format!("/v1/operations/{operation_id}"))
        .await?;
    let op: OpView = client
        .post_as(
            &format!("/v1/runs/{}/tools/kill_operation", state.run_id),
            &json!({"operation_id": operation_id}),
            None,
        )
        .await?;
    print_op(&op, json);
    Ok(0)
}

pub(super) async fn state(client: &Client, operation_id: &str, json: bool) -> anyhow::Result<i32> {
    let op: OpView = client
        .get_as(&format!("/v1/operations/{operation_id}"))
        .await?;
    print_op(&op, json);
    Ok(0)
}

/// `opkernel logs`: the log so far, or (`--follow`) the live console until
/// the op ends, exiting with its status.
pub(super) async fn logs(client: &Client, operation_id: &str, follow: bool) -> anyhow::Result<i32> {
    if !follow {
        let bytes = client
            .get_bytes(&format!("/v1/operations/{operation_id}/log"))
            .await?;
        std::io::stdout().write_all(&bytes)?;
        return Ok(0);
    }
    let mut out = std::io::stdout();
    let mut status = 0;
    let path = format!("/v1/operations/{operation_id}/console");
    client
        .sse(&path, |event, data| {
            let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
            match event {
                "output" => {
                    let _ = out.write_all(v["text"].as_str().unwrap_or("").as_bytes());
                    let _ = out.flush();
                    true
                }
                "done" => {
                    let code = v["exit_code"].as_i64().map(|c| c as i32);
                    let state = v["status"].as_str().unwrap_or("-");
                    eprintln!("[opkernel: {state} exit_code={}]", or_dash(&code));
                    status = exit_status(state, code);
                    false
                }
                _ => true,
            }
        })
        .await?;
    Ok(status)
}

async fn ack(client: &Client, run: &str, report_id: &str) -> anyhow::Result<()> {
    client
        .post(
            &format!("/v1/runs/{run}/report/{report_id}/ack"),
            &json!({}),
        )
        .await?;
    Ok(())
}

/// `opkernel report`: waits for the next report, prints it, then acks it.
pub(super) async fn report(
    client: &Client,
    run: &str,
    wait: u64,
    json: bool,
) -> anyhow::Result<i32> {
    let report: Report = client
        .get_as(&format!("/v1/runs/{run}/report?wait={wait}"))
        .await?;
    if json {
        print_json(&report)
    } else {
        print!("{}", report.text)
    }
    if let Some(id) = &report.report_id {
        ack(client, run, id).await?;
    }
    Ok(0)
}

pub(super) async fn note(client: &Client, run: &str, text: &str) -> anyhow::Result<i32> {
    client
        .post(&format!("/v1/runs/{run}/notes"), &json!({"text": text}))
        .await?;
    Ok(0)
}

/// `opkernel finish`: waits for every op of the run, prints the outcomes
/// and every pending report (acking each: this is its one showing).
pub(super) async fn finish(client: &Client, run: &str, json: bool) -> anyhow::Result<i32> {
    let done: FinishView = client
        .post_as(&format!("/v1/runs/{run}/finish"), &json!({}), None)
        .await?;
    // a report holds at most so much: ack and fetch until nothing is pending
    let mut texts = Vec::new();
    let mut report = done.report.clone();
    while let Some(r) = report.filter(|r| r.report_id.is_some()) {
        texts.push(r.text.clone());
        ack(client, run, r.report_id.as_deref().unwrap_or_default()).await?;
        report = Some(client.get_as(&format!("/v1/runs/{run}/report")).await?);
    }
    if json {
        let mut v = serde_json::to_value(&done)?;
        v["report_texts"] = json!(texts);
        print_json(&v);
    } else {
        for op in &done.operations {
            println!("{}", describe(op));
        }
        for text in &texts {
            print!("{text}");
        }
    }
    Ok(0)
}

/// `opkernel token`: registers a run (operator) or creates a child run (run
/// token) and prints the new run's token.
pub(super) async fn token(
    client: &Client,
    run: &str,
    envelope: Option<Value>,
    budget: Option<Value>,
    json: bool,
) -> anyhow::Result<i32> {
    let mut body = json!({"run_id": run});
    if let Some(e) = envelope {
        body["envelope"] = e;
    }
    if let Some(b) = budget {
        body["budget"] = b;
    }
    let v = client.post("/v1/runs", &body).await?;
    if json {
        print_json(&v);
    } else {
        println!("{}", v["token"].as_str().unwrap_or("-"));
    }
    Ok(0)
}

pub(super) async fn ps(
    client: &Client,
    run: Option<&str>,
    json: bool,
    limit: u32,
) -> anyhow::Result<i32> {
    let mut path = format!("/v1/ops?limit={limit}");
    if let Some(run) = run {
        path.push_str(&format!("&run={run}"));
    }
    let list: OpList = client.get_as(&path).await?;
    if json {
        print_json(&list);
        return Ok(0);
    }
    println!(
        "{:<24} {:<36} {:<10} {:>8}  {:<12} COMMAND",
        "RUN", "OPERATION", "STATUS", "AGE", "CONTAINER"
    );
    for op in &list.operations {
        let container = op.container_id.as_deref().unwrap_or("-");
        println!(
            "{:<24} {:<36} {:<10} {:>8}  {:<12} {}",
            op.run_id,
            op.operation_id,
            op.status,
            crate::report_text::human_duration(op.duration_sec as u64),
            &container[..container.len().min(12)],
            crate::report_text::command_line(&op.command)
        );
    }
    Ok(0)
}

pub(super) async fn containers(client: &Client, json: bool) -> anyhow::Result<i32> {
    let list: ContainerList = client.get_as("/v1/containers").await?;
    if json {
        print_json(&list);
        return Ok(0);
    }
    for c in &list.containers {
        println!(
            "{} {} run={} state={} registered={}",
            &c.container_id[..c.container_id.len().min(12)],
            c.name,
            or_dash(&c.run_id),
            c.state,
            c.registered
        );
    }
    Ok(0)
}

pub(super) async fn reap(client: &Client, dry_run: bool, json: bool) -> anyhow::Result<i32> {
    let list: ReapList = client
        .post_as(&format!("/v1/reap?dry_run={dry_run}"), &json!({}), None)
        .await?;
    if json {
        print_json(&list);
        return Ok(0);
    }
    for d in &list.decisions {
        let action = serde_json::to_value(d.action)?;
        println!(
            "{:<7} {} run={} {}{}",
            action.as_str().unwrap_or("-"),
            d.name,
            or_dash(&d.run_id),
            d.reason,
            if dry_run { " (dry run)" } else { "" }
        );
    }
    Ok(0)
}
