//! `opkernel-shim`: the static helper mounted read-only at `/.opkernel/shim`
//! in every run container. It needs nothing from the image.
//!
//! - `launch [--io=<mode>] <op id> <run-as> <log cap> <command>...`: runs an op (see `launch.rs`);
//! - `probe`: lists the processes that carry an op marker;
//! - `ps`: their process table (user, CPU, RSS, age, command) for inspect;
//! - `signal <op id> <launcher pid> <start ticks> TERM|KILL`: signals an op's processes;
//! - `keep <command>...`: a terminal op's session keeper where the terminal's
//!   foreground group cannot be read from outside (see `keep.rs`);
//! - `relay <nonce> <host>`: answers one stdin question (see `relay.rs`);
//! - `serve`: the container's main process, the resident launcher (see `serve.rs`);
//! - `idle`: the main process of containers without a launcher; sleeps until stopped.

mod input;
mod keep;
mod launch;
mod ps;
mod pty;
mod relay;
mod scan;
mod serve;
mod sys;
mod tree;

use std::ffi::OsString;

fn main() {
    let mut args = std::env::args_os().skip(1);
    let verb = args.next().and_then(|v| v.into_string().ok());
    let rest: Vec<OsString> = args.collect();
    let code = match verb.as_deref() {
        Some("launch") => launch::main(rest),
        Some(keep::VERB) => keep::main(rest),
        Some("probe") => scan::probe(rest),
        Some("relay") => relay::main(rest),
        Some("ps") => ps::main(rest),
        Some("signal") => scan::signal(rest),
        Some("serve") => serve::main(rest),
        Some("idle") => loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        },
        Some("version") => {
            println!("opkernel-shim {}", env!("CARGO_PKG_VERSION"));
            0
        }
        _ => {
            eprintln!("usage: opkernel-shim launch|probe|ps|signal|serve|idle|version ...");
            2
        }
    };
    std::process::exit(code);
}
