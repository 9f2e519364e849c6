//! opkernel's sandbox layer: the only crate that talks to Docker.
//!
//! It creates and finds labelled run containers, launches commands through
//! the static in-container shim (`sandbox/shim`), reads the op files, probes
//! and signals op processes with identity checks. It knows nothing of the
//! control plane.

#![deny(missing_docs)]

pub mod backend;
pub mod docker;
pub mod egress;
pub mod error;
// the *at system calls std lacks (openat, fstatat, readlinkat, ...),
// each call with its SAFETY note
#[allow(unsafe_code)]
pub mod files;
mod gvisor;
pub mod launcher;
pub mod liveness;
pub mod opfiles;
mod pool;
pub mod profile;
pub mod shim;
pub mod stdin;
mod workspace;

pub use backend::OpBackend;
pub use docker::{unix_now, ContainerInfo, Sandbox, TopProcess};
pub use error::{Result, SandboxError};
pub use liveness::{OpLiveness, Snapshot};
pub use opfiles::{
    ExitRecord, Handback, LogDigest, OpFileError, OpResult, OpsDir, PidRecord, Request, Usage,
};
pub use opkernel_shim::table::ProcessRow;
pub use opkernel_shim::{passwd_lookup, RunAs, RunUser};
pub use profile::{PoolIdentity, Profile, RunIdentity, Runtime};
pub use shim::{Io, LaunchSpec, MarkedProcess, Signal};

#[cfg(test)]
mod fuzz_tests;
