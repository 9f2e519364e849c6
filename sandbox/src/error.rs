//! Typed errors of the sandbox layer. Docker's 404 and 409 answers get their
//! own variants so callers can tell "gone" and "conflict" from an outage.

use std::path::PathBuf;

/// Why a sandbox call failed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// No answer from the daemon (socket, timeout, transport): says nothing
    /// about the container.
    #[error("docker is unreachable: {0}")]
    Unreachable(String),
    /// Docker answered 404: the container, exec or image does not exist.
    #[error("docker object not found: {0}")]
    NotFound(String),
    /// Docker answered 409 (e.g. a container name already taken).
    #[error("docker conflict: {0}")]
    Conflict(String),
    /// Docker answered with any other error status.
    #[error("docker refused the request ({status}): {message}")]
    Refused {
        /// The HTTP status of Docker's answer.
        status: u16,
        /// Docker's message.
        message: String,
    },
    /// A container with the run's name lacks this kernel's labels or
    /// scratch mount: it is never used or touched.
    #[error("container {name} exists but is not ours: {reason}")]
    Foreign {
        /// The container's name.
        name: String,
        /// Which part of its identity does not match.
        reason: String,
    },
    /// An argv, profile or run-as user the sandbox refuses: retrying will
    /// not help.
    #[error("invalid input: {0}")]
    Invalid(String),
    /// A shim helper (probe, signaller) answered with output that does not
    /// parse: no evidence either way.
    #[error("probe of container {container} gave unreadable output: {detail}")]
    Probe {
        /// The container probed.
        container: String,
        /// What was wrong with the output.
        detail: String,
    },
    /// A host file operation failed (scratch, op files, the shim's install).
    #[error("io error at {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The sandbox's result, [`SandboxError`] by default.
pub type Result<T, E = SandboxError> = std::result::Result<T, E>;

impl SandboxError {
    /// An [`SandboxError::Io`] at `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SandboxError::Io {
            path: path.into(),
            source,
        }
    }

    /// True when the daemon could not be reached at all (as opposed to an
    /// answer that refused or did not find something).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, SandboxError::Unreachable(_))
    }
}

impl From<bollard::errors::Error> for SandboxError {
    fn from(err: bollard::errors::Error) -> Self {
        use bollard::errors::Error as B;
        match err {
            B::DockerResponseServerError {
                status_code: 404,
                message,
            } => SandboxError::NotFound(message),
            B::DockerResponseServerError {
                status_code: 409,
                message,
            } => SandboxError::Conflict(message),
            B::DockerResponseServerError {
                status_code,
                message,
            } => SandboxError::Refused {
                status: status_code,
                message,
            },
            other => SandboxError::Unreachable(other.to_string()),
        }
    }
}
