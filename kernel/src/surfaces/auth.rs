//! Who is calling: the operator token acts on everything; a run token acts
//! on its own run alone (tokens themselves: [`crate::base::tokens`]).

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The operator token: may act on every run.
    Operator,
    /// A run token: acts for this run (and, where the API allows, its
    /// descendants).
    Run(String),
}

impl Principal {
    /// Whether the caller may act on `run_id` itself: the operator always, a
    /// run token only on its own run.
    pub fn may_act_on(&self, run_id: &str) -> bool {
        match self {
            Principal::Operator => true,
            Principal::Run(own) => own == run_id,
        }
    }
}

impl Principal {
    /// The principal as an origin records it: `operator`, `run:<id>`.
    pub fn name(&self) -> String {
        match self {
            Principal::Operator => "operator".to_owned(),
            Principal::Run(run) => format!("run:{run}"),
        }
    }
}

/// The header a client program names its surface with (SPEC §28): `cli`,
/// `mcp` or `panel`; without it a call is `http`.
pub const SURFACE_HEADER: &str = "x-opkernel-surface";
/// The header a client program names its channel with (the CLI's version,
/// the MCP client and session); without it, the `User-Agent`.
pub const CHANNEL_HEADER: &str = "x-opkernel-channel";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_acts_on_every_run_a_run_on_its_own() {
        assert!(Principal::Operator.may_act_on("x"));
        assert!(Principal::Run("x".into()).may_act_on("x"));
        assert!(!Principal::Run("x".into()).may_act_on("y"));
    }
}
