//! Wake-ups from a PostgreSQL control plane (SPEC §19, §20): one
//! connection that `LISTEN`s on `opkernel_events` (each new event row
//! notifies its run id, migration 0005) and on the cluster's hand-off
//! hints (`opkernel_nodes`), and hands each (channel, payload) to the
//! kernel. A hint only: waiters also re-read on their own timer, and after
//! every (re)connect everyone is woken once (`("", "")`), so a notification
//! lost while the connection was down delays a reader and never loses an
//! event.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::AsyncMessage;

/// Called with the channel and payload of each notification (an event's
/// run id, a hand-off hint); `("", "")` wakes everyone.
pub type OnEvent = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// The channel the events' trigger notifies.
pub const CHANNEL: &str = "opkernel_events";

/// Longest wait between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Listens until `stop` is pulled, reconnecting with backoff.
pub async fn listen(url: String, on_event: OnEvent, mut stop: crate::base::sync::Stop) {
    // built once: each reconnect tries the host that answered last first
    let hosts = match super::pgpool::hosts(&url, |_| {}) {
        Ok(hosts) => hosts,
        Err(e) => {
            tracing::warn!(%e, "store notifications unavailable; readers poll");
            return;
        }
    };
    let mut backoff = Duration::from_millis(100);
    loop {
        let ended = tokio::select! {
            ended = session(&hosts, &on_event) => ended,
            () = stop.stopped() => return,
        };
        match ended {
            Ok(()) => backoff = Duration::from_millis(100),
            Err(e) => tracing::warn!(%e, "store notifications unavailable; readers poll meanwhile"),
        }
        // whatever was missed while down: everyone re-reads
        on_event("", "");
        if !stop.nap(backoff).await {
            return;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One connection's life: LISTEN, then every notification until it drops.
async fn session(hosts: &super::pghosts::Hosts, on_event: &OnEvent) -> Result<(), String> {
    let (client, mut connection) = hosts.open().await.map_err(|e| e.to_string())?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    let heard = (n.channel().to_owned(), n.payload().to_owned());
                    if tx.send(heard).is_err() {
                        return Ok(());
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            }
        }
    });
    let hints = crate::store::hints::CHANNEL;
    client
        .batch_execute(&format!("LISTEN {CHANNEL}; LISTEN {hints}"))
        .await
        .map_err(|e| e.to_string())?;
    on_event("", "");
    while let Some((channel, payload)) = rx.recv().await {
        on_event(&channel, &payload);
    }
    drop(client);
    driver.await.unwrap_or(Ok(())).map_err(|e| e.to_string())
}
