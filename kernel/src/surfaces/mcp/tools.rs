//! The MCP tools: their definitions (the API's own, plus the two MCP-only
//! tools) and how an API answer, read as its typed view, becomes a tool
//! result.

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock as Content, Tool};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::backend::Answer;
use crate::surfaces::views::{
    FileContent, FileList, FileType, FileWrittenView, OpView, OutputView, StdinAnswer, ToolsView,
};

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
                                 "maximum": crate::surfaces::api::reports::MAX_REPORT_WAIT_SEC, "default": 0},
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

/// A tool's answer from an API answer: structured content (the answer
/// as sent) plus the text a model reads of its typed view; an API error is
/// a tool error with the API's message.
pub(super) fn tool_result<T: DeserializeOwned>(
    answer: Answer,
    text: impl FnOnce(&T) -> String,
) -> CallToolResult {
    match answer_view(answer) {
        Ok((view, body)) => success(text(&view), body),
        Err(error) => error,
    }
}

/// A successful answer's typed view and the answer as sent; otherwise the
/// tool error to return (the API's error, or an answer of the wrong shape).
pub(super) fn answer_view<T: DeserializeOwned>(
    (status, body): Answer,
) -> Result<(T, Value), CallToolResult> {
    if !(200..300).contains(&status) {
        return Err(tool_error(status, &body));
    }
    match serde_json::from_value(body.clone()) {
        Ok(view) => Ok((view, body)),
        Err(e) => Err(tool_error(
            502,
            &json!({"error": {"code": "internal", "message": format!("unexpected answer from the kernel: {e}")}}),
        )),
    }
}

/// A successful tool result: the text a model reads, and the answer.
pub(super) fn success(text: String, body: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![Content::text(text)]);
    r.structured_content = Some(body);
    r
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

/// `null` or the code, as the model has always read it.
fn exit_code_text(op: &OpView) -> String {
    op.exit_code
        .map_or_else(|| "null".to_owned(), |code| code.to_string())
}

/// What a model reads of `run_command`'s answer.
pub(super) fn run_command_text(op: &OpView) -> String {
    match &op.message {
        // a foreground call that yielded: its output so far, then where to go on
        Some(m) if op.running == Some(true) => format!(
            "{m}\nnext_offset={}\noutput so far:\n{}",
            op.next_offset.unwrap_or(0),
            op.output.as_deref().unwrap_or_default()
        ),
        Some(m) => m.clone(),
        // a foreground op: its output and exit code
        None => format!(
            "exit_code={} status={}\n{}",
            exit_code_text(op),
            op.status,
            op.output.as_deref().unwrap_or_default()
        ),
    }
}

/// What a model reads of `write_stdin`'s answer.
pub(super) fn stdin_text(a: &StdinAnswer) -> String {
    let code = a
        .exit_code
        .map(|c| format!(" exit_code={c}"))
        .unwrap_or_default();
    format!(
        "status={}{code} next_offset={}\n{}",
        a.status, a.next_offset, a.output
    )
}

/// What a model reads of `read_output`'s answer.
pub(super) fn output_text(a: &OutputView) -> String {
    let code = a
        .exit_code
        .map(|c| format!(" exit_code={c}"))
        .unwrap_or_default();
    format!(
        "status={}{code} running={} next_offset={}\n{}",
        a.status, a.running, a.next_offset, a.output
    )
}

/// What a model reads of `kill_operation`'s answer.
pub(super) fn kill_operation_text(op: &OpView) -> String {
    op.message
        .clone()
        .unwrap_or_else(|| "kill requested".to_owned())
}

/// What a model reads of `operation_state`'s answer.
pub(super) fn operation_state_text(op: &OpView) -> String {
    format!(
        "operation {} {} exit_code={} killed={}{}",
        op.operation_id,
        op.status,
        exit_code_text(op),
        op.killed,
        op.output_tail
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(|t| format!("\noutput tail:\n{t}"))
            .unwrap_or_default()
    )
}

/// What a model reads of `read_file`'s answer: a header line, then the
/// slice.
pub(super) fn file_text(f: &FileContent) -> String {
    format!(
        "{} size={} offset={} next_offset={} eof={} encoding={}\n{}",
        f.path, f.size, f.offset, f.next_offset, f.eof, f.encoding, f.content
    )
}

/// What a model reads of `write_file`'s answer.
pub(super) fn written_text(w: &FileWrittenView) -> String {
    format!("wrote {} bytes to {}", w.bytes, w.path)
}

/// What a model reads of `list_dir`'s answer: one line per entry.
pub(super) fn listing_text(l: &FileList) -> String {
    let mut out = format!("{} ({} entries)", l.path, l.entries.len());
    for e in &l.entries {
        let kind = match e.kind {
            FileType::File => "file",
            FileType::Dir => "dir",
            FileType::Symlink => "symlink",
            FileType::Other => "other",
        };
        out.push_str(&format!(
            "\n{kind:7} {:>10} {:>4} {}",
            e.size, e.mode, e.name
        ));
    }
    out
}
