//! Where a run or an op came from (SPEC §28, seeds 000 and 003): the
//! surface it entered by, the channel on that surface, and the principal
//! acting. Recorded once, at admission, from the call's context (the
//! transport, the token, the kernel's own scheduler), never from a
//! request's body or a tool's arguments.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest channel kept, in characters.
pub const MAX_CHANNEL: usize = 200;

/// The surface a call entered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Surface {
    /// The HTTP API, by any client that names no other surface.
    Http,
    /// The `opkernel` command line.
    Cli,
    /// An MCP client: the kernel's `/mcp`, or `opkernel mcp` on stdio.
    Mcp,
    /// The live web panel.
    Panel,
    /// A schedule's fire, by the kernel's own scheduler.
    Schedule,
}

impl Surface {
    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Surface::Http => "http",
            Surface::Cli => "cli",
            Surface::Mcp => "mcp",
            Surface::Panel => "panel",
            Surface::Schedule => "schedule",
        }
    }

    /// A surface by its wire name.
    pub fn parse(name: &str) -> Option<Surface> {
        [
            Surface::Http,
            Surface::Cli,
            Surface::Mcp,
            Surface::Panel,
            Surface::Schedule,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

impl fmt::Display for Surface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A run's or an op's origin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Origin {
    /// The surface it entered by.
    pub surface: Surface,
    /// The channel on it: the MCP client's name, version and session; the
    /// schedule's id; the CLI's version; the HTTP client's `User-Agent`.
    pub channel: String,
    /// Who acted: `operator`, or `run:<id>` of the run token used.
    pub principal: String,
    /// The entry path it was admitted by: the API route
    /// (`POST /v1/runs/{run}/tools/run_command`; MCP's tools call the
    /// API's), `scheduler`, or `declared schedules`.
    #[serde(default)]
    pub route: String,
}

/// A channel as recorded: printable ASCII only (anything else is `?`),
/// at most [`MAX_CHANNEL`] characters.
pub fn clean_channel(raw: &str) -> String {
    raw.chars()
        .take(MAX_CHANNEL)
        .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
        .collect::<String>()
        .trim()
        .to_owned()
}

impl Origin {
    /// An origin with its channel cleaned.
    pub fn new(surface: Surface, channel: &str, principal: &str) -> Origin {
        Origin {
            surface,
            channel: clean_channel(channel),
            principal: principal.to_owned(),
            route: String::new(),
        }
    }

    /// The origin of what schedule `schedule_id` of `run` fires: the
    /// kernel's own scheduler, acting as the run.
    pub fn schedule_fire(schedule_id: &str, run: &str) -> Origin {
        Origin::new(Surface::Schedule, schedule_id, &format!("run:{run}")).with_route("scheduler")
    }

    /// The same origin, admitted by `route`.
    pub fn with_route(mut self, route: &str) -> Origin {
        self.route = clean_channel(route);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn surfaces_round_trip_and_channels_are_bounded_text() {
        for s in ["http", "cli", "mcp", "panel", "schedule"] {
            assert_eq!(Surface::parse(s).map(Surface::as_str), Some(s));
        }
        assert_eq!(Surface::parse("HTTP"), None);
        assert_eq!(clean_channel("a\u{1b}[31mb\n"), "a?[31mb?");
        assert_eq!(clean_channel(&"x".repeat(500)).len(), MAX_CHANNEL);
        let o = Origin::new(Surface::Cli, " opkernel 0.1.0 ", "operator");
        assert_eq!(serde_json::to_value(&o).unwrap()["surface"], "cli");
        assert_eq!(o.channel, "opkernel 0.1.0");
    }
}
