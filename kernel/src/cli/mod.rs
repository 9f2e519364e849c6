//! The `opkernel` command line: `serve` runs the daemon; every other verb is
//! a client of its HTTP API.

pub mod client;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use serde_json::{json, Value};

use client::{default_home, Client};

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
    /// Register a run and print its run token
    Token {
        #[arg(long)]
        run: String,
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
    /// Run recovery drills against the local Docker engine
    Drill {
        #[arg(default_value = "all")]
        name: String,
        #[arg(long)]
        json: bool,
    },
}

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn str_of(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Exit status for a foreground op that did not complete with a code.
pub fn exit_status_of(op: &Value) -> i32 {
    match op["status"].as_str() {
        Some("completed") => op["exit_code"].as_i64().unwrap_or(1) as i32,
        Some("timed_out") => 124,
        Some("lost") => 125,
        _ => 126,
    }
}

/// An op as JSON, or as its one-line description.
fn print_op(op: &Value, json: bool) {
    if json {
        print_json(op)
    } else {
        println!("{}", describe(op))
    }
}

fn describe(op: &Value) -> String {
    let mut line = format!(
        "{} {} attempt={} exit_code={} killed={}",
        str_of(&op["operation_id"]),
        str_of(&op["status"]),
        str_of(&op["attempt"]),
        str_of(&op["exit_code"]),
        str_of(&op["killed"])
    );
    if let Some(m) = op["message"].as_str() {
        line.push_str(&format!(" ({m})"));
    }
    if let Some(e) = op["effect"].as_str() {
        line.push_str(&format!(" effect={e}"));
    }
    line
}

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
            let mut body = json!({"command": command, "background": background});
            if let Some(t) = timeout {
                body["timeout_sec"] = json!(t);
            }
            let path = match &run {
                Some(run) => format!("/v1/runs/{run}/tools/run_command"),
                None if background => bail!(
                    "--background needs --run: a throwaway container supports foreground only"
                ),
                None => "/v1/tools/run_command".into(),
            };
            let op = client
                .post_with(&path, &body, idempotency_key.as_deref())
                .await?;
            if json {
                print_json(&op);
                return Ok(0);
            }
            if background {
                println!("{}", str_of(&op["message"]));
                return Ok(0);
            }
            let id = str_of(&op["operation_id"]);
            if run.is_some() {
                let bytes = client
                    .get_bytes(&format!("/v1/operations/{id}/log"))
                    .await?;
                std::io::stdout().write_all(&bytes)?;
            } else {
                // the throwaway container's files are gone: the reply carries the output
                print!("{}", op["output"].as_str().unwrap_or(""));
            }
            std::io::stdout().flush()?;
            if op["status"] != "completed" {
                eprintln!("opkernel: {}", describe(&op));
            }
            Ok(exit_status_of(&op))
        }
        Command::Kill { operation_id, json } => {
            let state = client
                .get(&format!("/v1/operations/{operation_id}"))
                .await?;
            let run = str_of(&state["run_id"]);
            let op = client
                .post(
                    &format!("/v1/runs/{run}/tools/kill_operation"),
                    &json!({"operation_id": operation_id}),
                )
                .await?;
            print_op(&op, json);
            Ok(0)
        }
        Command::State { operation_id, json } => {
            let op = client
                .get(&format!("/v1/operations/{operation_id}"))
                .await?;
            print_op(&op, json);
            Ok(0)
        }
        Command::Logs {
            operation_id,
            follow,
        } => {
            if !follow {
                let bytes = client
                    .get_bytes(&format!("/v1/operations/{operation_id}/log"))
                    .await?;
                std::io::stdout().write_all(&bytes)?;
                return Ok(0);
            }
            let mut out = std::io::stdout();
            let mut status = 0;
            client
                .sse(
                    &format!("/v1/operations/{operation_id}/console"),
                    |event, data| {
                        let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
                        match event {
                            "output" => {
                                let _ = out.write_all(v["text"].as_str().unwrap_or("").as_bytes());
                                let _ = out.flush();
                                true
                            }
                            "done" => {
                                eprintln!(
                                    "[opkernel: {} exit_code={}]",
                                    str_of(&v["status"]),
                                    str_of(&v["exit_code"])
                                );
                                status = exit_status_of(&v);
                                false
                            }
                            _ => true,
                        }
                    },
                )
                .await?;
            Ok(status)
        }
        Command::Report { run, wait, json } => {
            let report = client
                .get(&format!("/v1/runs/{run}/report?wait={wait}"))
                .await?;
            if json {
                print_json(&report)
            } else {
                print!("{}", str_of(&report["text"]))
            }
            if let Some(id) = report["report_id"].as_str() {
                client
                    .post(&format!("/v1/runs/{run}/report/{id}/ack"), &json!({}))
                    .await?;
            }
            Ok(0)
        }
        Command::Note { run, text } => {
            client
                .post(&format!("/v1/runs/{run}/notes"), &json!({"text": text}))
                .await?;
            Ok(0)
        }
        Command::Finish { run, json } => {
            let mut done = client
                .post(&format!("/v1/runs/{run}/finish"), &json!({}))
                .await?;
            // a report holds at most so much: ack and fetch until nothing is pending
            let mut texts = Vec::new();
            let mut report = done["report"].clone();
            while let Some(id) = report["report_id"].as_str().map(str::to_owned) {
                texts.push(str_of(&report["text"]));
                client
                    .post(&format!("/v1/runs/{run}/report/{id}/ack"), &json!({}))
                    .await?;
                report = client.get(&format!("/v1/runs/{run}/report")).await?;
            }
            done["report_texts"] = json!(texts);
            if json {
                print_json(&done);
            } else {
                for op in done["operations"].as_array().into_iter().flatten() {
                    println!("{}", describe(op));
                }
                // what the agent had not yet been told, notes included: the
                // report is acked above, so this is its one showing
                for text in &texts {
                    print!("{text}");
                }
            }
            Ok(0)
        }
        Command::Token { run } => {
            let v = client.post("/v1/runs", &json!({"run_id": run})).await?;
            println!("{}", str_of(&v["token"]));
            Ok(0)
        }
        Command::Ps { run, json, limit } => {
            let mut path = format!("/v1/ops?limit={limit}");
            if let Some(run) = run {
                path.push_str(&format!("&run={run}"));
            }
            let v = client.get(&path).await?;
            if json {
                print_json(&v);
                return Ok(0);
            }
            println!(
                "{:<24} {:<36} {:<10} {:>8}  {:<12} COMMAND",
                "RUN", "OPERATION", "STATUS", "AGE", "CONTAINER"
            );
            for op in v["operations"].as_array().into_iter().flatten() {
                let cmd: Vec<String> = op["command"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| a.as_str().unwrap_or("").to_owned())
                    .collect();
                let container = op["container_id"]
                    .as_str()
                    .map(|c| &c[..c.len().min(12)])
                    .unwrap_or("-")
                    .to_owned();
                println!(
                    "{:<24} {:<36} {:<10} {:>8}  {:<12} {}",
                    str_of(&op["run_id"]),
                    str_of(&op["operation_id"]),
                    str_of(&op["status"]),
                    crate::report::human_duration(op["duration_sec"].as_f64().unwrap_or(0.0) as u64),
                    container,
                    crate::report::command_line(&cmd)
                );
            }
            Ok(0)
        }
        Command::Containers { json } => {
            let v = client.get("/v1/containers").await?;
            if json {
                print_json(&v);
                return Ok(0);
            }
            for c in v["containers"].as_array().into_iter().flatten() {
                println!(
                    "{} {} run={} state={} registered={}",
                    &str_of(&c["container_id"])[..12],
                    str_of(&c["name"]),
                    str_of(&c["run_id"]),
                    str_of(&c["state"]),
                    str_of(&c["registered"])
                );
            }
            Ok(0)
        }
        Command::Reap { dry_run, json } => {
            let v = client
                .post(&format!("/v1/reap?dry_run={dry_run}"), &json!({}))
                .await?;
            if json {
                print_json(&v);
                return Ok(0);
            }
            for d in v["decisions"].as_array().into_iter().flatten() {
                println!(
                    "{:<7} {} run={} {}{}",
                    str_of(&d["action"]),
                    str_of(&d["name"]),
                    str_of(&d["run_id"]),
                    str_of(&d["reason"]),
                    if dry_run { " (dry run)" } else { "" }
                );
            }
            Ok(0)
        }
        Command::Serve { .. } | Command::Drill { .. } => unreachable_verb(),
    }
}

fn unreachable_verb() -> anyhow::Result<i32> {
    bail!("this verb is not a client verb")
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
