//! Typed errors of the sandbox layer. Docker's 404 and 409 answers get their
//! own variants so callers can tell "gone" and "conflict" from an outage.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("docker is unreachable: {0}")]
    Unreachable(String),
    #[error("docker object not found: {0}")]
    NotFound(String),
    #[error("docker conflict: {0}")]
    Conflict(String),
    #[error("docker refused the request ({status}): {message}")]
    Refused { status: u16, message: String },
    #[error("container {name} exists but is not ours: {reason}")]
    Foreign { name: String, reason: String },
    #[error("invalid input: {0}")]
    Invalid(String),
    #[error("probe of container {container} gave unreadable output: {detail}")]
    Probe { container: String, detail: String },
    #[error("io error at {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = SandboxError> = std::result::Result<T, E>;

impl SandboxError {
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
