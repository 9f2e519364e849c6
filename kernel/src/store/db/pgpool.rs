//! A PostgreSQL control plane's pool and schema (SPEC §19): the URL from
//! `OPKERNEL_STORE`, a `deadpool-postgres` pool, and the numbered
//! migrations in PostgreSQL's dialect, applied under an advisory lock so
//! kernels starting together migrate once. A schema written by a newer
//! kernel is refused before anything is changed, as on SQLite.

use super::pghosts::Hosts;
use super::pgtls::PgTls;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};

use super::postgres::pg_error;
use crate::store::{StoreError, StoreResult};

/// Any key for the advisory lock that serializes migrations.
const MIGRATION_LOCK: i64 = 0x6f70_6b65_726e;

/// How long a connection may take to open.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a transaction waits for a pooled connection to be free: longer
/// than an open's bound, as a full pool is load (a burst of hundreds of
/// transactions on one run tree queue behind its lock), not an outage (a
/// server that is gone fails the opens and the statements themselves).
const SLOT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);
/// Server-side bounds of every session: a transaction left idle (its
/// client gone without a word) or a statement stuck longer than this ends,
/// releasing its locks, instead of holding a run tree for hours.
const SESSION_OPTIONS: &str =
    "-c idle_in_transaction_session_timeout=30000 -c statement_timeout=60000";

/// A pool of connections to `url` (`postgres://user@host:port/db`), each
/// bounded as above; waiting for a free one or a new one is bounded too
/// (past it: `Unavailable`).
pub fn pool(url: &str, size: usize) -> StoreResult<Pool> {
    // a multi-host URL (a replicated store, SPEC §31) tries its hosts one
    // at a time, each bounded: the first may be the primary just lost
    let hosts = hosts(url, |config| {
        config.options(SESSION_OPTIONS);
    })?;
    let open_bound = hosts.open_bound();
    let manager = Manager::from_connect(
        hosts.config().clone(),
        super::pghosts::Opener(std::sync::Arc::new(hosts)),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(SLOT_TIMEOUT))
        .create_timeout(Some(open_bound))
        .build()
        .map_err(|e| StoreError::database(super::Dialect::Postgres, e))
}

/// The hosts of `url`, each with [`config`]'s settings and `more` of the
/// caller's (a session's options, its application name).
pub fn hosts(url: &str, more: impl Fn(&mut tokio_postgres::Config)) -> StoreResult<Hosts> {
    Hosts::new(url, CONNECT_TIMEOUT, |one| {
        let (mut c, tls) = config(one)?;
        more(&mut c);
        Ok((c, tls))
    })
}

/// How long sent data may go unacknowledged before the connection is
/// given up (`TCP_USER_TIMEOUT`): a statement sent into a cut network
/// fails after this instead of waiting out TCP's retransmissions (minutes),
/// so a node's lease renewal is retried on a fresh connection as soon as
/// the network heals.
const UNACKED_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(4);

/// A connection's settings from `url`: opening is bounded, unacknowledged
/// data is bounded, and a dead peer of an idle connection is noticed by
/// TCP keepalives (within 5 + 3 × 2 s). With it, the connector of the
/// URL's `sslmode` and `sslrootcert` (see [`super::pgtls`]).
pub fn config(url: &str) -> StoreResult<(tokio_postgres::Config, PgTls)> {
    let refused = |e: String| StoreError::database(super::Dialect::Postgres, e);
    let split = super::pgtls::split(url).map_err(refused)?;
    let tls = super::pgtls::connector(&split).map_err(refused)?;
    let mut config: tokio_postgres::Config = split.url.parse().map_err(|e| {
        StoreError::database(
            super::Dialect::Postgres,
            format!("OPKERNEL_STORE is not a PostgreSQL URL: {e}"),
        )
    })?;
    // what was read is what was meant: no URL quirk turns `require` into
    // an unchecked `prefer`
    let read = format!("{:?}", config.get_ssl_mode()).to_lowercase();
    if read != split.mode {
        return Err(refused(format!(
            "OPKERNEL_STORE: sslmode read as {read}, meant {}: check the URL's query",
            split.mode
        )));
    }
    config
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_user_timeout(UNACKED_TIMEOUT)
        .keepalives(true)
        .keepalives_idle(std::time::Duration::from_secs(5))
        .keepalives_interval(std::time::Duration::from_secs(2))
        .keepalives_retries(3);
    Ok((config, tls))
}

/// A connection from the pool; an unreachable server is `Unavailable`.
pub async fn connection(pool: &Pool) -> StoreResult<Object> {
    pool.get().await.map_err(|e| match e {
        deadpool_postgres::PoolError::Backend(e) => pg_error(e),
        other => StoreError::Unavailable(other.to_string()),
    })
}

/// Applies the migrations this kernel knows and the database lacks, each
/// in its own transaction under the migration lock; refuses a schema newer
/// than it knows. Returns the schema version.
pub async fn migrate(client: &Object) -> StoreResult<i64> {
    // the version's table and row are made under the migration lock too:
    // two kernels starting on an empty database make one of each
    let made = client
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({MIGRATION_LOCK}); \
             CREATE TABLE IF NOT EXISTS opkernel_schema (version BIGINT NOT NULL); \
             INSERT INTO opkernel_schema (version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM opkernel_schema); \
             COMMIT"
        ))
        .await;
    if let Err(e) = made {
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(pg_error(e));
    }
    let known = super::migrations::known();
    loop {
        let mut done = true;
        client.batch_execute("BEGIN").await.map_err(pg_error)?;
        let step = async {
            client
                .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                .await
                .map_err(pg_error)?;
            let found: i64 = client
                .query_one("SELECT version FROM opkernel_schema", &[])
                .await
                .map_err(pg_error)?
                .get(0);
            if found > known {
                return Err(StoreError::NewerSchema { found, known });
            }
            let next = super::migrations::MIGRATIONS
                .iter()
                .find(|m| m.version == found + 1);
            if let Some(m) = next {
                client.batch_execute(m.postgres).await.map_err(pg_error)?;
                client
                    .execute("UPDATE opkernel_schema SET version = $1", &[&m.version])
                    .await
                    .map_err(pg_error)?;
                done = false;
            }
            Ok(found)
        }
        .await;
        match step {
            Ok(found) => {
                client.batch_execute("COMMIT").await.map_err(pg_error)?;
                if done {
                    return Ok(found);
                }
            }
            Err(e) => {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(e);
            }
        }
    }
}

/// Runs `f` in one transaction on a pooled connection, on the blocking
/// pool: READ COMMITTED for writes (a run tree's scripts serialize on its
/// root's advisory lock), REPEATABLE READ READ ONLY for reads (one snapshot, as
/// SQLite's read transaction). Commits on `Ok`, rolls back on `Err`.
pub async fn run<T, F>(pool: &Pool, read_only: bool, f: F) -> StoreResult<T>
where
    T: Send + 'static,
    F: FnOnce(&mut dyn super::Tx) -> StoreResult<T> + Send + 'static,
{
    let client = connection(pool).await?;
    let handle = tokio::runtime::Handle::current();
    let (client, done) = tokio::task::spawn_blocking(move || {
        let done = transaction(&client, handle, read_only, f);
        (client, done)
    })
    .await
    .map_err(|e| StoreError::Worker(e.to_string()))?;
    match done {
        Err(StoreError::Unavailable(m)) if m.starts_with(super::postgres::READ_ONLY_SERVER) => {
            if read_only {
                // a read transaction that wrote: the statement's fault
                return Err(StoreError::database(super::Dialect::Postgres, m));
            }
            // a server that answers but takes no writes (made read-only
            // while up, SPEC §31) keeps its connection open: it leaves the
            // pool, so the next transaction opens on a host that takes them
            drop(Object::take(client));
            Err(StoreError::Unavailable(m))
        }
        done => done,
    }
}

/// `f` in a transaction on `client`: committed on `Ok`, rolled back on `Err`.
fn transaction<T, F>(
    client: &Object,
    handle: tokio::runtime::Handle,
    read_only: bool,
    f: F,
) -> StoreResult<T>
where
    F: FnOnce(&mut dyn super::Tx) -> StoreResult<T>,
{
    let mut tx = super::postgres::PgTx::begin(client, handle, read_only)?;
    match f(&mut tx) {
        Ok(value) => tx.commit().map(|()| value),
        Err(e) => {
            let _ = tx.rollback();
            Err(e)
        }
    }
}

/// Creates a new, empty database `t_<uuid>` on the server at `url` (whose
/// user may create databases) and returns its URL: for tests and drills,
/// which give each kernel a control plane of its own.
pub async fn create_test_database(url: &str) -> StoreResult<String> {
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let (config, tls) = config(url)?;
    let (client, connection) = config.connect(tls).await.map_err(pg_error)?;
    tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .map_err(pg_error)?;
    // the new database's URL keeps the query (its TLS settings)
    let (path, query) = url
        .split_once('?')
        .map_or((url, None), |(p, q)| (p, Some(q)));
    let base = path.rsplit_once('/').map_or(path, |(b, _)| b);
    Ok(match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    })
}

/// A new, empty database on the test server (`OPKERNEL_TEST_PG`), as a URL.
#[cfg(test)]
pub(crate) async fn test_database() -> String {
    let url = std::env::var("OPKERNEL_TEST_PG")
        .unwrap_or_else(|_| panic!("OPKERNEL_TEST_STORE=postgres needs OPKERNEL_TEST_PG"));
    create_test_database(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot create a test database: {e}"))
}
