//! What never changes about a run once it exists, cached by the kernel:
//! its chain and envelope, the container profile that follows from them,
//! and its approval patterns, compiled (SPEC §14, §16).

use crate::store::{ApprovalHold, RunRecord};
use crate::tasks::{Envelope, OnTimeout};

/// A run's immutable facts.
#[derive(Debug)]
pub struct RunMeta {
    /// Ancestor run ids, root first.
    pub chain: Vec<String>,
    pub envelope: Envelope,
    pub profile: sandbox::Profile,
    /// The envelope's approval patterns, compiled.
    approval: Vec<(String, regex::Regex)>,
}

/// Compiles approval patterns; the error names the bad one.
pub fn compile_patterns(patterns: &[String]) -> Result<Vec<(String, regex::Regex)>, String> {
    patterns
        .iter()
        .map(|p| {
            regex::Regex::new(p)
                .map(|r| (p.clone(), r))
                .map_err(|e| format!("approval pattern {p:?}: {e}"))
        })
        .collect()
}

impl RunMeta {
    /// The facts of a run record; a run without an envelope of its own has
    /// `default_envelope`, and its profile is the envelope over `base`.
    pub fn new(record: &RunRecord, default_envelope: Envelope, base: &sandbox::Profile) -> RunMeta {
        let envelope = record.envelope.clone().unwrap_or(default_envelope);
        // patterns were checked when the run was made; one that no longer
        // compiles holds every op rather than none (fail closed)
        let approval = compile_patterns(&envelope.approval.patterns).unwrap_or_else(|e| {
            tracing::error!(run = %record.run_id, %e, "approval pattern does not compile; every op waits");
            vec![("(invalid pattern)".to_owned(), regex::Regex::new("").unwrap_or_else(|_| unreachable!()))]
        });
        RunMeta {
            chain: record.chain.clone(),
            profile: envelope.profile(base),
            envelope,
            approval,
        }
    }

    /// Whether a command of the run must wait for an operator's approval:
    /// the run's rules (`all`, or a pattern of its envelope) or one of the
    /// kernel-wide `patterns` matching the command joined by spaces.
    pub fn approval_hold(
        &self,
        patterns: &[(String, regex::Regex)],
        command: &[String],
    ) -> Option<ApprovalHold> {
        let rules = &self.envelope.approval;
        let joined = command.join(" ");
        let rule = if rules.all {
            Some("*".to_owned())
        } else {
            self.approval
                .iter()
                .chain(patterns)
                .find(|(_, re)| re.is_match(&joined))
                .map(|(p, _)| p.clone())
        }?;
        Some(ApprovalHold {
            rule,
            timeout_sec: rules.timeout_sec,
            on_timeout: rules.on_timeout.unwrap_or(OnTimeout::Escalate),
        })
    }
}
