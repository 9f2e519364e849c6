//! opkernel-shim: the one program opkernel runs inside a run container.
//!
//! The binary (`src/main.rs`) is linked statically and bind-mounted
//! read-only at [`SHIM_PATH`]; it needs nothing from the image. This library
//! holds what the shim and the host share: the op file formats (written by
//! the shim, parsed by the kernel), the probe and signaller output, the
//! run-as rule and the `/proc` parsing. Everything here is pure.

#![deny(missing_docs)]

pub mod format;
pub mod procfs;
pub mod stdin;
pub mod table;
pub mod user;

pub use format::{
    marker, parse_probe, parse_signalled, validate_op_id, ExitRecord, FormatError, Handback,
    MarkedProcess, OpResult, PidRecord, Request, Signal, Usage, MARKER_VAR,
};
pub use stdin::Io;
pub use user::{passwd_lookup, RunAs, RunUser};

/// Where the shim is mounted in every run container.
pub const SHIM_PATH: &str = "/.opkernel/shim";
/// Where the op files live inside the container (a separate, root-owned mount).
pub const OPS_DIR: &str = "/scratch/.ops";
/// Where the kernel hands ops to the resident launcher (`serve`).
pub const INBOX_DIR: &str = "/scratch/.ops/inbox";
/// A probe asked of the launcher: `inbox/<nonce>.probe`, answered with
/// `inbox/<nonce>.listing` (the probe listing).
pub const PROBE_SUFFIX: &str = "probe";
/// The suffix of the launcher's answer to a probe: `inbox/<nonce>.listing`.
pub const LISTING_SUFFIX: &str = "listing";
/// A probe question asking for the process table (`ps`) instead of the
/// probe listing: `<hostname>` then this, after a tab. A launcher that
/// predates it answers nothing (the question names no host it knows), and
/// the kernel asks by `docker exec`.
pub const PS_QUESTION: &str = "ps";

/// Stdin frames the kernel asks the launcher to put into an op's FIFO
/// (under gVisor the FIFO is inside the sandbox, out of the host's
/// reach): `inbox/<nonce>.stdin` holds `<hostname>\t<op id>\n` then whole
/// frames; the answer, `inbox/<nonce>.listing`, is `ok N`, `full N` or
/// `closed N` (N frames went in).
pub const STDIN_SUFFIX: &str = "stdin";
/// A stdin question the launcher took (renamed from `<nonce>.stdin`
/// before it writes anything): the kernel, withdrawing a question by
/// removing `<nonce>.stdin`, knows from a missing name that it was taken.
pub const STDIN_TAKEN_SUFFIX: &str = "stdin-taken";
/// The largest stdin question the launcher reads.
pub const MAX_STDIN_QUESTION: usize = 4 << 20;

/// A probe nonce: 1 to 32 lowercase hex digits.
pub fn valid_nonce(nonce: &str) -> bool {
    (1..=32).contains(&nonce.len())
        && nonce
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// The launcher's identity record (pid, start ticks, hostname), in `.ops`.
pub const LAUNCHER_RECORD: &str = "launcher.pid";
/// The run's scratch dir inside the container; also the command's `HOME`.
pub const SCRATCH_DIR: &str = "/scratch";

#[cfg(test)]
mod fuzz_tests;
