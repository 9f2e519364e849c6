//! A run's trace (SPEC §14 events: long poll, SSE) and the reports it was
//! served (read-only: listing them acknowledges nothing).

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::Json;
use futures::Stream;
use serde::Deserialize;

use super::runs::load_run;
use super::{authorize_run, ApiError, ApiResult, AppState, Params, Scope, Seg};
use crate::surfaces::auth::Principal;
use crate::surfaces::views::{Event, EventsPage, ReportList, ReportSummary};

/// Longest an events call may wait.
pub const MAX_EVENTS_WAIT_SEC: u64 = 300;
/// Events in one answer (and one SSE batch).
const EVENTS_PAGE: u32 = 500;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Events after this sequence number.
    #[serde(default)]
    after: i64,
    /// Seconds to wait for the first one (at most 300).
    #[serde(default)]
    #[param(maximum = 300)]
    wait: u64,
    /// Events at most in the page.
    #[param(value_type = Option<u64>, maximum = 4294967295_u64)]
    limit: Option<u32>,
    /// The last `tail` events instead (no wait).
    #[param(value_type = Option<u64>, maximum = 4294967295_u64)]
    tail: Option<u32>,
}

/// The query of the events stream.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct StreamQuery {
    /// Events after this sequence number (`Last-Event-ID` wins).
    #[serde(default)]
    after: i64,
    /// End the stream once no new event came for this many seconds (at
    /// most 300; absent: follow until the client leaves).
    #[param(maximum = 300)]
    idle_sec: Option<u64>,
    /// The long poll's parameters, accepted and ignored here (the stream
    /// documented them once; a client that shares the poll's URL keeps
    /// working).
    #[serde(default, rename = "wait")]
    #[param(value_type = Option<u64>)]
    _wait: Option<serde::de::IgnoredAny>,
    /// Ignored, as `wait`.
    #[serde(default, rename = "limit")]
    #[param(value_type = Option<u64>)]
    _limit: Option<serde::de::IgnoredAny>,
    /// Ignored, as `wait`.
    #[serde(default, rename = "tail")]
    #[param(value_type = Option<u64>)]
    _tail: Option<serde::de::IgnoredAny>,
}

/// `GET /v1/runs/{run}/events?after=SEQ&wait=SEC`: the run's events after
/// `after`, waiting up to `wait` seconds for the first one.
#[utoipa::path(
    get,
    path = "/v1/runs/{run}/events",
    tag = "runs",
    params(super::params::RunPath, EventsQuery),
    responses((status = 200, description = "Success", body = EventsPage)),
)]
pub async fn events(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    Params(q): Params<EventsQuery>,
) -> ApiResult<Json<EventsPage>> {
    authorize_run(&k, &principal, &run, Scope::Subtree).await?;
    load_run(&k, &run).await?;
    if q.wait > MAX_EVENTS_WAIT_SEC {
        return Err(ApiError::bad_request(format!(
            "wait must be at most {MAX_EVENTS_WAIT_SEC} s"
        )));
    }
    let limit = q.limit.unwrap_or(EVENTS_PAGE).clamp(1, EVENTS_PAGE);
    if let Some(n) = q.tail {
        // the cursor first, then the tail up to it: a stream opened after
        // it misses nothing and repeats nothing
        let last_seq = k.store.last_event_seq(&run).await?;
        let events = k
            .store
            .events_tail(&run, n.clamp(1, EVENTS_PAGE), last_seq)
            .await?;
        return Ok(Json(EventsPage {
            run_id: run,
            events,
            next_after: last_seq,
            last_seq,
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(q.wait);
    let mut journal = k.store.journal();
    let events = loop {
        journal.borrow_and_update();
        let events = k.store.events_after(&run, q.after, limit).await?;
        let left = deadline.saturating_duration_since(Instant::now());
        if !events.is_empty() || left.is_zero() {
            break events;
        }
        // the safety-net period bounds a missed wake-up
        let _ = tokio::time::timeout(left.min(Duration::from_secs(5)), journal.changed()).await;
    };
    let next_after = events.last().map_or(q.after, |e| e.seq);
    let last_seq = k.store.last_event_seq(&run).await?;
    Ok(Json(EventsPage {
        run_id: run,
        events,
        next_after,
        // where a reader that wants only what comes next starts
        last_seq,
    }))
}

/// `GET /v1/runs/{run}/events/stream`: the run's events over SSE from
/// `after` (or `Last-Event-ID`), live; each SSE event's id is its `seq`
/// and its data the event (`RunEventFrame` in the document).
#[utoipa::path(
    get,
    path = "/v1/runs/{run}/events/stream",
    tag = "runs",
    params(super::params::RunPath, StreamQuery, ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event")),
    responses((status = 200, description = "A stream of server-sent events", body = String, content_type = "text/event-stream")),
)]
pub async fn events_stream(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    Params(q): Params<StreamQuery>,
    headers: HeaderMap,
) -> ApiResult<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>> {
    authorize_run(&k, &principal, &run, Scope::Subtree).await?;
    load_run(&k, &run).await?;
    if q.idle_sec.is_some_and(|s| s > MAX_EVENTS_WAIT_SEC) {
        return Err(ApiError::bad_request(format!(
            "idle_sec must be at most {MAX_EVENTS_WAIT_SEC} s"
        )));
    }
    let idle = q.idle_sec.map(Duration::from_secs);
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(q.after);
    let follow = Follow {
        journal: k.store.journal(),
        k,
        run,
        after,
        queue: std::collections::VecDeque::new(),
        idle,
        last_news: Instant::now(),
    };
    let stream = futures::stream::unfold(follow, |mut f| async move {
        let sse = f.next_event().await?;
        Some((Ok(sse), f))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// A reader of a run's events stream.
struct Follow {
    k: AppState,
    run: String,
    after: i64,
    journal: tokio::sync::watch::Receiver<i64>,
    queue: std::collections::VecDeque<Event>,
    /// The longest quiet before the stream ends (`None`: never).
    idle: Option<Duration>,
    /// When the last event was sent (or the stream opened).
    last_news: Instant,
}

impl Follow {
    /// The next SSE event; `None` ends the stream (idle past its bound,
    /// or the control plane failed).
    async fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                self.after = event.seq;
                self.last_news = Instant::now();
                let data = serde_json::to_string(&event).unwrap_or_default();
                return Some(SseEvent::default().id(event.seq.to_string()).data(data));
            }
            self.journal.borrow_and_update();
            match self
                .k
                .store
                .events_after(&self.run, self.after, EVENTS_PAGE)
                .await
            {
                Ok(events) if !events.is_empty() => self.queue.extend(events),
                Ok(_) => {
                    let mut nap = Duration::from_secs(5);
                    if let Some(idle) = self.idle {
                        let left = idle.saturating_sub(self.last_news.elapsed());
                        if left.is_zero() {
                            return None;
                        }
                        nap = nap.min(left);
                    }
                    let _ = tokio::time::timeout(nap, self.journal.changed()).await;
                }
                Err(e) => {
                    tracing::warn!(%e, run = %self.run, "events stream ends: control plane error");
                    return None;
                }
            }
        }
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ReportsQuery {
    /// Reports at most, newest first.
    #[param(value_type = Option<u64>, maximum = 4294967295_u64)]
    limit: Option<u32>,
}

/// `GET /v1/runs/{run}/reports`: the run's reports as they were served,
/// newest first, with whether each was acknowledged. Read-only: reading
/// drains and acks nothing, so an ancestor (and the panel) may look.
#[utoipa::path(
    get,
    path = "/v1/runs/{run}/reports",
    tag = "reports",
    params(super::params::RunPath, ReportsQuery),
    responses((status = 200, description = "Success", body = ReportList)),
)]
pub async fn reports(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    Params(q): Params<ReportsQuery>,
) -> ApiResult<Json<ReportList>> {
    authorize_run(&k, &principal, &run, Scope::Subtree).await?;
    load_run(&k, &run).await?;
    let list = k
        .store
        .recent_reports(&run, q.limit.unwrap_or(20).clamp(1, 200))
        .await?;
    let reports = list
        .into_iter()
        .map(|(r, created, acked)| ReportSummary {
            report_id: r.report_id,
            created_at: crate::report_text::rfc3339(created),
            acked_at: acked.map(crate::report_text::rfc3339),
            resolved: r.resolved.len(),
            text: r.text,
        })
        .collect();
    Ok(Json(ReportList {
        run_id: run,
        reports,
    }))
}
