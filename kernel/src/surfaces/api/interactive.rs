//! Interactive ops over HTTP (SPEC §25): `write_stdin`, `read_output`,
//! `resize_tty`, a nudge, and `kill_operation`'s single signal. In a
//! cluster each call is answered by the op's node (forwarded there).

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use tokio::time::Instant;

use super::{authorize_run, visible_op, ApiError, ApiResult, AppState, Body, Scope, Seg};
use crate::event_kind::{EventKind, ToolNudged, ToolSignalled, ToolStdin};
use crate::runtime::interactive::{self, Input, InputError, Until};
use crate::store::Op;
use crate::surfaces::auth::Principal;
use crate::surfaces::requests::{Nudge, ReadOutput, ResizeTty, RunCommand, SignalName, WriteStdin};
use crate::surfaces::views::{OpView, OutputView, StdinAnswer};

/// Bytes one `write_stdin` takes (a body is at most 1 MiB, base64 included).
pub const MAX_WRITE_BYTES: usize = 512 * 1024;
/// Bytes of output one answer carries by default, and at most.
const DEFAULT_READ: u64 = 64 * 1024;
const MAX_READ: u64 = 1 << 20;
/// How long output must be quiet before a write's answer goes.
const QUIET: Duration = Duration::from_millis(100);
/// A write to an op still starting waits at least this long for its start.
const START_WAIT: Duration = Duration::from_secs(10);
/// A write to a full FIFO waits at least this long for the command to read.
const FULL_WAIT: Duration = Duration::from_secs(2);

impl From<InputError> for ApiError {
    fn from(e: InputError) -> ApiError {
        let code = match &e {
            InputError::NoStdin(_) => "no_stdin",
            InputError::NoTty(_) => "no_tty",
            InputError::Ended(..) => "operation_ended",
            InputError::Closed(_) => "stdin_closed",
            InputError::NotRunning(..) => "not_running",
            InputError::Full { .. } => "stdin_full",
            InputError::Io(_) => return ApiError::internal(e.to_string()),
            InputError::Store(_) => return ApiError::internal(e.to_string()),
        };
        ApiError::new(StatusCode::CONFLICT, code, e.to_string())
    }
}

/// A ms value within `0..=max` (`default` when absent), as a duration.
pub fn millis(value: Option<u64>, default: u64, max: u64, name: &str) -> ApiResult<Duration> {
    let ms = value.unwrap_or(default);
    if ms > max {
        return Err(ApiError::bad_request(format!(
            "{name} must be at most {max}, got {ms}"
        )));
    }
    Ok(Duration::from_millis(ms))
}

/// The op `id` of `run` as the caller may see it.
async fn op_of_run(k: &AppState, principal: &Principal, run: &str, id: &str) -> ApiResult<Op> {
    let op = visible_op(k, principal, id).await?;
    if op.run_id != run {
        return Err(ApiError::not_found(format!(
            "no operation {id} in run {run}"
        )));
    }
    Ok(op)
}

/// The bytes a write asks for: `text` or `data_base64`, bounded.
fn payload(req: &WriteStdin) -> ApiResult<Vec<u8>> {
    let data = match (&req.text, &req.data_base64) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request("give text or data_base64, not both"))
        }
        (Some(text), None) => text.as_bytes().to_vec(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| ApiError::bad_request(format!("data_base64 is not base64: {e}")))?,
        (None, None) => Vec::new(),
    };
    if data.is_empty() && !req.eof {
        return Err(ApiError::bad_request(
            "nothing to write: give text or data_base64, or eof",
        ));
    }
    if data.len() > MAX_WRITE_BYTES {
        return Err(ApiError::bad_request(format!(
            "a write is at most {MAX_WRITE_BYTES} bytes, got {}: write in parts",
            data.len()
        )));
    }
    Ok(data)
}

/// Writes to the op once it runs (waiting within `yield_for` while it
/// starts), then answers with the output since the write.
async fn write_and_answer(
    k: &AppState,
    op: &Op,
    input: Input,
    key: Option<&str>,
    yield_for: Duration,
) -> ApiResult<StdinAnswer> {
    let start = Instant::now();
    if !op.io.has_stdin() {
        return Err(InputError::NoStdin(op.id.clone()).into());
    }
    // a start is waited for whatever the yield: the output is what it bounds
    let started_by = start + yield_for.max(START_WAIT);
    let running = interactive::until_running(k, &op.id, started_by).await?;
    let from = k.backend.ops_dir(&op.scratch_key).log_size(&op.id);
    let written = match &input {
        Input::Bytes { data, .. } => data.len() as u64,
        Input::Resize { .. } => 0,
    };
    let full_wait = start + yield_for.max(FULL_WAIT);
    interactive::write(k, &running, &input, key, full_wait).await?;
    let until = Until::Quiet(QUIET.min(yield_for / 2));
    let deadline = start + yield_for;
    let out = interactive::output_after(k, &running, from, until, deadline, DEFAULT_READ).await?;
    Ok(StdinAnswer {
        operation_id: op.id.clone(),
        output: String::from_utf8_lossy(&out.bytes).into_owned(),
        next_offset: out.next_offset,
        status: out.op.status,
        exit_code: out.op.exit_code,
        bytes_written: written,
    })
}

/// `write_stdin`: bytes (and maybe EOF) to a running op's stdin; the
/// answer carries the output produced since.
#[utoipa::path(
    post,
    path = "/v1/runs/{run}/tools/write_stdin",
    tag = "operations",
    params(super::params::RunPath, ("Idempotency-Key" = Option<String>, Header, description = "Applies a retried write once (1 to 128 printable ASCII characters)", pattern = r"^[!-~]{1,128}$")),
    request_body = WriteStdin,
    responses((status = 200, description = "Written; the output since", body = StdinAnswer)),
)]
pub async fn write_stdin(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    (uri, headers): (Uri, HeaderMap),
    Body(req): Body<WriteStdin>,
) -> ApiResult<Response> {
    authorize_run(&k, &principal, &run, Scope::Own).await?;
    let op = op_of_run(&k, &principal, &run, &req.operation_id).await?;
    let data = payload(&req)?;
    let yield_for = millis(req.yield_ms, 1000, 30_000, "yield_ms")?;
    let key = super::params::idempotency_key(&headers)?;
    if let Some(there) =
        super::proxy::elsewhere_post(&k, &op, &headers, &super::console::path_of(&uri), &req)
            .await?
    {
        return Ok(there);
    }
    let bytes = data.len() as u64;
    let input = Input::Bytes { data, eof: req.eof };
    let answer = write_and_answer(&k, &op, input, key.as_deref(), yield_for).await?;
    let event = EventKind::ToolStdin(ToolStdin {
        bytes,
        eof: req.eof,
    });
    k.store.record_event(&op.run_id, &op.id, event).await?;
    Ok(Json(answer).into_response())
}

/// `read_output`: an op's output from an offset, with whether it still
/// runs (waiting up to `wait_ms` while nothing is new).
#[utoipa::path(
    post,
    path = "/v1/runs/{run}/tools/read_output",
    tag = "operations",
    params(super::params::RunPath),
    request_body = ReadOutput,
    responses((status = 200, description = "The output from the offset", body = OutputView)),
)]
pub async fn read_output(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    (uri, headers): (Uri, HeaderMap),
    Body(req): Body<ReadOutput>,
) -> ApiResult<Response> {
    authorize_run(&k, &principal, &run, Scope::Subtree).await?;
    let op = op_of_run(&k, &principal, &run, &req.operation_id).await?;
    let wait = millis(req.wait_ms, 0, 30_000, "wait_ms")?;
    let max = req.max_bytes.unwrap_or(DEFAULT_READ);
    if !(1..=MAX_READ).contains(&max) {
        return Err(ApiError::bad_request(format!(
            "max_bytes must be between 1 and {MAX_READ}, got {max}"
        )));
    }
    if let Some(there) =
        super::proxy::elsewhere_post(&k, &op, &headers, &super::console::path_of(&uri), &req)
            .await?
    {
        return Ok(there);
    }
    super::console::refuse_pruned(&k, &op.id).await?;
    let from = req.offset.unwrap_or(0);
    let deadline = Instant::now() + wait;
    let out = interactive::output_after(&k, &op, from, Until::Any, deadline, max).await?;
    Ok(Json(OutputView {
        operation_id: op.id.clone(),
        output: String::from_utf8_lossy(&out.bytes).into_owned(),
        next_offset: out.next_offset,
        running: !out.op.status.is_terminal(),
        status: out.op.status,
        exit_code: out.op.exit_code,
    })
    .into_response())
}

/// `resize_tty`: a terminal op's new size (its foreground job gets SIGWINCH).
#[utoipa::path(
    post,
    path = "/v1/runs/{run}/tools/resize_tty",
    tag = "operations",
    params(super::params::RunPath),
    request_body = ResizeTty,
    responses((status = 200, description = "Resized", body = OpView)),
)]
pub async fn resize_tty(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    (uri, headers): (Uri, HeaderMap),
    Body(req): Body<ResizeTty>,
) -> ApiResult<Response> {
    authorize_run(&k, &principal, &run, Scope::Own).await?;
    let op = op_of_run(&k, &principal, &run, &req.operation_id).await?;
    sandbox::stdin::check_size(req.rows, req.cols).map_err(ApiError::bad_request)?;
    if !op.io.is_tty() {
        return Err(InputError::NoTty(op.id.clone()).into());
    }
    if let Some(there) =
        super::proxy::elsewhere_post(&k, &op, &headers, &super::console::path_of(&uri), &req)
            .await?
    {
        return Ok(there);
    }
    let input = Input::Resize {
        rows: req.rows,
        cols: req.cols,
    };
    write_and_answer(&k, &op, input, None, Duration::ZERO).await?;
    let saying = format!("terminal resized to {}x{}", req.rows, req.cols);
    Ok(Json(OpView::of(&op).saying(saying)).into_response())
}

/// A foreground op with stdin or a terminal yields after this long unless
/// told otherwise: an agent waiting on a REPL could not answer it.
const INTERACTIVE_YIELD_MS: u64 = 10_000;

/// The op's stdin (SPEC §25) and, for a foreground call, when it yields.
pub(super) fn interactive_of(req: &RunCommand) -> ApiResult<(sandbox::Io, Option<Duration>)> {
    use crate::surfaces::requests::Tty;
    let io = match req.tty {
        Some(Tty::On(true)) => sandbox::Io::Tty { rows: 24, cols: 80 },
        Some(Tty::Size(size)) => {
            sandbox::stdin::check_size(size.rows, size.cols).map_err(ApiError::bad_request)?;
            sandbox::Io::Tty {
                rows: size.rows,
                cols: size.cols,
            }
        }
        Some(Tty::On(false)) | None if req.stdin => sandbox::Io::Pipe,
        Some(Tty::On(false)) | None => sandbox::Io::Null,
    };
    if req.background {
        if req.yield_ms.is_some() {
            return Err(ApiError::bad_request(
                "yield_ms is for a foreground command (a background one answers at once)",
            ));
        }
        return Ok((io, None));
    }
    let default = io.has_stdin().then_some(INTERACTIVE_YIELD_MS);
    let yield_after = match req.yield_ms.or(default) {
        Some(ms) => Some(millis(Some(ms), 0, 600_000, "yield_ms")?),
        None => None,
    };
    Ok((io, yield_after))
}

/// The answer of a foreground call that yielded: the op as the flip left
/// it (never a result settled since: that one is the report's), the
/// output so far, and the op going on in the background.
pub(super) async fn yielded(k: &AppState, op: Op, after: Duration) -> OpView {
    let (output, size) = super::waits::output_so_far(k, &op);
    let message = format!(
        "Still running after {} ms: it goes on in the background as operation {}. Do not wait idle: \
         its result (exit code + output tail) will arrive automatically as a follow-up message. Use \
         write_stdin to answer it, read_output (from next_offset) to see more, kill_operation to stop it.",
        after.as_millis(),
        op.id
    );
    OpView {
        output: Some(output),
        running: Some(!op.status.is_terminal()),
        next_offset: Some(size),
        ..OpView::of(&op).saying(message)
    }
}

/// Bytes of a nudge's text.
const MAX_NUDGE_BYTES: usize = 4096;

/// `POST /v1/operations/{id}/nudge`: a line for a running command's
/// stdin (seed 002), from the operator or the op's own run.
#[utoipa::path(
    post,
    path = "/v1/operations/{id}/nudge",
    tag = "operations",
    params(super::params::OpPath),
    request_body = Nudge,
    responses((status = 200, description = "Written; the output since", body = StdinAnswer)),
)]
pub async fn nudge(
    State(k): State<AppState>,
    principal: Principal,
    Seg(id): Seg<String>,
    (uri, headers): (Uri, HeaderMap),
    Body(req): Body<Nudge>,
) -> ApiResult<Response> {
    let op = visible_op(&k, &principal, &id).await?;
    authorize_run(&k, &principal, &op.run_id, Scope::Own).await?;
    let text = &req.text;
    if text.is_empty() || text.len() > MAX_NUDGE_BYTES || text.contains(['\0', '\n']) {
        return Err(ApiError::bad_request(format!(
            "a nudge is one line of 1 to {MAX_NUDGE_BYTES} bytes (no NUL, no newline)"
        )));
    }
    if let Some(there) =
        super::proxy::elsewhere_post(&k, &op, &headers, &super::console::path_of(&uri), &req)
            .await?
    {
        return Ok(there);
    }
    let data = format!("{text}\n").into_bytes();
    let bytes = data.len() as u64;
    let input = Input::Bytes { data, eof: false };
    let key = super::params::idempotency_key(&headers)?;
    let answer = write_and_answer(&k, &op, input, key.as_deref(), Duration::from_secs(1)).await?;
    let event = EventKind::ToolNudged(ToolNudged { bytes });
    k.store.record_event(&op.run_id, &op.id, event).await?;
    Ok(Json(answer).into_response())
}

/// `kill_operation` with a `signal`: that one signal to the op's
/// foreground process group (once it runs); the op ends only if its
/// command does.
pub(super) async fn signal(
    k: &AppState,
    op: &Op,
    name: SignalName,
    headers: &HeaderMap,
    body: &crate::surfaces::requests::KillOperation,
) -> ApiResult<Response> {
    let path = format!("/v1/runs/{}/tools/kill_operation", op.run_id);
    if let Some(there) = super::proxy::elsewhere_post(k, op, headers, &path, body).await? {
        return Ok(there);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let running = interactive::until_running(k, &op.id, deadline).await?;
    let signal = name.signal();
    let processes = interactive::signal(k, &running, signal).await?;
    let event = EventKind::ToolSignalled(ToolSignalled {
        signal: signal.name().to_owned(),
        processes,
    });
    k.store.record_event(&op.run_id, &op.id, event).await?;
    let saying = format!(
        "SIG{} sent to {processes} process(es) of the operation's foreground group",
        signal.name()
    );
    Ok(Json(OpView::of(&running).saying(saying)).into_response())
}
