//! The MCP tools: their definitions (the API's own, plus the two MCP-only
//! tools) and how an API answer becomes a tool result.

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock as Content, Tool};
use serde_json::{json, Value};

use super::backend::Answer;
use crate::views::ToolsView;

/// The tools an MCP client sees: `run_command` and `kill_operation` exactly
/// as `GET /v1/tools` publishes them (fetched from the API), and the two
/// MCP-only tools.
pub fn tools_from_api(api_tools: &ToolsView) -> Result<Vec<Tool>, String> {
    let mut out = Vec::new();
    for t in &api_tools.tools {
        let Value::Object(schema) = t.parameters.clone() else {
            return Err(format!("tool {} has no parameter schema", t.name));
        };
        out.push(Tool::new(
            t.name.clone(),
            t.description.clone(),
            Arc::new(schema),
        ));
    }
    let extra = [
        (
            "operation_state",
            "The state of one of this run's operations (or a delegated run's): status, exit code, \
             output tail, timing. Background results also arrive through wait_background_report.",
            json!({
                "type": "object",
                "properties": {"operation_id": {"type": "string", "format": "uuid"}},
                "required": ["operation_id"],
                "additionalProperties": false
            }),
        ),
        (
            "wait_background_report",
            "Wait up to wait_sec seconds for background operations to resolve (or a note to arrive) \
             and return one [Background operations report] with its report_id. Each result is \
             reported exactly once. Pass the previous report's report_id as ack to confirm you have \
             it; a report not confirmed is served again (in a session it is confirmed by your next \
             call).",
            json!({
                "type": "object",
                "properties": {
                    "wait_sec": {"type": "integer", "minimum": 0,
                                 "maximum": crate::api::reports::MAX_REPORT_WAIT_SEC, "default": 0},
                    "ack": {"type": "string", "format": "uuid",
                            "description": "report_id of the previous report"}
                },
                "additionalProperties": false
            }),
        ),
    ];
    for (name, description, schema) in extra {
        let Value::Object(schema) = schema else {
            return Err(format!("tool {name}: schema is not an object"));
        };
        out.push(Tool::new(name, description, Arc::new(schema)));
    }
    Ok(out)
}

/// A tool's answer from an API answer: structured content plus the text a
/// model reads; an API error is a tool error with the API's message.
pub(super) fn tool_result(answer: Answer, text: impl FnOnce(&Value) -> String) -> CallToolResult {
    let (status, body) = answer;
    if (200..300).contains(&status) {
        let mut r = CallToolResult::success(vec![Content::text(text(&body))]);
        r.structured_content = Some(body);
        return r;
    }
    tool_error(status, &body)
}

pub(super) fn tool_error(status: u16, body: &Value) -> CallToolResult {
    let message = body["error"]["message"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| format!("request failed with HTTP {status}"));
    let mut r = CallToolResult::error(vec![Content::text(message.clone())]);
    r.structured_content = Some(json!({
        "error": {"status": status, "code": body["error"]["code"], "message": message}
    }));
    r
}

pub(super) fn bad_arguments(message: impl Into<String>) -> CallToolResult {
    tool_error(
        400,
        &json!({"error": {"code": "bad_request", "message": message.into()}}),
    )
}

/// What a model reads of `run_command`'s answer.
pub(super) fn run_command_text(op: &Value) -> String {
    match op["message"].as_str() {
        Some(m) => m.to_owned(),
        // a foreground op: its output and exit code
        None => format!(
            "exit_code={} status={}\n{}",
            op["exit_code"],
            op["status"].as_str().unwrap_or("-"),
            op["output"].as_str().unwrap_or_default()
        ),
    }
}

/// `operation_state`'s one argument, or the tool error saying what is wrong.
pub(super) fn operation_id_arg(
    args: &serde_json::Map<String, Value>,
) -> Result<&str, CallToolResult> {
    let Some(id) = args
        .get("operation_id")
        .and_then(Value::as_str)
        .filter(|id| uuid::Uuid::parse_str(id).is_ok())
    else {
        return Err(bad_arguments(
            "operation_id is required: the operation's id (a uuid)",
        ));
    };
    if args.len() > 1 {
        return Err(bad_arguments("operation_state takes only operation_id"));
    }
    Ok(id)
}

/// What a model reads of `operation_state`'s answer.
pub(super) fn operation_state_text(op: &Value) -> String {
    format!(
        "operation {} {} exit_code={} killed={}{}",
        op["operation_id"].as_str().unwrap_or("-"),
        op["status"].as_str().unwrap_or("-"),
        op["exit_code"],
        op["killed"],
        op["output_tail"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(|t| format!("\noutput tail:\n{t}"))
            .unwrap_or_default()
    )
}
