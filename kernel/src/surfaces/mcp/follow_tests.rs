use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::*;
use crate::base::sync::Lock;
use crate::event_kind::{Event, EventKind, ToolCompleted};
use crate::surfaces::mcp::backend::{Answer, Backend};
use crate::surfaces::views::EventsPage;

/// The API's answer of an events call: `events` after `after`.
fn page(events: Vec<Event>, after: i64) -> Value {
    let next_after = events.last().map_or(after, |e| e.seq);
    serde_json::to_value(EventsPage {
        run_id: "r".into(),
        events,
        next_after,
        last_seq: next_after,
    })
    .unwrap()
}

/// The run's events: one background op resolves after each of the first
/// `resolving` sequence numbers; past them a call waits briefly (the API's
/// `wait`) and returns nothing.
struct Events {
    resolving: i64,
    calls: AtomicUsize,
}

impl Backend for Events {
    fn call_keyed<'a>(
        &'a self,
        _caller: crate::surfaces::mcp::backend::Caller<'a>,
        _method: reqwest::Method,
        path: &'a str,
        _body: Option<Value>,
        _key: Option<&'a str>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Answer, String>> + Send + 'a>>
    {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let after: i64 = path
                .split("after=")
                .nth(1)
                .and_then(|rest| rest.split('&').next())
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("unexpected call {path}"))?;
            if after >= self.resolving {
                tokio::time::sleep(Duration::from_millis(10)).await;
                return Ok((200, page(Vec::new(), after)));
            }
            let seq = after + 1;
            let completed = ToolCompleted {
                background: true,
                exit_code: Some(0),
                ..ToolCompleted::default()
            };
            let event = Event {
                seq,
                at: 0,
                operation_id: Some(format!("op-{seq}")),
                kind: EventKind::ToolCompleted(completed),
            };
            Ok((200, page(vec![event], after)))
        })
    }
}

fn handler(fixed: bool) -> (OpkernelMcp, Arc<Events>) {
    let events = Arc::new(Events {
        resolving: 3,
        calls: AtomicUsize::new(0),
    });
    let auth = fixed.then(|| RunAuth {
        token: "t".into(),
        run: "r".into(),
        channel: String::new(),
    });
    let mcp = OpkernelMcp::new(events.clone(), Arc::new(Vec::new()), auth);
    (mcp, events)
}

fn auth() -> RunAuth {
    RunAuth {
        token: "t".into(),
        run: "r".into(),
        channel: String::new(),
    }
}

/// Runs the follower loop in a task; returns it and what it was told.
fn follow(
    mcp: &OpkernelMcp,
    closed: Arc<AtomicBool>,
) -> (tokio::task::JoinHandle<FollowEnd>, Arc<Lock<Vec<String>>>) {
    let told = Arc::new(Lock::new(Vec::new()));
    let (this, sink) = (mcp.clone(), told.clone());
    let task = tokio::spawn(async move {
        this.follow_resolutions(
            &auth(),
            0,
            move || closed.load(Ordering::SeqCst),
            |op, _| {
                sink.lock().push(op);
                async { true }
            },
        )
        .await
    });
    (task, told)
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "{what} did not happen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn age_session(mcp: &OpkernelMcp, ms: i64) {
    mcp.session
        .last_seen
        .store(crate::store::now_ms() - ms, Ordering::Relaxed);
}

#[tokio::test]
async fn an_http_sessions_follower_stops_once_its_client_is_idle() {
    let (mcp, events) = handler(false);
    mcp.arrive();
    let (task, told) = follow(&mcp, Arc::new(AtomicBool::new(false)));
    until("three resolutions told", || told.lock().len() == 3).await;
    // a client seen recently: the follower keeps waiting for more
    let calls = events.calls.load(Ordering::SeqCst);
    until("more waits for events", || {
        events.calls.load(Ordering::SeqCst) > calls + 3
    })
    .await;
    assert!(!task.is_finished(), "the follower of a live session ended");
    age_session(&mcp, FOLLOW_IDLE_MS - 60_000);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !task.is_finished(),
        "the follower ended before the idle time"
    );
    age_session(&mcp, FOLLOW_IDLE_MS + 1);
    let end = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("an idle session's follower kept following")
        .unwrap();
    assert_eq!(end, FollowEnd::Idle);
    assert_eq!(*told.lock(), vec!["op-1", "op-2", "op-3"]);
}

#[tokio::test]
async fn a_stdio_sessions_follower_lasts_as_long_as_its_pipe() {
    let (mcp, events) = handler(true);
    // never asked anything: a stdio session is never idle
    age_session(&mcp, FOLLOW_IDLE_MS * 10);
    let closed = Arc::new(AtomicBool::new(false));
    let (task, told) = follow(&mcp, closed.clone());
    until("three resolutions told", || told.lock().len() == 3).await;
    let calls = events.calls.load(Ordering::SeqCst);
    until("more waits for events", || {
        events.calls.load(Ordering::SeqCst) > calls + 3
    })
    .await;
    assert!(
        !task.is_finished(),
        "a stdio follower ended while its pipe was open"
    );
    closed.store(true, Ordering::SeqCst);
    let end = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the follower outlived its transport")
        .unwrap();
    assert_eq!(end, FollowEnd::Closed);
}

#[tokio::test]
async fn a_follower_that_cannot_reach_its_client_ends() {
    let (mcp, _) = handler(false);
    mcp.arrive();
    let this = mcp.clone();
    let end = tokio::time::timeout(
        Duration::from_secs(5),
        this.follow_resolutions(&auth(), 0, || false, |_, _| async { false }),
    )
    .await
    .expect("a follower kept going after its client was gone");
    assert_eq!(end, FollowEnd::Unreachable);
}
