//! The webhook deliverer (SPEC §23): posts the outbox's rows to
//! `OPKERNEL_WEBHOOK_URL`, signed with HMAC-SHA256 over the exact body
//! (`X-Opkernel-Signature: sha256=<hex>`), each run's rows in order. A post
//! the receiver does not take (an error, a timeout, a redirect, any status
//! but 2xx) is tried again with backoff (1 s doubling to 60 s), across
//! restarts: the row leaves the outbox only once taken, so delivery is at
//! least once and the body's `id` lets the receiver drop a repeat. Two
//! ends are recorded in the kernel's journal (`webhook.dropped`) instead: a
//! body the receiver refuses as such (400, 413, 422), and a post older than
//! [`MAX_AGE`] (the retention pass drops those, with or without a webhook).
//! It runs beside the kernel and never holds anything else up.

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::runtime::config::Webhook;
use crate::runtime::kernel::Kernel;
use futures::StreamExt;

use crate::base::sync::Stop;
use crate::store::{OutboxPost, PostOutcome};

/// Due posts taken in one round, and at most of one run: a run's turn
/// posts its rows in order; a round's turns are recorded in one commit.
const BATCH: u32 = 256;
const PER_RUN: u32 = 16;
/// Runs whose turns are under way at once (connections to the receiver).
const RUNS_AT_ONCE: usize = 16;
/// How long one post may take.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest nap while nothing is due (a new event wakes it sooner).
const IDLE: Duration = Duration::from_millis(500);
/// How long a post is tried before it is dropped (and recorded).
pub const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// The signature header's value for `body`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(e) => unreachable!("HMAC takes a key of any length: {e}"),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// One post, and what the receiver made of it.
async fn post(client: &reqwest::Client, hook: &Webhook, p: &OutboxPost) -> PostOutcome {
    let answer = client
        .post(&hook.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(
            "X-Opkernel-Signature",
            signature(&hook.secret, p.body.as_bytes()),
        )
        .header("X-Opkernel-Delivery", &p.delivery_id)
        .header("X-Opkernel-Event", &p.kind)
        .timeout(POST_TIMEOUT)
        .body(p.body.clone())
        .send()
        .await;
    let why = match answer.map(|a| a.status()) {
        Ok(s) if s.is_success() => return PostOutcome::Taken,
        Ok(s) if matches!(s.as_u16(), 400 | 413 | 422) => {
            let why = format!("the receiver refused the body: {s}");
            tracing::error!(delivery = %p.delivery_id, kind = %p.kind, %why, "webhook post dropped");
            return PostOutcome::Refused(why);
        }
        Ok(s) => format!("the receiver answered {s}"),
        // with its causes: which certificate check failed, not only that one did
        // never the URL (a Slack or PagerDuty URL is itself a credential)
        Err(e) => format!("post failed: {:#}", anyhow::Error::from(e.without_url())),
    };
    tracing::warn!(delivery = %p.delivery_id, kind = %p.kind, attempts = p.attempts + 1, %why, "webhook post not taken; tried again later");
    PostOutcome::Failed(why)
}

/// One run's turn: its due rows posted in order, each after the one before
/// was taken or refused; the first not taken ends it (the rest wait behind
/// it).
async fn turn(
    client: &reqwest::Client,
    hook: &Webhook,
    posts: Vec<OutboxPost>,
) -> Vec<(OutboxPost, PostOutcome)> {
    let mut done = Vec::with_capacity(posts.len());
    for p in posts {
        let outcome = post(client, hook, &p).await;
        let stop = matches!(outcome, PostOutcome::Failed(_));
        done.push((p, outcome));
        if stop {
            break;
        }
    }
    done
}

/// The due posts grouped by run, each run's in order.
fn by_run(due: Vec<OutboxPost>) -> Vec<Vec<OutboxPost>> {
    let mut runs: Vec<Vec<OutboxPost>> = Vec::new();
    for p in due {
        match runs.iter_mut().find(|r| r[0].run_id == p.run_id) {
            Some(run) => run.push(p),
            None => runs.push(vec![p]),
        }
    }
    runs
}

/// The deliverer's client: a redirect is not followed (a POST turned into
/// a GET would answer 2xx for a post never received); an https://
/// receiver is checked against the system's roots and the webhook's CA.
fn client(hook: &Webhook) -> anyhow::Result<reqwest::Client> {
    Ok(crate::base::tls::client_with(hook.ca.as_deref())?
        .redirect(reqwest::redirect::Policy::none())
        .build()?)
}

/// Delivers until the housekeeping stops.
pub async fn deliver(k: Arc<Kernel>, hook: Webhook, mut stop: Stop) {
    let client = match client(&hook) {
        Ok(client) => client,
        Err(e) => {
            // the settings checked the CA: only a file changed since
            tracing::error!(%e, "webhook client cannot be made; no posts are delivered");
            return;
        }
    };
    let mut journal = k.store.journal();
    loop {
        let due = match k.store.due_posts(PER_RUN, BATCH).await {
            Ok(due) => due,
            Err(e) => {
                tracing::warn!(%e, "webhook outbox unreadable; trying again");
                if !stop.nap(Duration::from_secs(1)).await {
                    return;
                }
                continue;
            }
        };
        if due.is_empty() {
            tokio::select! {
                _ = journal.changed() => {}
                awake = stop.nap(IDLE) => if !awake { return },
            }
            continue;
        }
        let turns: Vec<_> = futures::stream::iter(by_run(due))
            .map(|run| turn(&client, &hook, run))
            .buffer_unordered(RUNS_AT_ONCE)
            .collect()
            .await;
        // the round's outcomes in one commit; not recorded, the rows stay as
        // they were: posted again (the ids absorb the repeats), not at once
        if let Err(e) = k.store.record_turns(turns).await {
            tracing::warn!(%e, "webhook outcomes not recorded; posting them again in a second");
            if !stop.nap(Duration::from_secs(1)).await {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_rfc_4231_hmac_sha256() {
        // RFC 4231, test case 2
        assert_eq!(
            signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
