//! The sandbox's answer to an op's one launch, read as a verdict of the
//! decision core: the adapter between Docker's errors and
//! [`LaunchVerdict`].

use sandbox::SandboxError;

use super::decide::LaunchVerdict;

/// Classifies a launch's answer. A 5xx (or a timeout, or a dropped
/// connection) may hide a start that happened; only an explicit refusal
/// means nothing ran.
pub fn launch_verdict(result: &sandbox::Result<()>, retried: bool) -> LaunchVerdict {
    match result {
        Ok(()) => LaunchVerdict::Started,
        Err(SandboxError::NotFound(_) | SandboxError::Conflict(_)) if !retried => {
            LaunchVerdict::StaleContainer
        }
        Err(SandboxError::Refused { status: 500.., .. }) => LaunchVerdict::Unknown,
        Err(
            e @ (SandboxError::Refused { .. }
            | SandboxError::NotFound(_)
            | SandboxError::Conflict(_)
            | SandboxError::Invalid(_)
            | SandboxError::Foreign { .. }),
        ) => LaunchVerdict::Refused(format!("docker refused the command: {e}")),
        Err(_) => LaunchVerdict::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_explicit_refusal_means_nothing_ran() {
        use sandbox::SandboxError as E;
        let refused = |status| E::Refused {
            status,
            message: "no".into(),
        };
        let table: Vec<(sandbox::Result<()>, bool, LaunchVerdict)> = vec![
            (Ok(()), false, LaunchVerdict::Started),
            (
                Err(E::NotFound("c".into())),
                false,
                LaunchVerdict::StaleContainer,
            ),
            (
                Err(E::Conflict("not running".into())),
                false,
                LaunchVerdict::StaleContainer,
            ),
            (Err(refused(500)), false, LaunchVerdict::Unknown),
            (Err(refused(503)), true, LaunchVerdict::Unknown),
            (
                Err(E::Unreachable("timed out".into())),
                false,
                LaunchVerdict::Unknown,
            ),
        ];
        for (result, retried, want) in table {
            assert_eq!(launch_verdict(&result, retried), want, "{result:?}");
        }
        for (result, retried) in [
            (Err(refused(400)), false),
            (Err(E::NotFound("c".into())), true),
            (Err(E::Invalid("bad".into())), false),
        ] {
            assert!(
                matches!(launch_verdict(&result, retried), LaunchVerdict::Refused(_)),
                "{result:?}"
            );
        }
    }
}
