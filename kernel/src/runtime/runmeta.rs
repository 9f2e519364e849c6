//! What never changes about a run once it exists, cached by the kernel:
//! its chain and envelope, the container profile that follows from them,
//! and its approval patterns, compiled (SPEC §14, §16).

use crate::approval::{self, compile_patterns, ApprovalHold, Pattern};
use crate::runs::Envelope;
use crate::store::RunRecord;

/// A run's immutable facts.
#[derive(Debug)]
pub struct RunMeta {
    /// Ancestor run ids, root first.
    pub chain: Vec<String>,
    /// The run's envelope, resolved at its creation (the default for a run
    /// without one).
    pub envelope: Envelope,
    /// The container profile: the kernel's base profile narrowed by the
    /// envelope.
    pub profile: sandbox::Profile,
    /// The envelope's approval patterns, compiled.
    approval: Vec<Pattern>,
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
            profile: profile_of(&envelope, base),
            envelope,
            approval,
        }
    }

    /// Whether a command of the run must wait for an operator's approval:
    /// the run's rules, then the kernel-wide `patterns` (see
    /// [`approval::hold`]).
    pub fn approval_hold(&self, patterns: &[Pattern], command: &[String]) -> Option<ApprovalHold> {
        approval::hold(&self.envelope.approval, &self.approval, patterns, command)
    }
}

/// The container profile of a run with `envelope`: the kernel's `base`
/// profile with the envelope's limits. A top-level run with the kernel's
/// defaults gets the base profile itself (same fingerprint).
pub fn profile_of(envelope: &Envelope, base: &sandbox::Profile) -> sandbox::Profile {
    sandbox::Profile {
        memory_bytes: envelope.memory_bytes,
        nano_cpus: (envelope.cpus * 1e9).round() as i64,
        pids_limit: envelope.pids_limit,
        network: envelope.network.clone(),
        ..base.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::ApprovalRules;

    #[test]
    fn the_default_envelope_keeps_the_base_profile() {
        let base = sandbox::Profile::default();
        let env = Envelope {
            max_timeout_sec: None,
            memory_bytes: base.memory_bytes,
            cpus: base.nano_cpus as f64 / 1e9,
            pids_limit: base.pids_limit,
            network: base.network.clone(),
            max_live_ops: 512,
            max_children: 32,
            approval: ApprovalRules::default(),
        };
        assert_eq!(profile_of(&env, &base), base);
    }
}
