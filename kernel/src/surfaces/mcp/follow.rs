//! How a session hears of its run's background ops resolving: a legacy
//! session's follower (log messages, `resources/updated` for subscribed
//! ops) and the 2026 revision's `listen`.

use std::time::Duration;

use rmcp::model::ResourceUpdatedNotificationParam;
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::SubscriptionContext;
use rmcp::{ErrorData as McpError, Peer, RoleServer};
use serde_json::{json, Value};

use super::{op_of_uri, op_uri, OpkernelMcp, RunAuth};
use crate::surfaces::views::{EventsPage, OpView};

/// How long an HTTP session's follower outlives its client's last request.
const FOLLOW_IDLE_MS: i64 = 10 * 60 * 1000;

/// Why a session's follower ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FollowEnd {
    /// The session's transport closed.
    Closed,
    /// An HTTP session's client asked nothing for [`FOLLOW_IDLE_MS`].
    Idle,
    /// A message could not be sent to the client.
    Unreachable,
}

impl OpkernelMcp {
    /// Follows the run's trace and tells a legacy session when one of its
    /// background ops resolves: a log message (older revisions' means) and
    /// `resources/updated` for a subscribed op. Ends with the session, or
    /// once an HTTP session is idle (its next subscription follows again).
    pub(super) fn follow(&self, auth: RunAuth, peer: Peer<RoleServer>) {
        if self
            .session
            .following
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            if let Some(after) = this.last_seq(&auth).await {
                let closed = {
                    let peer = peer.clone();
                    move || peer.is_transport_closed()
                };
                let tell = |op: String, data: Value| {
                    let (this, peer) = (this.clone(), peer.clone());
                    async move {
                        let uri = op_uri(&op);
                        #[allow(deprecated)]
                        let logged = peer
                            .notify_logging_message(LoggingMessageNotificationParam::new(
                                LoggingLevel::Info,
                                json!({"operation_id": op, "uri": uri, "resolved": data}),
                            ))
                            .await;
                        if logged.is_err() {
                            return false;
                        }
                        if this.session.subscribed.lock().contains(&uri) {
                            let _ = peer
                                .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                                .await;
                        }
                        true
                    }
                };
                let end = this.follow_resolutions(&auth, after, closed, tell).await;
                tracing::debug!(run = %auth.run, ?end, "MCP session follower ended");
            }
            // not following (any more): the session's next subscription tries again
            this.session
                .following
                .store(false, std::sync::atomic::Ordering::SeqCst);
        });
    }

    /// The follower's loop: tells `tell` of each background op of the run
    /// resolved after `after`, until the transport is `closed`, the session
    /// is idle, or a message cannot be sent (`tell` says false).
    async fn follow_resolutions<F, Told>(
        &self,
        auth: &RunAuth,
        mut after: i64,
        closed: impl Fn() -> bool,
        mut tell: F,
    ) -> FollowEnd
    where
        F: FnMut(String, Value) -> Told,
        Told: std::future::Future<Output = bool>,
    {
        loop {
            if closed() {
                return FollowEnd::Closed;
            }
            if self.idle() {
                return FollowEnd::Idle;
            }
            let Some((resolved, next)) = self.resolutions(auth, after, 20).await else {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            };
            after = next;
            for (op, data) in resolved {
                if !tell(op, data).await {
                    return FollowEnd::Unreachable;
                }
            }
        }
    }

    /// An HTTP session whose client has asked nothing for a while: its
    /// follower stops, so the session can expire (a stdio session lasts as
    /// long as its pipe).
    fn idle(&self) -> bool {
        let seen = self
            .session
            .last_seen
            .load(std::sync::atomic::Ordering::Relaxed);
        self.fixed_auth.is_none() && crate::store::now_ms() - seen > FOLLOW_IDLE_MS
    }

    /// An answer of the API read as its typed view (`None` on any failure).
    async fn get_view<T: serde::de::DeserializeOwned>(
        &self,
        auth: &RunAuth,
        path: &str,
    ) -> Option<T> {
        match self
            .backend
            .call(auth.caller(), reqwest::Method::GET, path, None)
            .await
        {
            Ok((200, body)) => serde_json::from_value(body).ok(),
            _ => None,
        }
    }

    /// The run's latest event sequence number now.
    async fn last_seq(&self, auth: &RunAuth) -> Option<i64> {
        let path = format!("/v1/runs/{}/events?after={}&limit=1", auth.run, i64::MAX);
        let page: EventsPage = self.get_view(auth, &path).await?;
        Some(page.last_seq)
    }

    /// Background ops of the run resolved after `after` (waiting up to
    /// `wait` seconds for one), and the sequence number to go on from.
    async fn resolutions(
        &self,
        auth: &RunAuth,
        after: i64,
        wait: u64,
    ) -> Option<(Vec<(String, Value)>, i64)> {
        let path = format!("/v1/runs/{}/events?after={after}&wait={wait}", auth.run);
        let page: EventsPage = self.get_view(auth, &path).await?;
        let resolved = page
            .events
            .into_iter()
            .filter(|e| e.kind.resolution_background() == Some(true))
            .filter_map(|e| Some((e.operation_id?, e.kind.data().ok()?)))
            .collect();
        Some((resolved, page.next_after))
    }

    /// The 2026 revision's means: `resources/updated` for each listened op
    /// of the run that resolves, while the client listens.
    pub(super) async fn listen_resolutions(
        &self,
        context: SubscriptionContext,
    ) -> Result<(), McpError> {
        let auth = self.auth(context.request_context())?;
        let Some(mut after) = self.last_seq(&auth).await else {
            return Err(McpError::internal_error(
                "cannot read the run's events",
                None,
            ));
        };
        // an op that resolved between the acknowledgment and the cursor
        // above is announced now: a listener misses nothing
        for uri in context.requested().resource_subscriptions.iter().flatten() {
            let Some(id) = op_of_uri(uri) else { continue };
            let path = format!("/v1/operations/{id}");
            let op: Option<OpView> = self.get_view(&auth, &path).await;
            if op.is_some_and(|op| !op.is_live()) {
                let _ = context.sink().notify_resource_updated(uri.clone()).await;
            }
        }
        loop {
            tokio::select! {
                _ = context.cancelled() => return Ok(()),
                step = self.resolutions(&auth, after, 20) => {
                    let Some((resolved, next)) = step else {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    };
                    after = next;
                    for (op, _) in resolved {
                        // the sink drops what the client did not listen for
                        let _ = context
                            .sink()
                            .notify_resource_updated(op_uri(&op))
                            .await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "follow_tests.rs"]
mod tests;
