//! A tool call, parsed once into a closed [`ToolCall`] from its name and
//! arguments (pure: no transport, no I/O). `run_command` and
//! `kill_operation` take the API's own request types (their shape is
//! checked here, their limits by the API: one definition of the limits and
//! their messages); the two MCP-only tools are checked here.

use serde_json::{Map, Value};

use crate::surfaces::requests::{
    KillOperation, ListDir, ReadFile, ReadOutput, ResizeTty, RunCommand, WriteFile, WriteStdin,
};

/// What a client asked, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolCall {
    /// `run_command`: its arguments are the API's request body.
    RunCommand(RunCommand),
    /// `kill_operation`: its arguments are the API's request body.
    KillOperation(KillOperation),
    /// `write_stdin`: its arguments are the API's request body.
    WriteStdin(WriteStdin),
    /// `read_output`: its arguments are the API's request body.
    ReadOutput(ReadOutput),
    /// `resize_tty`: its arguments are the API's request body.
    ResizeTty(ResizeTty),
    /// `read_file`: its arguments are the API's request body.
    ReadFile(ReadFile),
    /// `write_file`: its arguments are the API's request body.
    WriteFile(WriteFile),
    /// `list_dir`: its arguments are the API's request body.
    ListDir(ListDir),
    /// `operation_state`: one op of the run (or of a delegated run).
    OperationState {
        /// The op asked about.
        operation_id: String,
    },
    /// `wait_background_report`: the client's acknowledgement of the
    /// previous report (if any), then a wait of up to `wait_sec` seconds.
    WaitBackgroundReport {
        /// Longest wait for a result or a note, seconds (absent: 0).
        wait_sec: u64,
        /// The previous report's `report_id`, acknowledged by this call
        /// (how a stateless HTTP client acks); `None`: nothing acked here.
        ack: Option<String>,
    },
}

/// Why a call is refused before anything is asked of the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadCall {
    /// No such tool: a protocol error (invalid params).
    UnknownTool(String),
    /// The tool's arguments are wrong: a tool error the model reads.
    Arguments(String),
}

impl ToolCall {
    /// The call of tool `name` with `args`.
    pub fn parse(name: &str, args: Map<String, Value>) -> Result<ToolCall, BadCall> {
        match name {
            "run_command" => Ok(ToolCall::RunCommand(request(args)?)),
            "kill_operation" => Ok(ToolCall::KillOperation(request(args)?)),
            "write_stdin" => Ok(ToolCall::WriteStdin(request(args)?)),
            "read_output" => Ok(ToolCall::ReadOutput(request(args)?)),
            "resize_tty" => Ok(ToolCall::ResizeTty(request(args)?)),
            "read_file" => Ok(ToolCall::ReadFile(request(args)?)),
            "write_file" => Ok(ToolCall::WriteFile(request(args)?)),
            "list_dir" => Ok(ToolCall::ListDir(request(args)?)),
            "operation_state" => operation_state(&args),
            "wait_background_report" => wait_background_report(&args),
            other => Err(BadCall::UnknownTool(format!(
                "unknown tool {other:?}: the tools are run_command, kill_operation, \
                 write_stdin, read_output, resize_tty, read_file, write_file, list_dir, \
                 operation_state, wait_background_report"
            ))),
        }
    }
}

/// Arguments read as the API's request type (a wrong shape is the model's
/// to fix: named in a tool error).
fn request<T: serde::de::DeserializeOwned>(args: Map<String, Value>) -> Result<T, BadCall> {
    serde_json::from_value(Value::Object(args))
        .map_err(|e| BadCall::Arguments(format!("invalid arguments: {e}")))
}

fn is_uuid(v: &Value) -> Option<&str> {
    v.as_str().filter(|id| uuid::Uuid::parse_str(id).is_ok())
}

/// `operation_state`'s one argument, the op's id.
fn operation_state(args: &Map<String, Value>) -> Result<ToolCall, BadCall> {
    let Some(id) = args.get("operation_id").and_then(is_uuid) else {
        return Err(BadCall::Arguments(
            "operation_id is required: the operation's id (a uuid)".to_owned(),
        ));
    };
    if args.len() > 1 {
        return Err(BadCall::Arguments(
            "operation_state takes only operation_id".to_owned(),
        ));
    }
    Ok(ToolCall::OperationState {
        operation_id: id.to_owned(),
    })
}

/// `wait_background_report`'s `wait_sec` (default 0) and `ack` (null or
/// absent: none), nothing else.
fn wait_background_report(args: &Map<String, Value>) -> Result<ToolCall, BadCall> {
    let wait_sec = match args.get("wait_sec") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_u64().ok_or_else(|| {
            BadCall::Arguments("wait_sec must be a whole number of seconds".to_owned())
        })?,
    };
    if let Some(key) = args.keys().find(|k| *k != "wait_sec" && *k != "ack") {
        return Err(BadCall::Arguments(format!("unknown argument {key:?}")));
    }
    let ack = match args.get("ack").filter(|v| !v.is_null()) {
        None => None,
        Some(v) => Some(is_uuid(v).map(str::to_owned).ok_or_else(|| {
            BadCall::Arguments(
                "ack must be the report_id (a uuid) of the previous report".to_owned(),
            )
        })?),
    };
    Ok(ToolCall::WaitBackgroundReport { wait_sec, ack })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(name: &str, args: Value) -> Result<ToolCall, BadCall> {
        let Value::Object(args) = args else {
            panic!("arguments must be an object")
        };
        ToolCall::parse(name, args)
    }

    fn bad(message: &str) -> Result<ToolCall, BadCall> {
        Err(BadCall::Arguments(message.to_owned()))
    }

    #[test]
    fn each_tool_call_parses_into_its_variant_or_its_refusal() {
        let op = "0b7e6a34-64d1-4c8e-9a51-1b1e6c8f3a10";
        let body = json!({"command": ["true"], "nonsense": 1});
        let start = RunCommand {
            command: vec!["true".into()],
            background: true,
            timeout_sec: Some(5),
            stdin: false,
            tty: None,
            yield_ms: None,
        };
        let table: Vec<(&str, Value, Result<ToolCall, BadCall>)> = vec![
            // the API's own bodies, in shape (the API checks their limits)
            (
                "run_command",
                json!({"command": ["true"], "background": true, "timeout_sec": 5}),
                Ok(ToolCall::RunCommand(start)),
            ),
            (
                "kill_operation",
                json!({ "operation_id": op }),
                Ok(ToolCall::KillOperation(KillOperation {
                    operation_id: op.to_owned(),
                    signal: None,
                })),
            ),
            (
                "write_stdin",
                json!({ "operation_id": op, "text": "2+3\n" }),
                Ok(ToolCall::WriteStdin(WriteStdin {
                    operation_id: op.to_owned(),
                    text: Some("2+3\n".into()),
                    data_base64: None,
                    eof: false,
                    yield_ms: None,
                })),
            ),
            (
                "kill_operation",
                json!({ "operation_id": op, "signal": "SIGINT" }),
                bad("invalid arguments: unknown variant `SIGINT`, expected one of `INT`, `TERM`, `KILL`, `HUP`, `QUIT`, `USR1`, `USR2`"),
            ),
            (
                "run_command",
                body.clone(),
                bad("invalid arguments: unknown field `nonsense`, expected one of `command`, `background`, `timeout_sec`, `stdin`, `tty`, `yield_ms`"),
            ),
            (
                "kill_operation",
                body,
                bad("invalid arguments: unknown field `command`, expected `operation_id` or `signal`"),
            ),
            (
                "operation_state",
                json!({ "operation_id": op }),
                Ok(ToolCall::OperationState {
                    operation_id: op.to_owned(),
                }),
            ),
            (
                "operation_state",
                json!({}),
                bad("operation_id is required: the operation's id (a uuid)"),
            ),
            (
                "operation_state",
                json!({"operation_id": "nope"}),
                bad("operation_id is required: the operation's id (a uuid)"),
            ),
            (
                "operation_state",
                json!({"operation_id": op, "x": 1}),
                bad("operation_state takes only operation_id"),
            ),
            (
                "wait_background_report",
                json!({}),
                Ok(ToolCall::WaitBackgroundReport {
                    wait_sec: 0,
                    ack: None,
                }),
            ),
            (
                "wait_background_report",
                json!({"wait_sec": null, "ack": null}),
                Ok(ToolCall::WaitBackgroundReport {
                    wait_sec: 0,
                    ack: None,
                }),
            ),
            (
                "wait_background_report",
                json!({"wait_sec": 30, "ack": op}),
                Ok(ToolCall::WaitBackgroundReport {
                    wait_sec: 30,
                    ack: Some(op.to_owned()),
                }),
            ),
            (
                "wait_background_report",
                json!({"wait_sec": -1}),
                bad("wait_sec must be a whole number of seconds"),
            ),
            (
                "wait_background_report",
                json!({"wait_sec": 1.5, "other": 1}),
                bad("wait_sec must be a whole number of seconds"),
            ),
            (
                "wait_background_report",
                json!({"wait_sec": 1, "other": 1}),
                bad("unknown argument \"other\""),
            ),
            (
                "wait_background_report",
                json!({"ack": "not-a-uuid"}),
                bad("ack must be the report_id (a uuid) of the previous report"),
            ),
            (
                "wait_background_report",
                json!({"ack": 7}),
                bad("ack must be the report_id (a uuid) of the previous report"),
            ),
            (
                "run_shell",
                json!({}),
                Err(BadCall::UnknownTool(
                    concat!(
                        "unknown tool \"run_shell\": the tools are run_command, kill_operation, ",
                        "write_stdin, read_output, resize_tty, read_file, write_file, list_dir, operation_state, wait_background_report"
                    )
                    .to_owned(),
                )),
            ),
        ];
        for (name, args, want) in table {
            assert_eq!(parse(name, args.clone()), want, "{name} {args}");
        }
    }
}
