//! opkernel's sandbox layer: the only crate that talks to Docker.
//!
//! It creates and finds labelled run containers, launches commands through
//! the pid/code/log wrapper, reads the op files, probes and signals op
//! processes with identity checks. It knows nothing of the control plane.

pub mod backend;
pub mod docker;
pub mod error;
pub mod liveness;
pub mod opfiles;
pub mod profile;
pub mod wrapper;

pub use backend::OpBackend;
pub use docker::{find_passwd_user, unix_now, ContainerInfo, RunUser, Sandbox, TopProcess};
pub use error::{Result, SandboxError};
pub use liveness::{OpLiveness, Snapshot};
pub use opfiles::{LogDigest, OpFileError, OpsDir, PidRecord};
pub use profile::{Profile, RunIdentity};
pub use wrapper::{MarkedProcess, Signal, WrapperSpec};

#[cfg(test)]
mod fuzz_tests;
