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
    /// envelope, on the run's image.
    pub profile: sandbox::Profile,
    /// The run's image, by the operator's name (SPEC §26).
    pub image: String,
    /// The envelope's approval patterns, compiled.
    approval: Vec<Pattern>,
}

impl RunMeta {
    /// The facts of a run record; a run without an envelope of its own has
    /// `default_envelope`, and its profile is the envelope over `base`, on
    /// the image the record names (from `images`; a name the operator no
    /// longer lists stays the reference, and its container cannot be made).
    pub fn new(
        record: &RunRecord,
        default_envelope: Envelope,
        base: &sandbox::Profile,
        images: &crate::runtime::config::Images,
    ) -> RunMeta {
        let envelope = record.envelope.clone().unwrap_or(default_envelope);
        // patterns were checked when the run was made; one that no longer
        // compiles holds every op rather than none (fail closed)
        let approval = compile_patterns(&envelope.approval.patterns).unwrap_or_else(|e| {
            tracing::error!(run = %record.run_id, %e, "approval pattern does not compile; every op waits");
            vec![("(invalid pattern)".to_owned(), regex::Regex::new("").unwrap_or_else(|_| unreachable!()))]
        });
        let image = record
            .image
            .clone()
            .unwrap_or_else(|| images.default.clone());
        let mut profile = profile_of(&envelope, base);
        profile.image = images.reference(&image).unwrap_or(&image).to_owned();
        RunMeta {
            chain: record.chain.clone(),
            profile,
            image,
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
        network: match &envelope.network {
            crate::egress::Network::Named(n) => n.clone(),
            // the kernel's egress network, once its container is made
            crate::egress::Network::Allow(_) => crate::runtime::egress::PLACEHOLDER.to_owned(),
        },
        runtime: envelope.runtime,
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
            network: crate::egress::Network::Named(base.network.clone()),
            max_live_ops: 512,
            max_children: 32,
            approval: ApprovalRules::default(),
            images: None,
            disk_bytes: None,
            runtime: crate::runs::Runtime::Runc,
        };
        assert_eq!(profile_of(&env, &base), base);
    }
}
