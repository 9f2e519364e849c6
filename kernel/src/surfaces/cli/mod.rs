//! The `opkernel` client verbs: each a client of the daemon's HTTP API.

mod attach;
pub mod client;
mod files;
mod nodes;
mod runs;
mod verbs;

use anyhow::{bail, Context};
use clap::Subcommand;
use client::Client;

use crate::lifecycle::Status;
use crate::runs::RunAction;
use crate::surfaces::views::OpView;

/// The client verbs of the `opkernel` binary (`serve`, `settings` and
/// `drill` are the app's own: `crate::app::cli`).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in a run's sandbox (without --run: in a throwaway container)
    Run {
        /// Run to use [default: a throwaway container, foreground only]
        #[arg(long)]
        run: Option<String>,
        /// Answer at once; the result arrives in a later report
        #[arg(long)]
        background: bool,
        /// Seconds from the start [default: 900 background, 300 foreground]
        #[arg(long)]
        timeout: Option<u64>,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
        /// A retry with the same key returns the same operation
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Keep its stdin open and attach this terminal (needs --run; with
        /// --background: start it without attaching, for `opkernel write`)
        #[arg(long)]
        stdin: bool,
        /// Run it on a terminal and attach this one, raw (needs --run; Ctrl-] detaches)
        #[arg(long, conflicts_with = "stdin")]
        tty: bool,
        /// The command and its arguments, after --
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Write a line to an operation's stdin and print what it answers
    Write(attach::WriteArgs),
    /// Print an operation's output from an offset (--follow: until it ends)
    Output(attach::OutputArgs),
    /// Kill an operation (SIGTERM, grace, SIGKILL), or send it one signal
    Kill {
        /// Operation to kill
        operation_id: String,
        /// Send only this signal (INT, TERM, KILL, HUP, QUIT, USR1, USR2)
        #[arg(long)]
        signal: Option<String>,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Show an operation's state
    State {
        /// Operation to show
        operation_id: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Print an operation's output
    Logs {
        /// Operation whose output to print
        operation_id: String,
        /// Keep streaming the output until the operation ends
        #[arg(long, short)]
        follow: bool,
    },
    /// Wait for and print the next background operations report, then ack it
    Report {
        /// Run whose report to drain
        #[arg(long)]
        run: String,
        /// Seconds to wait for a result or a note
        #[arg(long, default_value_t = 0)]
        wait: u64,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Add a note (steer) for a run; it wakes a waiting report
    Note {
        /// Run to steer
        #[arg(long)]
        run: String,
        /// The note, delivered with the run's next report
        text: String,
    },
    /// Wait until every op of a run is terminal and print the outcomes
    Finish {
        /// Run to finish
        #[arg(long)]
        run: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Register a run and print its run token (with a run token: create a
    /// child of that run, which may only narrow its envelope and budget)
    Token(verbs::TokenArgs),
    /// Copy a file or directory between here and a run: `RUN:/path` on one side
    Cp {
        /// Source: a local path or RUN:/path
        src: String,
        /// Destination: a local path or RUN:/path (ending in / or an existing dir: under the source's name)
        dst: String,
    },
    /// List a directory of a run's container: RUN:/path
    Ls {
        /// RUN:/path
        target: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// List runs as a parent/child tree
    Runs {
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Show a run: state, parent, chain, children, envelope, budget, usage
    RunState {
        /// Run to show
        run: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Pause a run (and what it delegated): nothing new is admitted
    Pause {
        /// Run to pause
        run: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Resume a paused run
    Resume {
        /// Run to resume
        run: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Cancel a run and its descendants: every live op is killed
    Cancel {
        /// Run to cancel
        run: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Set a run's egress allow list (a run narrows its own; the
    /// operator may widen); new connections follow at once
    Network {
        /// The run whose list changes
        run: String,
        /// An entry of the new list: host, *.domain, host:port or IPv4;
        /// none given: an empty list, nothing allowed
        #[arg(long = "allow")]
        allow: Vec<String>,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Complete a run with a summary (refused while its ops are live)
    Complete {
        /// Run to complete
        run: String,
        /// What the run achieved, recorded with its completion
        #[arg(long)]
        summary: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Show a run's usage and budget, or (with --model) record model usage
    Usage {
        /// Run whose usage to show or record
        run: String,
        /// Model name: record this usage instead of showing it
        #[arg(long)]
        model: Option<String>,
        /// Input tokens to record (with --model)
        #[arg(long, default_value_t = 0)]
        input_tokens: u64,
        /// Output tokens to record (with --model)
        #[arg(long, default_value_t = 0)]
        output_tokens: u64,
        /// Cost to record, in millionths of a currency unit (with --model)
        #[arg(long, default_value_t = 0)]
        cost_micros: u64,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Print a run's events (its trace); --follow streams new ones
    Events {
        /// Run whose events to print
        run: String,
        /// Print only events with a sequence number above this one
        #[arg(long, default_value_t = 0)]
        after: i64,
        /// Keep streaming new events
        #[arg(long, short)]
        follow: bool,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// List operations
    Ps {
        /// Only this run's operations [default: every run the token reaches]
        #[arg(long)]
        run: Option<String>,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
        /// Most operations to list, newest first
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show one container inside and out: labels, profile, its run's ops,
    /// its processes, scratch use and the reaper's verdict
    Inspect {
        /// A container id (or a prefix of it), a container name, or a run id
        target: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// List managed containers
    Containers {
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// List the cluster's nodes
    Nodes {
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Act on one cluster node
    Node {
        /// What to do to it
        #[command(subcommand)]
        action: nodes::NodeAction,
    },
    /// Remove abandoned run containers
    Reap {
        /// Show the decisions without removing anything
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Schedules: commands a run runs later or repeatedly
    Schedule {
        /// What to do with schedules
        #[command(subcommand)]
        action: ScheduleCmd,
    },
    /// List operations waiting for approval
    Approvals {
        /// Print JSON instead of text (with --follow: one line per event)
        #[arg(long)]
        json: bool,
        /// Keep watching: print each approval as it starts waiting, and
        /// again when it escalates (until interrupted)
        #[arg(long)]
        follow: bool,
    },
    /// Approve a waiting operation (operator token only): it starts now
    Approve {
        /// Operation awaiting approval
        operation_id: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Deny a waiting operation (operator token only): it ends denied
    Deny {
        /// Operation awaiting approval
        operation_id: String,
        /// Why, delivered to the agent in the run's next report
        #[arg(long)]
        reason: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Serve MCP over stdio as one run (agent hosts launch it); talks to the
    /// daemon at OPKERNEL_URL with the run token in OPKERNEL_TOKEN
    Mcp {
        /// Run the server acts as; OPKERNEL_TOKEN must be its token
        #[arg(long)]
        run: String,
    },
}

/// The `opkernel schedule` verbs.
#[derive(Debug, Subcommand)]
pub enum ScheduleCmd {
    /// Add a schedule to a run: exactly one of --cron, --every, --at
    Add {
        /// Run the schedule belongs to and fires as
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
        /// Timeout of each fired operation, in seconds [default: the background default]
        #[arg(long)]
        timeout: Option<u64>,
        /// After a kernel outage, fire once for the missed time(s)
        #[arg(long)]
        catch_up: bool,
        /// A one-shot that succeeded is deleted
        #[arg(long)]
        delete_after_success: bool,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
        /// The command and its arguments, after --
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// List schedules (of a run and its descendants, or all the token reaches)
    Ls {
        /// Only this run's and its descendants' schedules [default: all the token reaches]
        #[arg(long)]
        run: Option<String>,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Delete a schedule
    Rm {
        /// Run the schedule belongs to
        #[arg(long)]
        run: String,
        /// Schedule to delete
        schedule_id: String,
    },
    /// Pause a schedule
    Pause {
        /// Run the schedule belongs to
        #[arg(long)]
        run: String,
        /// Schedule to pause
        schedule_id: String,
    },
    /// Resume a paused schedule
    Resume {
        /// Run the schedule belongs to
        #[arg(long)]
        run: String,
        /// Schedule to resume
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

/// A flag's JSON value, read as the request type it stands for.
pub(super) fn parse_json<T: serde::de::DeserializeOwned>(
    what: &str,
    v: Option<String>,
) -> anyhow::Result<Option<T>> {
    v.map(|v| serde_json::from_str(&v).with_context(|| format!("--{what} is not a valid {what}")))
        .transpose()
}

/// Exit status of a foreground op: its code once completed; else one
/// that says how it ended (`None`: the op is gone).
pub fn exit_status(status: Option<Status>, exit_code: Option<i32>) -> i32 {
    match status {
        Some(Status::Completed) => exit_code.unwrap_or(1),
        Some(Status::TimedOut) => 124,
        Some(Status::Lost) => 125,
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

/// Runs a client verb against the daemon `client` reaches; returns the
/// process exit status.
pub async fn run_client(client: Client, cmd: Command) -> anyhow::Result<i32> {
    match cmd {
        Command::Run {
            run,
            background,
            timeout,
            json,
            idempotency_key,
            stdin,
            tty,
            command,
        } => {
            let req = RunRequest {
                run,
                background,
                timeout,
                idempotency_key,
                stdin,
                tty,
                command,
            };
            verbs::run(&client, req, json).await
        }
        Command::Write(args) => attach::write(&client, args).await,
        Command::Output(args) => attach::output(&client, args).await,
        Command::Kill {
            operation_id,
            signal,
            json,
        } => verbs::kill(&client, &operation_id, signal.as_deref(), json).await,
        Command::State { operation_id, json } => verbs::state(&client, &operation_id, json).await,
        Command::Logs {
            operation_id,
            follow,
        } => verbs::logs(&client, &operation_id, follow).await,
        Command::Report { run, wait, json } => verbs::report(&client, &run, wait, json).await,
        Command::Note { run, text } => verbs::note(&client, &run, &text).await,
        Command::Finish { run, json } => verbs::finish(&client, &run, json).await,
        Command::Token(args) => verbs::token(&client, args).await,
        Command::Cp { src, dst } => files::cp(&client, &src, &dst).await,
        Command::Ls { target, json } => files::ls(&client, &target, json).await,
        Command::Ps { run, json, limit } => verbs::ps(&client, run.as_deref(), json, limit).await,
        Command::Containers { json } => verbs::containers(&client, json).await,
        Command::Nodes { json } => nodes::list(&client, json).await,
        Command::Node { action } => nodes::act(&client, action).await,
        Command::Inspect { target, json } => verbs::inspect(&client, &target, json).await,
        Command::Reap { dry_run, json } => verbs::reap(&client, dry_run, json).await,
        Command::Mcp { run } => {
            sandbox::profile::validate_run_id(&run)?;
            crate::surfaces::mcp::http::serve_stdio(
                client.base().to_owned(),
                client.token().to_owned(),
                run,
            )
            .await
        }
        task => run_task_verb(&client, task).await,
    }
}

/// The verbs of runs as tasks, schedules and approvals.
async fn run_task_verb(client: &Client, cmd: Command) -> anyhow::Result<i32> {
    match cmd {
        Command::Runs { json } => runs::runs(client, json).await,
        Command::RunState { run, json } => runs::run_state(client, &run, json).await,
        Command::Pause { run, json } => {
            runs::change(client, &run, RunAction::Pause, None, json).await
        }
        Command::Resume { run, json } => {
            runs::change(client, &run, RunAction::Resume, None, json).await
        }
        Command::Cancel { run, json } => {
            runs::change(client, &run, RunAction::Cancel, None, json).await
        }
        Command::Network { run, allow, json } => runs::network(client, &run, allow, json).await,
        Command::Complete { run, summary, json } => {
            runs::change(client, &run, RunAction::Complete, Some(summary), json).await
        }
        Command::Usage {
            run,
            model,
            input_tokens,
            output_tokens,
            cost_micros,
            json,
        } => {
            let record = model.map(|model| crate::surfaces::requests::UsageRequest {
                model,
                input_tokens,
                output_tokens,
                cost_micros,
            });
            runs::usage(client, &run, record, json).await
        }
        Command::Events {
            run,
            after,
            follow,
            json,
        } => runs::events(client, &run, after, follow, json).await,
        Command::Schedule { action } => runs::schedule(client, action).await,
        Command::Approvals {
            json,
            follow: false,
        } => runs::approvals(client, json).await,
        Command::Approvals { json, follow: true } => runs::follow_approvals(client, json).await,
        Command::Approve { operation_id, json } => {
            runs::decide(client, &operation_id, None, json).await
        }
        Command::Deny {
            operation_id,
            reason,
            json,
        } => runs::decide(client, &operation_id, Some(reason), json).await,
        _ => bail!("this verb is not a task verb"),
    }
}

/// `opkernel run`'s arguments.
struct RunRequest {
    run: Option<String>,
    background: bool,
    timeout: Option<u64>,
    idempotency_key: Option<String>,
    stdin: bool,
    tty: bool,
    command: Vec<String>,
}
