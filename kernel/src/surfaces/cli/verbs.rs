//! One function per client verb: each calls the daemon's HTTP API, reads
//! the typed view back and prints it (as text, or as JSON with `--json`).

use std::io::Write;

use anyhow::bail;
use serde::Serialize;

use super::client::Client;
use super::{describe, exit_status, or_dash, print_answer, print_json, print_op, RunRequest};
use crate::lifecycle::Status;
use crate::surfaces::requests::{CreateRun, KillOperation, Note, RunCommand};
use crate::surfaces::views::{
    ConsoleDone, ConsoleOutput, ContainerInspect, ContainerList, FinishView, NoteAdded, OpList,
    OpView, ReapList, Report, ReportAck, RunCreated,
};

/// `opkernel run`: a background op prints its start message; a foreground
/// one prints its output and exits with its code.
pub(super) async fn run(client: &Client, req: RunRequest, json: bool) -> anyhow::Result<i32> {
    let attached = (req.stdin || req.tty) && !req.background;
    if (req.stdin || req.tty) && req.run.is_none() {
        bail!("--stdin and --tty need --run: a throwaway container ends with its call");
    }
    // attached: the call answers at once (yield_ms 0) and the op goes on
    // while this terminal is attached to it
    let body = RunCommand {
        command: req.command.clone(),
        background: req.background,
        timeout_sec: req.timeout,
        stdin: req.stdin,
        tty: req.tty.then_some(crate::surfaces::requests::Tty::On(true)),
        yield_ms: attached.then_some(0),
    };
    let path = match &req.run {
        Some(run) => format!("/v1/runs/{run}/tools/run_command"),
        None if req.background => {
            bail!("--background needs --run: a throwaway container supports foreground only")
        }
        None => "/v1/tools/run_command".into(),
    };
    // one key per invocation, kept across the client's own retries (a
    // throwaway container's start has no key: it is sent once)
    let key = req.idempotency_key.as_deref();
    let op: OpView = match req.run {
        Some(_) => client.start_once(&path, &body, key).await?,
        None => client.post_as(&path, &body, key).await?,
    };
    if json {
        print_json(&op);
        return Ok(0);
    }
    if attached && !op.status.is_terminal() && op.status != Status::AwaitingApproval {
        return super::attach::attach(client, &op, req.tty).await;
    }
    if req.background || op.status == Status::AwaitingApproval {
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
    if op.status != Status::Completed {
        eprintln!("opkernel: {}", describe(&op));
    }
    Ok(exit_status(Some(op.status), op.exit_code))
}

pub(super) async fn kill(
    client: &Client,
    operation_id: &str,
    signal: Option<&str>,
    json: bool,
) -> anyhow::Result<i32> {
    let signal = match signal {
        None => None,
        Some(name) => Some(
            serde_json::from_value(serde_json::Value::String(name.to_ascii_uppercase())).map_err(
                |_| {
                    anyhow::anyhow!(
                        "unknown signal {name:?}: INT, TERM, KILL, HUP, QUIT, USR1 or USR2"
                    )
                },
            )?,
        ),
    };
    let state: OpView = client
        .get_as(&format!("/v1/operations/{operation_id}"))
        .await?;
    let op: OpView = client
        .post_as(
            &format!("/v1/runs/{}/tools/kill_operation", state.run_id),
            &KillOperation {
                operation_id: operation_id.to_owned(),
                signal,
            },
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
    if let (false, Some(o)) = (json, &op.origin) {
        println!("origin: {} ({}) by {}", o.surface, o.channel, o.principal);
    }
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
        .sse(&path, |event, data| match event {
            "output" => {
                if let Ok(output) = serde_json::from_str::<ConsoleOutput>(data) {
                    let _ = out.write_all(output.text.as_bytes());
                    let _ = out.flush();
                }
                true
            }
            "done" => {
                let done: ConsoleDone = serde_json::from_str(data).unwrap_or_default();
                let state = done.status.map_or("unknown", Status::as_str);
                eprintln!("[opkernel: {state} exit_code={}]", or_dash(&done.exit_code));
                status = exit_status(done.status, done.exit_code);
                false
            }
            _ => true,
        })
        .await?;
    Ok(status)
}

async fn ack(client: &Client, run: &str, report_id: &str) -> anyhow::Result<()> {
    let path = format!("/v1/runs/{run}/report/{report_id}/ack");
    let _: ReportAck = client.post_empty_as(&path).await?;
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
    let path = format!("/v1/runs/{run}/notes");
    let note = Note {
        text: text.to_owned(),
    };
    let _: NoteAdded = client.post_as(&path, &note, None).await?;
    Ok(0)
}

/// `opkernel finish --json`: the answer, and the text of every report it
/// printed.
#[derive(Debug, Serialize)]
struct FinishOutput<'a> {
    #[serde(flatten)]
    done: &'a FinishView,
    report_texts: &'a [String],
}

/// `opkernel finish`: waits for every op of the run, prints the outcomes
/// and every pending report (acking each: this is its one showing).
pub(super) async fn finish(client: &Client, run: &str, json: bool) -> anyhow::Result<i32> {
    let done: FinishView = client
        .post_empty_as(&format!("/v1/runs/{run}/finish"))
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
        print_answer(&FinishOutput {
            done: &done,
            report_texts: &texts,
        });
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

/// `opkernel token`'s flags.
#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    /// Run id to register (with a run token: the child's id)
    #[arg(long)]
    run: String,
    /// Envelope as JSON, e.g. '{"memory_bytes": 536870912, "max_timeout_sec": 600}'
    #[arg(long)]
    envelope: Option<String>,
    /// Budget as JSON, e.g. '{"tokens": 200000, "op_seconds": 3600}'
    #[arg(long)]
    budget: Option<String>,
    /// The run's image, by the operator's name (see GET /v1/images; a child: its parent's unless named)
    #[arg(long)]
    image: Option<String>,
    /// Start from a copy of another run's workspace: RUN or RUN@SNAPSHOT
    #[arg(long, value_name = "RUN[@SNAPSHOT]")]
    fork_from: Option<String>,
    /// With --fork-from RUN: freeze the source's containers while copying
    #[arg(long, requires = "fork_from")]
    consistent: bool,
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
}

/// `opkernel token`: registers a run (operator) or creates a child run (run
/// token), an image or a fork named, and prints the new run's token.
pub(super) async fn token(client: &Client, args: TokenArgs) -> anyhow::Result<i32> {
    let body = CreateRun {
        run_id: args.run,
        envelope: super::parse_json("envelope", args.envelope)?,
        budget: super::parse_json("budget", args.budget)?,
        image: args.image,
        fork_from: args.fork_from,
        consistent: args.consistent,
    };
    let json = args.json;
    let v: RunCreated = client.post_as("/v1/runs", &body, None).await?;
    if json {
        print_answer(&v);
    } else {
        println!("{}", v.token);
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
        .post_empty_as(&format!("/v1/reap?dry_run={dry_run}"))
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

/// `opkernel inspect CONTAINER|RUN`: one container inside and out.
pub(super) async fn inspect(client: &Client, target: &str, json: bool) -> anyhow::Result<i32> {
    let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if target.is_empty() || !target.chars().all(fine) {
        bail!("{target:?} is no container id, container name or run id");
    }
    let c: ContainerInspect = client.get_as(&format!("/v1/containers/{target}")).await?;
    if json {
        print_answer(&c);
        return Ok(0);
    }
    println!("container   {} ({})", c.container_id, c.name);
    println!("state       {}", c.state);
    println!("run         {}", or_dash(&c.run_id));
    println!("fingerprint {}", or_dash(&c.fingerprint));
    if let Some(p) = &c.profile {
        println!(
            "profile     image={} memory={} cpus={} pids={} network={} user={}",
            p.image,
            p.memory_bytes,
            p.cpus,
            p.pids_limit,
            p.network,
            p.run_as.as_deref().unwrap_or("root")
        );
    }
    println!(
        "scratch     {}",
        c.scratch_bytes.map_or("-".into(), |b| format!("{b} bytes"))
    );
    let verdict = serde_json::to_value(c.reaper.verdict)?;
    println!(
        "reaper      {} ({})",
        verdict.as_str().unwrap_or("-"),
        c.reaper.reason
    );
    println!("ops:");
    for op in &c.ops {
        let age = crate::report_text::human_duration((op.age_ms / 1000) as u64);
        println!(
            "  {} {:<10} {:>8} ago  {}",
            op.operation_id, op.status, age, op.command
        );
    }
    match (&c.processes, &c.processes_error) {
        (Some(procs), _) => {
            println!("processes:");
            println!(
                "  {:>7} {:<10} {:>8} {:>10} {:>8}  COMMAND",
                "PID", "USER", "CPU", "RSS", "AGE"
            );
            for p in procs {
                println!(
                    "  {:>7} {:<10} {:>7.2}s {:>9}K {:>7.0}s  {}",
                    p.pid,
                    p.user,
                    p.cpu,
                    p.rss / 1024,
                    p.age,
                    p.command
                );
            }
        }
        (None, why) => println!("processes: unknown ({})", why.as_deref().unwrap_or("-")),
    }
    Ok(0)
}
