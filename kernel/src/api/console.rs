//! Op output: the raw log from any offset, and the SSE console that follows
//! the log file (so it resumes from any offset, also after a restart) and
//! always ends with a `done` event.

use std::convert::Infallible;
use std::io::{Read, Seek, SeekFrom};
use std::time::Duration;

use axum::body::Body as HttpBody;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;
use serde_json::json;

use super::{visible_op, ApiResult, AppState, Params, Seg};
use crate::auth::Principal;

const CHUNK: u64 = 64 * 1024;
const MAX_RAW: u64 = 64 << 20;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OffsetQuery {
    #[serde(default)]
    offset: u64,
}

fn read_from(k: &AppState, scratch_key: &str, op_id: &str, offset: u64, max: u64) -> Vec<u8> {
    let Ok(mut file) = k.backend.ops_dir(scratch_key).open_log(op_id) else {
        return Vec::new();
    };
    if file.seek(SeekFrom::Start(offset)).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    let _ = file.take(max).read_to_end(&mut buf);
    buf
}

/// The op's log bytes from `offset`, streamed in chunks (at most 64 MiB
/// per call): memory per reader is one chunk, whatever the log's size.
pub async fn raw_log(
    State(k): State<AppState>,
    principal: Principal,
    Seg(id): Seg<String>,
    Params(q): Params<OffsetQuery>,
) -> ApiResult<Response> {
    let op = visible_op(&k, &principal, &id).await?;
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
}

pub async fn console(
    State(k): State<AppState>,
    principal: Principal,
    Seg(id): Seg<String>,
    Params(q): Params<OffsetQuery>,
    headers: HeaderMap,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let op = visible_op(&k, &principal, &id).await?;
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
    };
    let stream = futures::stream::unfold(state, |mut s| async move {
        if s.finished {
            return None;
        }
        loop {
            let (k, key, id, off) = (
                s.k.clone(),
                s.scratch_key.clone(),
                s.op_id.clone(),
                s.offset,
            );
            let chunk = tokio::task::spawn_blocking(move || read_from(&k, &key, &id, off, CHUNK))
                .await
                .unwrap_or_default();
            if !chunk.is_empty() {
                s.offset += chunk.len() as u64;
                let data = json!({"offset": s.offset, "text": String::from_utf8_lossy(&chunk)});
                let event = Event::default()
                    .event("output")
                    .id(s.offset.to_string())
                    .data(data.to_string());
                return Some((Ok(event), s));
            }
            if !s.check_status {
                // new output is looked for in the file; the status only
                // after a settle notification of the op's run
                let settled = s.settled.changed();
                if tokio::time::timeout(Duration::from_millis(150), settled)
                    .await
                    .is_ok()
                {
                    s.check_status = true;
                }
                continue;
            }
            s.check_status = false;
            s.settled.borrow_and_update();
            let op = match s.k.store.get_op(&s.op_id).await {
                Ok(Some(op)) => op,
                _ => {
                    s.finished = true;
                    let event = Event::default()
                        .event("done")
                        .data(r#"{"status":"unknown"}"#);
                    return Some((Ok(event), s));
                }
            };
            if op.status.is_terminal() {
                // one more read catches bytes written just before the end
                let (k, key, id, off) = (
                    s.k.clone(),
                    s.scratch_key.clone(),
                    s.op_id.clone(),
                    s.offset,
                );
                let rest =
                    tokio::task::spawn_blocking(move || read_from(&k, &key, &id, off, CHUNK))
                        .await
                        .unwrap_or_default();
                if !rest.is_empty() {
                    // the op is terminal: the next empty read ends the stream
                    s.check_status = true;
                    continue;
                }
                s.finished = true;
                let data = json!({
                    "operation_id": op.id,
                    "status": op.status.as_str(),
                    "exit_code": op.exit_code,
                    "killed": op.killed,
                    "effect": op.effect,
                    "message": op.error,
                });
                return Some((Ok(Event::default().event("done").data(data.to_string())), s));
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
