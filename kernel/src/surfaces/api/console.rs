//! Op output: the raw log from any offset, and the SSE console that follows
//! the log file (so it resumes from any offset, also after a restart) and
//! always ends with a `done` event.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body as HttpBody;
use axum::extract::State;
use axum::http::{header, HeaderMap, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{visible_op, ApiResult, AppState, Params, Seg};
use crate::surfaces::auth::Principal;
use crate::surfaces::views::{ConsoleDone, ConsoleOutput};

const CHUNK: u64 = 64 * 1024;
const MAX_RAW: u64 = 64 << 20;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OffsetQuery {
    #[serde(default)]
    offset: u64,
}

fn read_from(k: &AppState, scratch_key: &str, op_id: &str, offset: u64, max: u64) -> Vec<u8> {
    let ops = k.backend.ops_dir(scratch_key);
    ops.read_log_at(op_id, offset, max)
        .map(|(bytes, _)| bytes)
        .unwrap_or_default()
}

/// 410 `log_pruned` once the op's files went (SPEC §21): its state still
/// has the log's digest, size and tail.
pub(super) async fn refuse_pruned(k: &AppState, op_id: &str) -> ApiResult<()> {
    match k.store.files_pruned_at(op_id).await? {
        None => Ok(()),
        Some(at) => Err(super::ApiError::new(
            axum::http::StatusCode::GONE,
            "log_pruned",
            format!(
                "the log of operation {op_id} was removed at {} (OPKERNEL_OP_FILES_RETENTION); \
                 its state keeps the log's sha256, size and output tail",
                crate::report_text::rfc3339(at)
            ),
        )),
    }
}

/// The op's log bytes from `offset`, streamed in chunks (at most 64 MiB
/// per call): memory per reader is one chunk, whatever the log's size.
#[utoipa::path(
    get,
    path = "/v1/operations/{id}/log",
    tag = "operations",
    params(super::params::OpPath, OffsetQuery),
    responses((status = 200, description = "The op's raw output from `offset`", body = Vec<u8>, content_type = "application/octet-stream")),
)]
pub async fn raw_log(
    State(k): State<AppState>,
    principal: Principal,
    Seg(id): Seg<String>,
    Params(q): Params<OffsetQuery>,
    (uri, headers): (Uri, HeaderMap),
) -> ApiResult<Response> {
    let op = visible_op(&k, &principal, &id).await?;
    if let Some(there) = super::proxy::elsewhere(&k, &op, &headers, &path_of(&uri)).await? {
        return Ok(there);
    }
    refuse_pruned(&k, &op.id).await?;
    let state = (
        k,
        op.scratch_key,
        op.id,
        q.offset,
        q.offset.saturating_add(MAX_RAW),
    );
    let stream = futures::stream::unfold(state, |(k, key, id, off, end)| async move {
        if off >= end {
            return None;
        }
        let want = CHUNK.min(end - off);
        let (kk, kkey, kid) = (k.clone(), key.clone(), id.clone());
        let chunk = tokio::task::spawn_blocking(move || read_from(&kk, &kkey, &kid, off, want))
            .await
            .unwrap_or_default();
        if chunk.is_empty() {
            return None;
        }
        let next = off + chunk.len() as u64;
        Some((
            Ok::<_, Infallible>(axum::body::Bytes::from(chunk)),
            (k, key, id, next, end),
        ))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        HttpBody::from_stream(stream),
    )
        .into_response())
}

struct Follow {
    k: AppState,
    op_id: String,
    scratch_key: String,
    offset: u64,
    finished: bool,
    /// Bumped when an op of the run settles: the only time the control
    /// plane is asked again (output is followed from the file).
    settled: tokio::sync::watch::Receiver<u64>,
    /// The op's status must be read (first pass, or after a settle).
    check_status: bool,
    /// When the status was last read: on a cluster node it is read again
    /// every [`CLUSTER_RECHECK`] (another node may settle the op, and
    /// its settle wakes only that node's waiters).
    checked_at: std::time::Instant,
}

/// How often a cluster node's console re-reads its op's status.
const CLUSTER_RECHECK: Duration = Duration::from_secs(2);

impl Follow {
    /// Up to a chunk of the log from the current offset.
    async fn read_chunk(&self) -> Vec<u8> {
        let (k, key, id, off) = (
            self.k.clone(),
            self.scratch_key.clone(),
            self.op_id.clone(),
            self.offset,
        );
        tokio::task::spawn_blocking(move || read_from(&k, &key, &id, off, CHUNK))
            .await
            .unwrap_or_default()
    }

    /// The next event: output as it is written, then `done` once the op
    /// is terminal and its log read to the end.
    async fn next_event(&mut self) -> Option<Event> {
        if self.finished {
            return None;
        }
        loop {
            let chunk = self.read_chunk().await;
            if !chunk.is_empty() {
                self.offset += chunk.len() as u64;
                let output = ConsoleOutput {
                    offset: self.offset,
                    text: String::from_utf8_lossy(&chunk).into_owned(),
                };
                let data = serde_json::to_string(&output).unwrap_or_default();
                let event = Event::default()
                    .event("output")
                    .id(self.offset.to_string())
                    .data(data);
                return Some(event);
            }
            if self.k.node.is_some() && self.checked_at.elapsed() >= CLUSTER_RECHECK {
                self.check_status = true;
            }
            if !self.check_status {
                // new output is looked for in the file; the status only
                // after a settle notification of the op's run
                let settled = self.settled.changed();
                if tokio::time::timeout(Duration::from_millis(150), settled)
                    .await
                    .is_ok()
                {
                    self.check_status = true;
                }
                continue;
            }
            self.check_status = false;
            self.checked_at = std::time::Instant::now();
            self.settled.borrow_and_update();
            let Ok(Some(op)) = self.k.store.get_op(&self.op_id).await else {
                self.finished = true;
                return Some(
                    Event::default()
                        .event("done")
                        .data(r#"{"status":"unknown"}"#),
                );
            };
            if !op.status.is_terminal() {
                continue;
            }
            // one more read catches bytes written just before the end; the
            // op is terminal, so the next empty read ends the stream
            if !self.read_chunk().await.is_empty() {
                self.check_status = true;
                continue;
            }
            self.finished = true;
            let done = ConsoleDone {
                operation_id: op.id,
                status: Some(op.status),
                exit_code: op.exit_code,
                killed: op.killed,
                effect: op.effect,
                message: op.error,
            };
            let data = serde_json::to_string(&done).unwrap_or_default();
            return Some(Event::default().event("done").data(data));
        }
    }
}

/// `GET /v1/operations/{id}/console`: the op's output live over SSE,
/// resumable by `Last-Event-ID` (a byte offset).
#[utoipa::path(
    get,
    path = "/v1/operations/{id}/console",
    tag = "operations",
    params(super::params::OpPath, OffsetQuery),
    responses((status = 200, description = "A stream of server-sent events", body = String, content_type = "text/event-stream")),
)]
pub async fn console(
    State(k): State<AppState>,
    principal: Principal,
    Seg(id): Seg<String>,
    Params(q): Params<OffsetQuery>,
    (uri, headers): (Uri, HeaderMap),
) -> ApiResult<Response> {
    let op = visible_op(&k, &principal, &id).await?;
    if let Some(there) = super::proxy::elsewhere(&k, &op, &headers, &path_of(&uri)).await? {
        return Ok(there);
    }
    refuse_pruned(&k, &op.id).await?;
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(q.offset);
    let state = Follow {
        settled: k.run_events(&op.run_id),
        k,
        op_id: op.id,
        scratch_key: op.scratch_key,
        offset: resume,
        finished: false,
        check_status: true,
        checked_at: std::time::Instant::now(),
    };
    let stream = futures::stream::unfold(state, |mut s| async move {
        let event = s.next_event().await?;
        Some((Ok::<_, Infallible>(event), s))
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// A request's path with its query, as forwarded to another node.
pub(super) fn path_of(uri: &Uri) -> String {
    uri.path_and_query()
        .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned())
}
