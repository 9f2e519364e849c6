//! `opkernel` binary entry point.

use clap::Parser;
use opkernel::surfaces::cli::{run_client, run_serve, Cli, Command, ServeArgs};

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OPKERNEL_LOG")
                .unwrap_or_else(|_| "opkernel=info,warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("opkernel: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve {
                listen,
                home,
                allow_remote,
                store,
                node,
                advertise,
                drills,
            } => {
                run_serve(ServeArgs {
                    listen,
                    home,
                    allow_remote,
                    store,
                    node: node.zip(advertise),
                    drills,
                })
                .await
            }
            Command::Drill { name, json } => opkernel::drills::run_cli(&name, json).await,
            other => run_client(other).await,
        }
    });
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("opkernel: {e:#}");
            std::process::exit(1);
        }
    }
}
