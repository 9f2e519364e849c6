//! The tool definitions published at `GET /v1/tools` (JSON schema for
//! function calling), whose descriptions state the limits.

use serde_json::json;

use crate::runtime::config::Config;
use crate::surfaces::views::{ToolDefinition, ToolsView};

/// `run_command` and `kill_operation`, their descriptions stating the
/// kernel's limits.
pub fn tool_definitions(c: &Config) -> ToolsView {
    ToolsView {
        tools: vec![run_command(c), kill_operation(c)],
    }
}

fn run_command(c: &Config) -> ToolDefinition {
    ToolDefinition {
        name: "run_command".to_owned(),
        description: format!(
                "Run a command in this run's sandbox container (a Linux container with bash and busybox tools; \
                 working directory /scratch, which persists for the run; no network unless the operator enabled it). \
                 Foreground: waits and returns the exit code and output; timeout_sec defaults to {} and may be at most {}. \
                 Background (background: true): returns an operation id at once; the result (exit code + output tail) \
                 arrives later as a follow-up message; timeout_sec defaults to {} and may be at most {}. \
                 Processes a command leaves behind (e.g. started with &) are stopped when it exits (SIGTERM, then \
                 SIGKILL), and the result says how many: a command that must keep running (a server, a watcher) \
                 must be started as its own background operation. \
                 Values out of range are rejected, not clamped. The operator (or the run that delegated this one) may \
                 set a lower timeout ceiling and a budget for this run: a command over the ceiling is refused \
                 (envelope_exceeded), and once the budget is spent, or while the run is paused, new commands are \
                 refused (budget_exhausted, run_paused) with a message saying why. A command may need an operator's \
                 approval first: then the reply says \"Awaiting operator approval as operation <id>\", nothing runs \
                 until an operator approves it, and its result (or its denial with the reason) arrives later as a \
                 follow-up message, as a background operation's does.",
                c.ops.fg_default_sec, c.ops.fg_max_sec, c.ops.bg_default_sec, c.ops.bg_max_sec
            ),
        parameters: json!({
                "type": "object",
                "properties": {
                    "command": {
                        "type": "array", "items": {"type": "string"}, "minItems": 1,
                        "description": "argv, e.g. [\"bash\", \"-lc\", \"make test\"]; at most 256 KiB in total"
                    },
                    "background": {"type": "boolean", "default": false},
                    "timeout_sec": {"type": "integer", "minimum": 1, "maximum": c.ops.bg_max_sec.max(c.ops.fg_max_sec)}
                },
                "required": ["command"],
                "additionalProperties": false
        }),
    }
}

fn kill_operation(c: &Config) -> ToolDefinition {
    ToolDefinition {
        name: "kill_operation".to_owned(),
        description: format!(
                "Cancel a background operation: its whole process tree gets SIGTERM, then SIGKILL after {} s. \
                 The outcome (exit code 143 or 137, killed) arrives as a normal result. An operation still awaiting \
                 approval is withdrawn instead: it ends denied (cancelled before approval) and nothing runs.",
                c.ops.kill_grace.as_secs()
            ),
        parameters: json!({
                "type": "object",
                "properties": {"operation_id": {"type": "string", "format": "uuid"}},
                "required": ["operation_id"],
                "additionalProperties": false
        }),
    }
}
