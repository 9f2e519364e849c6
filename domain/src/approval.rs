//! Which commands wait for an operator's approval (SPEC §16): a run's rules
//! (`all`, or its envelope's patterns) and the kernel-wide patterns, matched
//! against the command joined by spaces.

use crate::envelope::{ApprovalRules, OnTimeout};

/// A compiled approval pattern, with its source text (the rule's name).
pub type Pattern = (String, regex::Regex);

/// Why and how an op waits for approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalHold {
    /// The pattern that matched (`*` for a run whose rules hold every op).
    pub rule: String,
    /// How long it waits before `on_timeout` applies (none: forever).
    pub timeout_sec: Option<u64>,
    /// What a timed-out wait turns into.
    pub on_timeout: OnTimeout,
}

/// Compiles approval patterns; the error names the bad one.
pub fn compile_patterns(patterns: &[String]) -> Result<Vec<Pattern>, String> {
    patterns
        .iter()
        .map(|p| {
            regex::Regex::new(p)
                .map(|r| (p.clone(), r))
                .map_err(|e| format!("approval pattern {p:?}: {e}"))
        })
        .collect()
}

/// The hold of `command` under a run's `rules` and compiled patterns
/// (`own`) and the kernel-wide `patterns`; `None` when nothing matches.
/// The first matching pattern names the rule: the run's own come first.
pub fn hold(
    rules: &ApprovalRules,
    own: &[Pattern],
    patterns: &[Pattern],
    command: &[String],
) -> Option<ApprovalHold> {
    let joined = command.join(" ");
    let rule = if rules.all {
        Some("*".to_owned())
    } else {
        own.iter()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(all: bool) -> ApprovalRules {
        ApprovalRules {
            all,
            ..ApprovalRules::default()
        }
    }

    #[test]
    fn the_runs_rules_then_the_kernels_patterns_name_the_hold() {
        let own = compile_patterns(&["^rm ".into()]).unwrap_or_default();
        let kernel = compile_patterns(&["curl".into(), "rm -rf".into()]).unwrap_or_default();
        let cmd = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        let table = [
            (false, "ls -l", None),
            (false, "rm -rf /", Some("^rm ")),
            (false, "sh -c curl", Some("curl")),
            (true, "ls -l", Some("*")),
        ];
        for (all, command, want) in table {
            let got = hold(&rules(all), &own, &kernel, &cmd(command)).map(|h| h.rule);
            assert_eq!(got.as_deref(), want, "{command}");
        }
    }

    #[test]
    fn an_unset_timeout_action_escalates_and_a_bad_pattern_is_named() {
        let got = hold(&rules(true), &[], &[], &["x".into()]);
        assert_eq!(got.map(|h| h.on_timeout), Some(OnTimeout::Escalate));
        let err = compile_patterns(&["ok".into(), "(".into()])
            .err()
            .unwrap_or_default();
        assert!(err.contains("\"(\""), "{err}");
    }
}
