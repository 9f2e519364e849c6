//! The `opkernel` command line: `serve` runs the daemon; every other verb is
//! a client of its HTTP API.

pub mod client;
mod tasks;
mod verbs;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use client::{default_home, Client};

use crate::views::OpView;

#[derive(Debug, Parser)]
#[command(
    name = "opkernel",
    version,
    about = "Container sandbox operation kernel for AI agents"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the kernel daemon
    Serve {
        #[arg(long, default_value = "127.0.0.1:7878")]
        listen: SocketAddr,
        /// Kernel home (control plane, tokens, scratch dirs) [default: $OPKERNEL_HOME or ~/.opkernel]
        #[arg(long)]
        home: Option<PathBuf>,
        /// Allow listening on a non-loopback address
        #[arg(long)]
        allow_remote: bool,
        /// Enable the fault hooks used by recovery drills
        #[arg(long, hide = true)]
        drills: bool,
    },
    /// Run a command in a run's sandbox (without --run: in a throwaway container)
    Run {
        #[arg(long)]
        run: Option<String>,
        #[arg(long)]
        background: bool,
        #[arg(long)]
        timeout: Option<u64>,
        #[arg(long)]
        json: bool,
        #[arg(long)]
        idempotency_key: Option<String>,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Kill an operation (SIGTERM, grace, SIGKILL)
    Kill {
        operation_id: String,
        #[arg(long)]
        json: bool,
    },
    /// Show an operation's state
    State {
        operation_id: String,
        #[arg(long)]
        json: bool,
    },
    /// Print an operation's output
    Logs {
        operation_id: String,
        #[arg(long, short)]
        follow: bool,
    },
    /// Wait for and print the next background operations report, then ack it
    Report {
        #[arg(long)]
        run: String,
        #[arg(long, default_value_t = 0)]
        wait: u64,
        #[arg(long)]
        json: bool,
    },
    /// Add a note (steer) for a run; it wakes a waiting report
    Note {
        #[arg(long)]
        run: String,
        text: String,
    },
    /// Wait until every op of a run is terminal and print the outcomes
    Finish {
        #[arg(long)]
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// Register a run and print its run token (with a run token: create a
    /// child of that run, which may only narrow its envelope and budget)
    Token {
        #[arg(long)]
        run: String,
        /// Envelope as JSON, e.g. '{"memory_bytes": 536870912, "max_timeout_sec": 600}'
        #[arg(long)]
        envelope: Option<String>,
        /// Budget as JSON, e.g. '{"tokens": 200000, "op_seconds": 3600}'
        #[arg(long)]
        budget: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List runs as a parent/child tree
    Runs {
        #[arg(long)]
        json: bool,
    },
    /// Show a run: state, parent, chain, children, envelope, budget, usage
    RunState {
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// Pause a run (and what it delegated): nothing new is admitted
    Pause {
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// Resume a paused run
    Resume {
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// Cancel a run and its descendants: every live op is killed
    Cancel {
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// Complete a run with a summary (refused while its ops are live)
    Complete {
        run: String,
        #[arg(long)]
        summary: String,
        #[arg(long)]
        json: bool,
    },
    /// Show a run's usage and budget, or (with --model) record model usage
    Usage {
        run: String,
        #[arg(long)]
        model: Option<String>,
        #[arg(long, default_value_t = 0)]
        input_tokens: u64,
        #[arg(long, default_value_t = 0)]
        output_tokens: u64,
        #[arg(long, default_value_t = 0)]
        cost_micros: u64,
        #[arg(long)]
        json: bool,
    },
    /// Print a run's events (its trace); --follow streams new ones
    Events {
        run: String,
        #[arg(long, default_value_t = 0)]
        after: i64,
        #[arg(long, short)]
        follow: bool,
        #[arg(long)]
        json: bool,
    },
    /// List operations
    Ps {
        #[arg(long)]
        run: Option<String>,
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// List managed containers
    Containers {
        #[arg(long)]
        json: bool,
    },
    /// Remove abandoned run containers
    Reap {
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        json: bool,
    },
    /// Schedules: commands a run runs later or repeatedly
    Schedule {
        #[command(subcommand)]
        action: ScheduleCmd,
    },
    /// List operations waiting for approval
    Approvals {
        #[arg(long)]
        json: bool,
    },
    /// Approve a waiting operation (operator token only): it starts now
    Approve {
        operation_id: String,
        #[arg(long)]
        json: bool,
    },
    /// Deny a waiting operation (operator token only): it ends denied
    Deny {
        operation_id: String,
        #[arg(long)]
        reason: String,
        #[arg(long)]
        json: bool,
    },
    /// Serve MCP over stdio as one run (agent hosts launch it); talks to the
    /// daemon at OPKERNEL_URL with the run token in OPKERNEL_TOKEN
    Mcp {
        #[arg(long)]
        run: String,
    },
    /// Run recovery drills against the local Docker engine
    Drill {
        #[arg(default_value = "all")]
        name: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ScheduleCmd {
    /// Add a schedule to a run: exactly one of --cron, --every, --at
    Add {
        #[arg(long)]
        run: String,
        /// 5-field cron expression, UTC
        #[arg(long)]
        cron: Option<String>,
        /// Every SEC seconds
        #[arg(long)]
        every: Option<u64>,
        /// Once, at an RFC 3339 time
        #[arg(long)]
        at: Option<String>,
        #[arg(long)]
        timeout: Option<u64>,
        /// After a kernel outage, fire once for the missed time(s)
        #[arg(long)]
        catch_up: bool,
        /// A one-shot that succeeded is deleted
        #[arg(long)]
        delete_after_success: bool,
        #[arg(long)]
        json: bool,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// List schedules (of a run and its descendants, or all the token reaches)
    Ls {
        #[arg(long)]
        run: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Delete a schedule
    Rm {
        #[arg(long)]
        run: String,
        schedule_id: String,
    },
    /// Pause a schedule
    Pause {
        #[arg(long)]
        run: String,
        schedule_id: String,
    },
    /// Resume a paused schedule
    Resume {
        #[arg(long)]
        run: String,
        schedule_id: String,
    },
}

fn print_json(v: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// A view as JSON with its keys in order, as the API's answer itself
/// prints (`--json` of the verbs that print an answer whole).
fn print_answer(v: &impl serde::Serialize) {
    print_json(&serde_json::to_value(v).unwrap_or_default());
}

/// A view as one line of JSON, keys in order.
fn compact(v: &impl serde::Serialize) -> String {
    serde_json::to_value(v).unwrap_or_default().to_string()
}

fn or_dash<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".to_owned(), T::to_string)
}

/// Exit status for a foreground op that did not complete with a code.
pub fn exit_status(status: &str, exit_code: Option<i32>) -> i32 {
    match status {
        "completed" => exit_code.unwrap_or(1),
        "timed_out" => 124,
        "lost" => 125,
        _ => 126,
    }
}

/// An op as JSON, or as its one-line description.
fn print_op(op: &OpView, json: bool) {
    if json {
        print_json(op)
    } else {
        println!("{}", describe(op))
    }
}

fn describe(op: &OpView) -> String {
    let mut line = format!(
        "{} {} attempt={} exit_code={} killed={}",
        op.operation_id,
        op.status,
        op.attempt,
        or_dash(&op.exit_code),
        op.killed
    );
    if let Some(m) = &op.message {
        line.push_str(&format!(" ({m})"));
    }
    if let Some(e) = &op.effect {
        line.push_str(&format!(" effect={e}"));
    }
    line
}

/// Runs a client verb against the daemon; returns the process exit status.
pub async fn run_client(cmd: Command) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    match cmd {
        Command::Run {
            run,
            background,
            timeout,
            json,
            idempotency_key,
            command,
        } => {
            let req = RunRequest {
                run,
                background,
                timeout,
                idempotency_key,
                command,
            };
            verbs::run(&client, req, json).await
        }
        Command::Kill { operation_id, json } => verbs::kill(&client, &operation_id, json).await,
        Command::State { operation_id, json } => verbs::state(&client, &operation_id, json).await,
        Command::Logs {
            operation_id,
            follow,
        } => verbs::logs(&client, &operation_id, follow).await,
        Command::Report { run, wait, json } => verbs::report(&client, &run, wait, json).await,
        Command::Note { run, text } => verbs::note(&client, &run, &text).await,
        Command::Finish { run, json } => verbs::finish(&client, &run, json).await,
        Command::Token {
            run,
            envelope,
            budget,
            json,
        } => {
            let parse = |what: &str,
                         v: Option<String>|
             -> anyhow::Result<Option<serde_json::Value>> {
                v.map(|v| serde_json::from_str(&v).with_context(|| format!("--{what} is not JSON")))
                    .transpose()
            };
            let envelope = parse("envelope", envelope)?;
            let budget = parse("budget", budget)?;
            verbs::token(&client, &run, envelope, budget, json).await
        }
        Command::Ps { run, json, limit } => verbs::ps(&client, run.as_deref(), json, limit).await,
        Command::Containers { json } => verbs::containers(&client, json).await,
        Command::Reap { dry_run, json } => verbs::reap(&client, dry_run, json).await,
        Command::Mcp { run } => {
            sandbox::profile::validate_run_id(&run)?;
            crate::mcp::http::serve_stdio(client.base().to_owned(), client.token().to_owned(), run)
                .await
        }
        Command::Serve { .. } | Command::Drill { .. } => {
            bail!("this verb is not a client verb")
        }
        task => run_task_verb(&client, task).await,
    }
}

/// The verbs of runs as tasks, schedules and approvals.
async fn run_task_verb(client: &Client, cmd: Command) -> anyhow::Result<i32> {
    match cmd {
        Command::Runs { json } => tasks::runs(client, json).await,
        Command::RunState { run, json } => tasks::run_state(client, &run, json).await,
        Command::Pause { run, json } => tasks::change(client, &run, "pause", None, json).await,
        Command::Resume { run, json } => tasks::change(client, &run, "resume", None, json).await,
        Command::Cancel { run, json } => tasks::change(client, &run, "cancel", None, json).await,
        Command::Complete { run, summary, json } => {
            tasks::change(client, &run, "complete", Some(summary), json).await
        }
        Command::Usage {
            run,
            model,
            input_tokens,
            output_tokens,
            cost_micros,
            json,
        } => {
            let record = model.map(|model| {
                serde_json::json!({
                    "model": model,
                    "input_tokens": input_tokens,
                    "output_tokens": output_tokens,
                    "cost_micros": cost_micros,
                })
            });
            tasks::usage(client, &run, record, json).await
        }
        Command::Events {
            run,
            after,
            follow,
            json,
        } => tasks::events(client, &run, after, follow, json).await,
        Command::Schedule { action } => tasks::schedule(client, action).await,
        Command::Approvals { json } => tasks::approvals(client, json).await,
        Command::Approve { operation_id, json } => {
            tasks::decide(client, &operation_id, None, json).await
        }
        Command::Deny {
            operation_id,
            reason,
            json,
        } => tasks::decide(client, &operation_id, Some(reason), json).await,
        _ => bail!("this verb is not a task verb"),
    }
}

/// `opkernel run`'s arguments.
struct RunRequest {
    run: Option<String>,
    background: bool,
    timeout: Option<u64>,
    idempotency_key: Option<String>,
    command: Vec<String>,
}

/// `opkernel serve`.
pub async fn run_serve(
    listen: SocketAddr,
    home: Option<PathBuf>,
    allow_remote: bool,
    drills: bool,
) -> anyhow::Result<i32> {
    if !listen.ip().is_loopback() {
        if !allow_remote {
            bail!("refusing to listen on non-loopback address {listen}: pass --allow-remote to expose the kernel");
        }
        tracing::warn!(%listen, "listening on a non-loopback address: anyone who can reach it and holds a token can run commands");
    }
    let home = home.unwrap_or_else(default_home);
    let mut config = crate::config::Config::from_env(home.clone(), listen);
    config.drills |= drills;
    crate::serve::serve(config, |addr| {
        eprintln!(
            "opkernel listening on http://{addr} (home {})",
            home.display()
        );
    })
    .await
    .context("kernel stopped")?;
    Ok(0)
}
