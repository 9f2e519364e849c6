//! One kernel per PostgreSQL control plane (SPEC §19): what the home's
//! `kernel.lock` is on one host, a session advisory lock is on the server.
//! `opkernel serve` takes it on a connection of its own before recovering
//! anything and holds it for its whole life, so a second kernel pointed at
//! the same database is refused instead of observing, claiming and settling
//! the same ops beside the first.
//!
//! A session lock ends with its session: when its holder dies (even by
//! SIGKILL) the server frees it as soon as it sees the socket close, which
//! is why a start retries for [`START_PATIENCE`] before refusing. When the
//! connection drops while the kernel lives (a server restart, a network
//! cut) the lock is taken again on reconnect; if another kernel took it
//! meanwhile, this one is told ([`Owner::lost`]) and stops serving.

use std::time::Duration;

use tokio_postgres::Client;

use super::pghosts::Hosts;
use super::postgres::pg_error;
use crate::store::{StoreError, StoreResult};

/// How long a start waits for the lock a previous holder's session still
/// has: past the server's own limit on an idle owner session.
pub const START_PATIENCE: Duration = Duration::from_secs(15);

/// The server ends an owner session idle this long (its holder checks it
/// every [`PING_EVERY`]): the lock of a kernel whose host died or was cut
/// off goes within seconds, not when TCP gives up hours later.
const IDLE_SESSION_MS: u64 = 8_000;

/// How often the holder checks its session, and how long a check may take.
const PING_EVERY: Duration = Duration::from_secs(2);
const PING_TIMEOUT: Duration = Duration::from_secs(4);

/// Longest wait between two reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The lock's key for `name` (one per kernel identity: today one per
/// database), a stable 64-bit hash.
pub fn lock_key(name: &str) -> i64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("opkernel-owner:{name}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(bytes)
}

/// The locks an owner holds in its session: its own key, exclusive, and,
/// for a cluster node, the single kernel's key shared (so a single kernel
/// and nodes never run on one database together, while nodes do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys {
    /// Held exclusively.
    pub own: i64,
    /// Held shared, beside it.
    pub shared: Option<i64>,
}

impl From<i64> for Keys {
    fn from(own: i64) -> Keys {
        Keys { own, shared: None }
    }
}

/// The held lock: dropping it ends the session, which frees the lock.
pub struct Owner {
    lost: tokio::sync::watch::Receiver<Option<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Owner {
    /// Takes the lock `key` on the database at `url`, waiting up to
    /// `patience` (a start: [`START_PATIENCE`]) for a previous holder's
    /// session to end; refuses with [`StoreError::Owned`] if it does not.
    pub async fn take(url: &str, key: impl Into<Keys>, patience: Duration) -> StoreResult<Owner> {
        let key = key.into();
        let deadline = tokio::time::Instant::now() + patience;
        // built once: each reconnect tries the host that answered last first
        let hosts = std::sync::Arc::new(super::pgpool::hosts(url, |config| {
            config
                .application_name("opkernel owner")
                .options(format!("-c idle_session_timeout={IDLE_SESSION_MS}"));
        })?);
        let client = loop {
            let client = session(&hosts).await?;
            if try_lock(&client, key).await? {
                break client;
            }
            drop(client);
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Owned);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let (tell, lost) = tokio::sync::watch::channel(None);
        let task = tokio::spawn(hold(hosts, key, client, tell));
        Ok(Owner { lost, task })
    }

    /// Resolves, with the reason, once another kernel holds the lock.
    pub async fn lost(&self) -> String {
        let mut lost = self.lost.clone();
        let reason = match lost.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone(),
            Err(_) => None,
        };
        match reason {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }
}

/// A connection of its own, driven by a task; it ends when the client is
/// dropped or the server goes.
async fn session(hosts: &Hosts) -> StoreResult<Client> {
    let (client, connection) = hosts.open().await?;
    tokio::spawn(connection);
    Ok(client)
}

async fn try_lock(client: &Client, key: Keys) -> StoreResult<bool> {
    // a refusal drops the session, and with it a lock taken half
    let row = match key.shared {
        None => {
            client
                .query_one("SELECT pg_try_advisory_lock($1)", &[&key.own])
                .await
        }
        Some(shared) => {
            client
                .query_one(
                    "SELECT pg_try_advisory_lock_shared($2) AND pg_try_advisory_lock($1)",
                    &[&key.own, &shared],
                )
                .await
        }
    }
    .map_err(pg_error)?;
    Ok(row.get(0))
}

/// Holds the lock: checks the session every [`PING_EVERY`]; when it is
/// gone (or a check hangs), reconnects with backoff and takes the lock
/// again. Refused for longer than [`START_PATIENCE`] (past the server's end
/// of this kernel's own dropped session), another kernel holds it: lost.
async fn hold(
    hosts: std::sync::Arc<Hosts>,
    key: Keys,
    mut client: Client,
    tell: tokio::sync::watch::Sender<Option<String>>,
) {
    loop {
        while let Ok(Ok(_)) =
            tokio::time::timeout(PING_TIMEOUT, client.simple_query("SELECT 1")).await
        {
            tokio::time::sleep(PING_EVERY).await;
        }
        tracing::warn!("the store's ownership session dropped; taking the lock again");
        match retake(&hosts, key).await {
            Some(again) => client = again,
            None => {
                let reason = "another opkernel serve took this PostgreSQL control plane while this kernel's connection was down";
                tell.send_replace(Some(reason.to_owned()));
                return;
            }
        }
        tracing::info!("the store's ownership lock is held again");
    }
}

/// Reconnects with backoff until the lock is taken (`Some`) or has been
/// refused for [`START_PATIENCE`] (`None`). An unreachable server is waited
/// for without limit: nobody else can take the lock meanwhile either.
async fn retake(hosts: &Hosts, key: Keys) -> Option<Client> {
    let mut backoff = Duration::from_millis(100);
    let mut refused_since = None;
    loop {
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
        let Ok(client) = session(hosts).await else {
            continue;
        };
        match try_lock(&client, key).await {
            Ok(true) => return Some(client),
            Ok(false) => {
                let since = *refused_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= START_PATIENCE {
                    return None;
                }
                backoff = Duration::from_millis(500);
            }
            Err(_) => {}
        }
    }
}
