//! `opkernel` binary entry point.

use clap::Parser;
use opkernel::app::cli::{run, Cli};
use opkernel::app::settings::table::LOG;

fn main() {
    let filter = std::env::var(LOG.env).unwrap_or_else(|_| LOG.default.to_owned());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|_| LOG.default.into()),
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
    match runtime.block_on(run(cli)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("opkernel: {e:#}");
            std::process::exit(1);
        }
    }
}
