//! `opkernel` binary entry point.

use clap::Parser;
use opkernel::app::cli::{run, Cli};
use opkernel::app::settings::parse_count;
use opkernel::app::settings::table::{LOG, MALLOC_ARENAS};

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

/// Sets glibc's malloc arenas (`OPKERNEL_MALLOC_ARENAS`; 0, the default:
/// one per core, two at least, where glibc gives eight per core). Each
/// thread that allocates takes an arena of its own until the cap, and
/// memory freed into one arena is not reused by another: with the
/// runtime's blocking threads, 5,000 live ops peaked at 103-111 MB of RSS
/// with glibc's default and at 91-98 MB with two arenas, for no more CPU
/// per op (`scripts/bench.sh`, CHANGELOG.md). Called before any thread
/// exists; a value that is not a count stops the process, named.
fn cap_malloc_arenas() {
    let text = std::env::var(MALLOC_ARENAS.env).unwrap_or_else(|_| MALLOC_ARENAS.default.into());
    let arenas = match parse_count(&text) {
        Ok(0) => std::thread::available_parallelism().map_or(2, |n| n.get().max(2)),
        Ok(n) => usize::try_from(n).unwrap_or(usize::MAX),
        Err(e) => {
            eprintln!("opkernel: {}: {e}", MALLOC_ARENAS.env);
            std::process::exit(2);
        }
    };
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cap = i32::try_from(arenas).unwrap_or(i32::MAX);
        // SAFETY: only sets a malloc tunable, before any other thread
        // exists; a refused value leaves glibc's default
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, cap);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = arenas;
}
