//! `opkernel` binary entry point.

use clap::Parser;
use opkernel::app::cli::{run, Cli};
use opkernel::app::settings::table::LOG;

fn main() {
    cap_malloc_arenas();
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

/// Caps glibc's malloc arenas at one per core, two at least (its default
/// is eight per core) unless the operator set them (`MALLOC_ARENA_MAX`, or
/// `glibc.malloc.arena_max` in `GLIBC_TUNABLES`). Each thread that
/// allocates takes an arena of its own until the cap, and memory freed
/// into one arena is not reused by another: with the runtime's blocking
/// threads, 5,000 live ops peaked at 103-111 MB of RSS with the default and
/// at 91-98 MB with two arenas, for no more CPU per op (`scripts/bench.sh`,
/// CHANGELOG.md). Called before any thread exists.
fn cap_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        if std::env::var_os("MALLOC_ARENA_MAX").is_some() || tunables.contains("arena_max") {
            return;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cap = i32::try_from(cores.max(2)).unwrap_or(i32::MAX);
        // SAFETY: only sets a malloc tunable, before any other thread
        // exists; a refused value leaves glibc's default
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, cap);
        }
    }
}
