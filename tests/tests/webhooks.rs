#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Signed webhooks from the durable outbox (SPEC §23), against a live
//! kernel and a receiver of the test's own on loopback: every notified
//! event (approval asked and escalated, op resolutions, run state changes)
//! arrives signed, in order per run, although the receiver answers 503 for
//! its first seconds; a post cut by a kernel SIGKILL arrives again after
//! the restart under the same id (at least once, de-duplicated by id);
//! a redirect is not followed (a POST turned into a GET is no delivery);
//! `opkernel approvals --follow` prints a waiting approval and its
//! escalation as they happen.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use hmac::{Hmac, KeyInit, Mac};
use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::unique_run;
use serde_json::{json, Value};

const SECRET: &str = "a-webhook-secret-for-tests";

/// What the receiver saw, and how it answers.
#[derive(Default)]
struct Inbox {
    /// Every post taken (answered 200), in arrival order.
    taken: Vec<Value>,
    /// Posts refused with 503.
    refused: usize,
    /// Posts whose signature did not verify.
    forged: usize,
    /// Answer 503 until then.
    fail_until: Option<Instant>,
    /// Hold each post this long before answering (a kernel killed meanwhile).
    hold: Duration,
    /// Posts being held right now, by delivery id.
    holding: Vec<String>,
    /// Posts answered with a redirect, and redirects followed.
    redirected: usize,
    followed: usize,
}

type Shared = Arc<Mutex<Inbox>>;

fn verify(headers: &HeaderMap, body: &[u8]) -> bool {
    let Some(sig) = headers
        .get("x-opkernel-signature")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("sha256="))
    else {
        return false;
    };
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(body);
    hex::decode(sig).is_ok_and(|sig| mac.verify_slice(&sig).is_ok())
}

async fn receive(
    axum::extract::State(inbox): axum::extract::State<Shared>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let v: Value = serde_json::from_slice(&body).unwrap_or_default();
    let hold = {
        let mut i = inbox.lock().unwrap();
        if !verify(&headers, &body) {
            i.forged += 1;
            return StatusCode::UNAUTHORIZED;
        }
        if i.fail_until.is_some_and(|t| Instant::now() < t) {
            i.refused += 1;
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        i.holding
            .push(v["id"].as_str().unwrap_or_default().to_owned());
        i.hold
    };
    tokio::time::sleep(hold).await;
    let mut i = inbox.lock().unwrap();
    let id = v["id"].as_str().unwrap_or_default().to_owned();
    i.holding.retain(|h| *h != id);
    assert_eq!(headers["x-opkernel-delivery"].to_str().unwrap(), id);
    i.taken.push(v);
    StatusCode::OK
}

/// A page a redirected client would land on: counted as a false delivery.
async fn page(axum::extract::State(inbox): axum::extract::State<Shared>) -> StatusCode {
    inbox.lock().unwrap().followed += 1;
    StatusCode::OK
}

/// A URL that moved: 302 to the receiver.
async fn moved(
    axum::extract::State(inbox): axum::extract::State<Shared>,
) -> axum::response::Response {
    inbox.lock().unwrap().redirected += 1;
    axum::response::Redirect::to("/hook").into_response()
}

async fn receiver(inbox: Shared) -> String {
    let app = axum::Router::new()
        .route("/hook", post(receive).get(page))
        .route("/moved", post(moved))
        .with_state(inbox);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// Waits until `pred` holds over the inbox (at most 60 s).
async fn until(inbox: &Shared, what: &str, pred: impl Fn(&Inbox) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pred(&inbox.lock().unwrap()) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The kinds taken for `run`, first arrival of each id, in arrival order.
fn kinds_of(inbox: &Inbox, run: &str) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    inbox
        .taken
        .iter()
        .filter(|v| v["run_id"] == run && seen.insert(v["id"].clone()))
        .map(|v| v["type"].as_str().unwrap().to_owned())
        .collect()
}

async fn kernel(url: &str) -> KernelProcess {
    let env = [
        ("OPKERNEL_WEBHOOK_URL", url),
        ("OPKERNEL_WEBHOOK_SECRET", SECRET),
    ];
    KernelProcess::start(&kernel_binary().unwrap(), "webhooks", &env)
        .await
        .unwrap()
}

#[tokio::test]
async fn events_arrive_signed_in_order_through_a_receiver_outage() {
    let inbox = Shared::default();
    inbox.lock().unwrap().fail_until = Some(Instant::now() + Duration::from_secs(4));
    let url = receiver(inbox.clone()).await;
    let k = kernel(&url).await;
    let run = unique_run("hook");
    let envelope = json!({"approval": {"all": true, "timeout_sec": 1}});
    let created = k
        .client
        .post("/v1/runs", &json!({"run_id": run, "envelope": envelope}))
        .await
        .unwrap();
    assert_eq!(created["run_id"], run.as_str(), "{created}");
    let op = k.start_bg(&run, &["sh", "-c", "exit 5"], 60).await.unwrap();
    k.wait_state(&op, Duration::from_secs(20), |s| {
        s["approval"]["escalated_at"].is_string()
    })
    .await
    .unwrap();
    k.client
        .post(&format!("/v1/operations/{op}/approve"), &json!({}))
        .await
        .unwrap();
    k.wait_terminal(&op, Duration::from_secs(60)).await.unwrap();
    k.client
        .post(&format!("/v1/runs/{run}/pause"), &json!({}))
        .await
        .unwrap();
    k.client
        .post(&format!("/v1/runs/{run}/resume"), &json!({}))
        .await
        .unwrap();
    let want = [
        "approval.requested",
        "approval.escalated",
        "tool.completed",
        "run.paused",
        "run.resumed",
    ];
    until(&inbox, "every event", |i| {
        kinds_of(i, &run).len() >= want.len()
    })
    .await;
    {
        let i = inbox.lock().unwrap();
        assert!(i.refused > 0, "the receiver's outage was met");
        assert_eq!(i.forged, 0);
        assert_eq!(kinds_of(&i, &run), want);
        let posts: Vec<&Value> = i.taken.iter().filter(|v| v["run_id"] == run).collect();
        // in order per run: each post's journal seq after the one before
        let seqs: Vec<i64> = posts.iter().map(|v| v["seq"].as_i64().unwrap()).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        let done = posts
            .iter()
            .find(|v| v["type"] == "tool.completed")
            .unwrap();
        assert_eq!(done["operation_id"], op.as_str());
        assert_eq!(done["data"]["exit_code"], 5, "{done}");
    }
    // the outbox is empty once all was taken
    let metrics = String::from_utf8(k.client.get_bytes("/metrics").await.unwrap()).unwrap();
    assert!(
        metrics.contains("opkernel_webhook_posts_pending 0"),
        "{metrics}"
    );
    k.remove_containers();
}

#[tokio::test]
async fn a_post_cut_by_a_kernel_kill_arrives_again_under_its_id() {
    let inbox = Shared::default();
    let url = receiver(inbox.clone()).await;
    let mut k = kernel(&url).await;
    let run = unique_run("hookkill");
    inbox.lock().unwrap().hold = Duration::from_secs(3);
    let op = k.start_bg(&run, &["sh", "-c", "exit 7"], 60).await.unwrap();
    until(&inbox, "a post being held", |i| !i.holding.is_empty()).await;
    let held = inbox.lock().unwrap().holding[0].clone();
    k.sigkill();
    inbox.lock().unwrap().hold = Duration::ZERO;
    k.restart().await.unwrap();
    // the receiver never answered the cut post (its connection died with
    // the kernel): the restarted kernel posts it again, under its id
    until(&inbox, "the cut post again", |i| {
        i.taken.iter().any(|v| v["id"] == held.as_str())
    })
    .await;
    let i = inbox.lock().unwrap();
    let mut by_id: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for v in &i.taken {
        by_id.entry(v["id"].to_string()).or_default().push(v);
    }
    // a repeat is the same post: the receiver can drop it by its id
    assert!(by_id
        .values()
        .all(|copies| copies.windows(2).all(|w| w[0] == w[1])));
    let resolved: HashMap<_, _> = i
        .taken
        .iter()
        .filter(|v| v["type"] == "tool.completed")
        .map(|v| {
            (
                v["operation_id"].as_str().unwrap(),
                v["data"]["exit_code"].clone(),
            )
        })
        .collect();
    assert_eq!(resolved.get(op.as_str()), Some(&json!(7)));
    drop(i);
    k.remove_containers();
}

#[tokio::test]
async fn approvals_follow_prints_a_wait_and_its_escalation() {
    let k = KernelProcess::start(&kernel_binary().unwrap(), "follow", &[])
        .await
        .unwrap();
    let run = unique_run("follow");
    let envelope = json!({"approval": {"all": true, "timeout_sec": 2}});
    k.client
        .post("/v1/runs", &json!({"run_id": run, "envelope": envelope}))
        .await
        .unwrap();
    let mut follow = tokio::process::Command::new(kernel_binary().unwrap())
        .args(["approvals", "--follow", "--json"])
        .env("OPKERNEL_URL", k.client.base())
        .env("OPKERNEL_TOKEN", k.client.token())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let op = k.start_bg(&run, &["true"], 60).await.unwrap();
    let stdout = follow.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let mut events = Vec::new();
    let read = async {
        while events.len() < 2 {
            let line = lines.next_line().await.unwrap().unwrap();
            let v: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["operation_id"], op.as_str(), "{v}");
            events.push(v["event"].as_str().unwrap().to_owned());
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("follow printed the wait and the escalation");
    assert_eq!(events, ["approval.requested", "approval.escalated"]);
    follow.kill().await.unwrap();
    k.client
        .post(&format!("/v1/runs/{run}/cancel"), &json!({}))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_redirect_is_no_delivery() {
    let inbox = Shared::default();
    let url = receiver(inbox.clone()).await;
    let k = kernel(&url.replace("/hook", "/moved")).await;
    let run = unique_run("hookmoved");
    let op = k.start_bg(&run, &["true"], 60).await.unwrap();
    k.wait_terminal(&op, Duration::from_secs(60)).await.unwrap();
    until(&inbox, "a redirected post and its retry", |i| {
        i.redirected >= 2
    })
    .await;
    {
        let i = inbox.lock().unwrap();
        assert_eq!((i.followed, i.taken.len()), (0, 0));
    }
    let metrics = String::from_utf8(k.client.get_bytes("/metrics").await.unwrap()).unwrap();
    assert!(
        metrics.contains("opkernel_webhook_posts_pending 1"),
        "{metrics}"
    );
    k.remove_containers();
}
