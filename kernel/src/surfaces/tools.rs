//! The tool definitions published at `GET /v1/tools` (JSON schema for
//! function calling), whose descriptions state the limits.

use serde_json::json;

use crate::runtime::config::Config;
use crate::surfaces::views::{ToolDefinition, ToolsView};

/// `run_command`, `kill_operation` and the interactive tools (SPEC §25),
/// their descriptions stating the kernel's limits.
pub fn tool_definitions(c: &Config) -> ToolsView {
    ToolsView {
        tools: vec![
            run_command(c),
            kill_operation(c),
            write_stdin(),
            read_output(),
            resize_tty(),
            read_file(),
            write_file(),
            list_dir(),
        ],
    }
}

/// What `run_command`'s description says of stdin, terminals and yield.
const INTERACTIVE: &str = "Interactive commands: with stdin: true the command's stdin stays open and you \
     write to it with write_stdin (answer a prompt, drive a REPL such as python3 -i); with tty: true \
     (or {\"rows\", \"cols\"}) it runs on a terminal (bash -i, programs that need one; the output is the \
     terminal's, input echoed). Without either, stdin is empty (/dev/null). In the foreground, yield_ms: N \
     answers after N ms if the command has not ended, with its output so far, running: true and its \
     operation_id; it goes on in the background and its result arrives later as a follow-up message (a \
     foreground command with stdin or a terminal yields after 10000 ms unless told otherwise). \
     read_output reads any operation's output from an offset.";

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
                 follow-up message, as a background operation's does. {INTERACTIVE}",
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
                    "timeout_sec": {"type": "integer", "minimum": 1, "maximum": c.ops.bg_max_sec.max(c.ops.fg_max_sec)},
                    "stdin": {"type": "boolean", "default": false,
                              "description": "keep stdin open for write_stdin"},
                    "tty": {"oneOf": [
                        {"type": "boolean"},
                        {"type": "object", "properties": {
                            "rows": {"type": "integer", "minimum": 1, "maximum": 1000},
                            "cols": {"type": "integer", "minimum": 1, "maximum": 1000}},
                         "required": ["rows", "cols"], "additionalProperties": false}],
                        "description": "run on a terminal (true: 24x80); implies stdin"},
                    "yield_ms": {"type": "integer", "minimum": 0, "maximum": 600000,
                                 "description": "foreground only: answer after this long if still running; it continues in the background"}
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
                 approval is withdrawn instead: it ends denied (cancelled before approval) and nothing runs. \
                 With signal (INT, TERM, KILL, HUP, QUIT, USR1, USR2) only that one signal is sent to the \
                 operation's foreground process group and the call answers at once: on a terminal INT is Ctrl-C \
                 (it stops the running program, an interactive shell lives on); the operation ends only if its \
                 command does.",
                c.ops.kill_grace.as_secs()
            ),
        parameters: json!({
                "type": "object",
                "properties": {
                    "operation_id": {"type": "string", "format": "uuid"},
                    "signal": {"type": "string", "enum": ["INT", "TERM", "KILL", "HUP", "QUIT", "USR1", "USR2"]}
                },
                "required": ["operation_id"],
                "additionalProperties": false
        }),
    }
}

fn write_stdin() -> ToolDefinition {
    ToolDefinition {
        name: "write_stdin".to_owned(),
        description: "Write to the stdin of a running operation started with stdin or tty, then wait for \
             its output: the answer comes once the output has been quiet a moment, the command ended, or \
             yield_ms (default 1000, at most 30000) passed, with the output produced since the write, the \
             status, and next_offset for read_output. text is written as is: end a line with \\n (on a \
             terminal \\r is Enter, \\u0003 Ctrl-C, \\u0004 Ctrl-D); data_base64 writes raw bytes; eof: \
             true closes stdin after the bytes. Refused (no_stdin) for an operation started without stdin, \
             and once it ended or its stdin was closed."
            .to_owned(),
        parameters: json!({
            "type": "object",
            "properties": {
                "operation_id": {"type": "string", "format": "uuid"},
                "text": {"type": "string"},
                "data_base64": {"type": "string", "contentEncoding": "base64"},
                "eof": {"type": "boolean", "default": false},
                "yield_ms": {"type": "integer", "minimum": 0, "maximum": 30000, "default": 1000}
            },
            "required": ["operation_id"],
            "additionalProperties": false
        }),
    }
}

fn read_output() -> ToolDefinition {
    ToolDefinition {
        name: "read_output".to_owned(),
        description: "Read an operation's output (running or ended) from offset (default 0): at most \
             max_bytes (default 65536), with next_offset to pass next time (to read only what is new) and \
             whether it still runs. wait_ms (at most 30000) waits for new output while there is none."
            .to_owned(),
        parameters: json!({
            "type": "object",
            "properties": {
                "operation_id": {"type": "string", "format": "uuid"},
                "offset": {"type": "integer", "minimum": 0, "default": 0},
                "wait_ms": {"type": "integer", "minimum": 0, "maximum": 30000, "default": 0},
                "max_bytes": {"type": "integer", "minimum": 1, "maximum": 1048576, "default": 65536}
            },
            "required": ["operation_id"],
            "additionalProperties": false
        }),
    }
}

fn resize_tty() -> ToolDefinition {
    ToolDefinition {
        name: "resize_tty".to_owned(),
        description:
            "Resize the terminal of an operation started with tty (its program gets SIGWINCH)."
                .to_owned(),
        parameters: json!({
            "type": "object",
            "properties": {
                "operation_id": {"type": "string", "format": "uuid"},
                "rows": {"type": "integer", "minimum": 1, "maximum": 1000},
                "cols": {"type": "integer", "minimum": 1, "maximum": 1000}
            },
            "required": ["operation_id", "rows", "cols"],
            "additionalProperties": false
        }),
    }
}

fn read_file() -> ToolDefinition {
    ToolDefinition {
        name: "read_file".to_owned(),
        description: "Read a file of your container (a path such as /scratch/src/main.rs): at most length \
             bytes (default 65536, at most 1048576) from offset, as text (default) or base64, with the file's \
             size, next_offset for the next slice and eof. A directory is read with list_dir."
            .to_owned(),
        parameters: json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1},
                "offset": {"type": "integer", "minimum": 0, "default": 0},
                "length": {"type": "integer", "minimum": 1, "maximum": 1048576, "default": 65536},
                "encoding": {"type": "string", "enum": ["text", "base64"], "default": "text"}
            },
            "required": ["path"],
            "additionalProperties": false
        }),
    }
}

fn write_file() -> ToolDefinition {
    ToolDefinition {
        name: "write_file".to_owned(),
        description: "Write a whole file of your container (parent directories are made; the file is \
             replaced at once, never half written): text, or data_base64 for bytes; mode in octal (default \
             644). Owned by the user your commands run as. For large files or directories use the files API."
            .to_owned(),
        parameters: json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1},
                "text": {"type": "string"},
                "data_base64": {"type": "string", "contentEncoding": "base64"},
                "mode": {"type": "string", "pattern": "^[0-7]{1,4}$"}
            },
            "required": ["path"],
            "additionalProperties": false
        }),
    }
}

fn list_dir() -> ToolDefinition {
    ToolDefinition {
        name: "list_dir".to_owned(),
        description:
            "List a directory of your container (default /scratch): each entry's name, type \
             (file, dir, symlink, other), size, mode and modification time."
                .to_owned(),
        parameters: json!({
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "additionalProperties": false
        }),
    }
}
