//! The control plane: one database (SQLite, `<home>/kernel.db` in WAL
//! mode, or PostgreSQL shared by a cluster), the single authority on every
//! op's lifecycle, its reports, notes and runs.
//! Every call runs on the blocking pool, never on the async workers.

mod admission;
mod admit;
mod approvals;
mod bindings;
mod change;
mod claims;
pub mod db;
mod declared;
mod fire;
pub mod hints;
mod journal;
mod lease;
mod levels;
mod location;
mod netpolicy;
mod nodes;
#[cfg(test)]
mod nodes_tests;
mod ops;
mod outbox;
mod reports;
mod retention;
mod runs;
mod schedules;
mod settle;
mod shared;
mod snapshots;
#[cfg(test)]
mod statements_tests;
mod tree;

use std::path::Path;
use std::sync::Arc;

use rusqlite::Connection;

use crate::base::sync::Lock;
use db::Tx;

pub use admission::Refusal;
pub use approvals::{TimeoutAction, BY_KILL, BY_OPERATOR, BY_TIMEOUT};
pub use bindings::{Binding, Bound};
pub use declared::{Declared, DeclaredFile, Midway, Reconciled};
pub use journal::{Event, ModelUsage, UsageRecorded};
pub use location::StoreLocation;
pub use netpolicy::NetChanged;
pub use nodes::{Judge, NodeRow, Swept};
pub use ops::{Admission, ApprovalHold, AttemptStart, NewOp, Op, Settlement, StartRequest};
pub use outbox::{OutboxPost, PostOutcome};
pub use reports::{Report, ReportItem, RunningItem, MAX_PENDING_NOTES};
pub use retention::{PrunableOp, PurgedTree};
pub use runs::{CreatedRun, NewRun, RunChange, RunRecord};
pub use schedules::{Fire, NewSchedule, Schedule, StartupReport, MAX_LAST_TAIL};
pub use snapshots::{Snapshot, SnapshotRecorded};

/// Why a control-plane call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed a statement (on PostgreSQL the
    /// message starts with the SQLSTATE).
    #[error("{dialect} error: {message}")]
    Database {
        /// Which database answered.
        dialect: db::Dialect,
        /// What it said.
        message: String,
    },
    /// Stored data breaks the control plane's own rules (a value that does
    /// not parse, a row missing or changed inside its own transaction).
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The blocking task running the call panicked or was cancelled.
    #[error("database worker failed: {0}")]
    Worker(String),
    /// The database's schema version is past the last migration this
    /// kernel knows: it is refused and nothing is written.
    #[error(
        "the control plane's schema version {found} was written by a newer opkernel (this one knows up to {known}); \
         run that newer opkernel, or point this one at another home: nothing was changed"
    )]
    NewerSchema {
        /// The database's schema version.
        found: i64,
        /// The newest version this kernel knows.
        known: i64,
    },
    /// The database cannot be reached (SPEC §19: `503 store_unavailable`).
    #[error("the control plane's database is unreachable: {0}")]
    Unavailable(String),
    /// Another kernel holds this PostgreSQL control plane (its ownership
    /// lock stayed taken through the start's patience).
    #[error(
        "another opkernel serve holds this PostgreSQL control plane's ownership lock (a single \
         kernel owns its database alone; a cluster node's name is held by one kernel at a time); \
         stop it first, or point this kernel at another database or node name"
    )]
    Owned,
}

impl StoreError {
    /// A database's refusal or failure, in its words.
    pub fn database(dialect: db::Dialect, message: impl std::fmt::Display) -> StoreError {
        StoreError::Database {
            dialect,
            message: message.to_string(),
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        StoreError::database(db::Dialect::Sqlite, e)
    }
}

/// A control-plane call's result.
pub type StoreResult<T> = Result<T, StoreError>;

/// What a store is opened for, fixed for its life: what each transaction
/// notes besides its own work.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// Every notified event also puts its post in the webhook outbox, in
    /// the event's own transaction (the kernel has a webhook URL).
    pub outbox: bool,
    /// The cluster node this kernel runs as: admissions place their run
    /// tree on it, and its recovery, watchdog and hand-off see only the ops
    /// placed on it. `None`: a single kernel.
    pub node: Option<String>,
}

#[cfg(feature = "postgres")]
/// Connections a PostgreSQL store keeps (each transaction holds one, on
/// the blocking pool, for its duration).
const POSTGRES_POOL: usize = 16;

/// The control plane: its database (SQLite or PostgreSQL) and the
/// journal's wake-up channel. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    /// Changes when an event may have been appended: on SQLite the latest
    /// event's sequence number (set by an update hook before the writer's
    /// commit, which readers wait for on the connection's lock; it may name
    /// an event whose transaction then rolled back: readers only re-read);
    /// on PostgreSQL a counter bumped by each notification.
    journal: Arc<tokio::sync::watch::Sender<i64>>,
    /// This process's metrics: the facts of committed transactions and
    /// their durations are counted here.
    metrics: Arc<crate::base::metrics::Metrics>,
    /// What it was opened for.
    options: Arc<StoreOptions>,
    /// Hand-off hints heard for this node (PostgreSQL only).
    hints: Arc<hints::Hints>,
}

/// The database behind a [`Store`].
#[derive(Clone)]
enum Backend {
    /// One SQLite connection, shared and serialized, held by its writer,
    /// which commits the writes that wait for it together.
    Sqlite { writer: Arc<db::batch::Writer> },
    /// A PostgreSQL pool; the listener of its notifications stops when the
    /// last clone of the store goes (`_listening` is its switch).
    #[cfg(feature = "postgres")]
    Postgres {
        pool: deadpool_postgres::Pool,
        /// Commits the node's writes that wait for it together.
        writer: Arc<db::pgbatch::PgWriter>,
        /// A connection of its own for a cluster node's lease: a pool
        /// saturated by load never delays a renewal (opened on first use).
        lease: deadpool_postgres::Pool,
        /// Where it is (tests open it again).
        #[cfg_attr(not(test), allow(dead_code))]
        url: String,
        _listening: Arc<tokio::sync::watch::Sender<bool>>,
    },
}

impl Store {
    /// Opens (or creates) the SQLite database at `path` and applies the
    /// pending migrations; a database from a newer kernel is refused
    /// untouched.
    pub fn open(path: &Path, options: StoreOptions) -> StoreResult<Store> {
        let journal = Arc::new(tokio::sync::watch::channel(0).0);
        let conn = Arc::new(Lock::new(db::sqlite::open(path, journal.clone())?));
        let hints = hints::Hints::new(options.node.clone());
        let metrics: Arc<crate::base::metrics::Metrics> = Default::default();
        Ok(Store {
            backend: Backend::Sqlite {
                writer: db::batch::Writer::new(conn, None, metrics.clone()),
            },
            journal,
            metrics,
            options: Arc::new(options),
            hints: Arc::new(hints),
        })
    }

    /// Connects to a PostgreSQL control plane at `url` (SPEC §19): a pool,
    /// the migrations this kernel knows (a schema from a newer kernel is
    /// refused untouched), and a listener whose notifications wake journal
    /// readers (they also re-read on their own timer).
    #[cfg(feature = "postgres")]
    pub async fn connect(url: &str, options: StoreOptions) -> StoreResult<Store> {
        let pool = db::pgpool::pool(url, POSTGRES_POOL)?;
        db::pgpool::migrate(&db::pgpool::connection(&pool).await?).await?;
        let journal = Arc::new(tokio::sync::watch::channel(0).0);
        let (listening, stop) = crate::base::sync::Stop::new();
        let hook = journal.clone();
        let hints = Arc::new(hints::Hints::new(options.node.clone()));
        let heard = hints.clone();
        let on_event: db::pglisten::OnEvent = Arc::new(move |channel: &str, payload: &str| {
            if channel != hints::CHANNEL {
                hook.send_modify(|n| *n += 1);
            }
            if channel != db::pglisten::CHANNEL {
                heard.heard(payload);
            }
        });
        tokio::spawn(db::pglisten::listen(url.to_owned(), on_event, stop));
        let metrics: Arc<crate::base::metrics::Metrics> = Default::default();
        let handle = tokio::runtime::Handle::current();
        Ok(Store {
            backend: Backend::Postgres {
                writer: db::pgbatch::PgWriter::new(pool.clone(), handle, metrics.clone()),
                pool,
                lease: db::pgpool::pool(url, 1)?,
                url: url.to_owned(),
                _listening: Arc::new(listening),
            },
            journal,
            metrics,
            options: Arc::new(options),
            hints,
        })
    }

    /// Which database this store runs on.
    pub fn dialect(&self) -> db::Dialect {
        match self.backend {
            Backend::Sqlite { .. } => db::Dialect::Sqlite,
            #[cfg(feature = "postgres")]
            Backend::Postgres { .. } => db::Dialect::Postgres,
        }
    }

    /// Changes whenever an event may have been appended to any journal.
    pub fn journal(&self) -> tokio::sync::watch::Receiver<i64> {
        self.journal.subscribe()
    }

    /// Runs `f` in one write transaction on the blocking pool: SQLite's
    /// `BEGIN IMMEDIATE` (the file's one writer, every run tree
    /// serialized; writes that wait share one commit, each in a savepoint),
    /// PostgreSQL's READ COMMITTED (a tree's scripts take its lock first);
    /// answered once committed when `f` returns `Ok`, its writes rolled
    /// back on `Err`.
    async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
    {
        self.transaction_on(false, false, f).await
    }

    /// Runs `f` in one read transaction on the blocking pool: every
    /// statement of `f` reads the same snapshot.
    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
    {
        self.transaction_on(false, true, once(f)).await
    }

    /// The cluster node this kernel runs as, if any.
    pub fn node(&self) -> Option<&str> {
        self.options.node.as_deref()
    }

    /// The longest a new connection may take to open: on PostgreSQL the
    /// pool's bound (each host of the URL in turn); nothing on SQLite.
    pub fn open_bound(&self) -> std::time::Duration {
        match &self.backend {
            Backend::Sqlite { .. } => std::time::Duration::ZERO,
            #[cfg(feature = "postgres")]
            Backend::Postgres { lease, .. } => lease.timeouts().create.unwrap_or_default(),
        }
    }

    /// The same database opened again with `options` (tests: two kernels
    /// on one database). On PostgreSQL a new connection, whose listener
    /// hears the hints for the new options' node.
    #[cfg(test)]
    pub(crate) async fn with_options(&self, options: StoreOptions) -> Store {
        #[cfg(feature = "postgres")]
        if let Backend::Postgres { url, .. } = &self.backend {
            return Store::connect(url, options)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let hints = hints::Hints::new(options.node.clone());
        Store {
            options: Arc::new(options),
            hints: Arc::new(hints),
            ..self.clone()
        }
    }

    /// This process's metrics.
    pub fn metrics(&self) -> &crate::base::metrics::Metrics {
        &self.metrics
    }

    /// A read transaction of a cluster node's lease (its join): on
    /// PostgreSQL on the lease's own connection.
    async fn lease_read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
    {
        self.transaction_on(true, true, once(f)).await
    }

    /// A write transaction of a cluster node's lease: on PostgreSQL on the
    /// lease's own connection, never queued behind the pool's load.
    async fn lease_write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
    {
        self.transaction_on(true, false, once(f)).await
    }

    /// Runs `f` in one transaction, timed; the facts it notes are counted
    /// once it committed. A write on PostgreSQL's writer may run `f` again
    /// after a conflict rolled its first run back; the others run it once.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    async fn transaction_on<T, F>(&self, lease: bool, read_only: bool, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
    {
        let began = std::time::Instant::now();
        let outbox = self.options.outbox;
        let node = self.options.node.clone();
        let mut f = f;
        let noted = move |tx: &mut dyn Tx| {
            let mut noting = db::Noting::new(tx, outbox, node.clone());
            let value = f(&mut noting)?;
            Ok((value, noting.into_facts()))
        };
        let done = match &self.backend {
            Backend::Sqlite { writer } if !read_only => writer.write(noted).await,
            Backend::Sqlite { writer } => {
                let seen = writer.seen();
                self.call(move |conn| db::sqlite::transaction(conn, read_only, seen, noted))
                    .await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres { writer, .. } if !lease && !read_only => writer.write(noted).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres {
                pool, lease: own, ..
            } => {
                let done = db::pgpool::run(if lease { own } else { pool }, read_only, noted).await;
                if done.is_ok() && !read_only {
                    // the writers count their own, one per batch
                    self.metrics.committed();
                }
                done
            }
        };
        self.metrics
            .transaction(read_only, began.elapsed().as_secs_f64());
        let (value, facts) = done?;
        for fact in facts {
            match fact {
                db::Fact::Admitted => self.metrics.op_admitted(),
                db::Fact::Settled(status) => self.metrics.op_settled(status),
                db::Fact::Reported { waited_ms } => self.metrics.op_reported(waited_ms),
            }
        }
        Ok(value)
    }

    /// Runs `f` with the connection on the blocking pool.
    async fn call<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        let conn = match &self.backend {
            Backend::Sqlite { writer } => writer.conn().clone(),
            #[cfg(feature = "postgres")]
            Backend::Postgres { .. } => {
                return Err(StoreError::Worker("not an SQLite store".into()))
            }
        };
        tokio::task::spawn_blocking(move || {
            // a panic inside `f` rolled its transaction back as it unwound,
            // so the connection is usable by the next call
            f(&mut conn.lock())
        })
        .await
        .map_err(|e| StoreError::Worker(e.to_string()))?
    }
}

/// `f`, for a transaction that runs its script once (a read, a lease's
/// write): never run again.
fn once<T>(
    f: impl FnOnce(&mut dyn Tx) -> StoreResult<T>,
) -> impl FnMut(&mut dyn Tx) -> StoreResult<T> {
    let mut f = Some(f);
    move |tx| match f.take() {
        Some(f) => f(tx),
        None => Err(StoreError::Worker(
            "a script that runs once was asked again".into(),
        )),
    }
}

/// A step applied to the wall clock by the `clock-step` drill (0 otherwise).
static WALL_CLOCK_STEP_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// Wall-clock time, unix milliseconds: for records, never for measuring waits.
pub fn now_ms() -> i64 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    wall + WALL_CLOCK_STEP_MS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Steps this process's view of the wall clock, as an NTP step or an
/// operator's `date -s` would (drills only).
pub fn step_wall_clock(ms: i64) {
    WALL_CLOCK_STEP_MS.fetch_add(ms, std::sync::atomic::Ordering::Relaxed);
}

/// A store for a unit test: SQLite in a fresh file, or, with
/// `OPKERNEL_TEST_STORE=postgres`, a fresh database on the server
/// `OPKERNEL_TEST_PG` names (`scripts/test.sh` runs the store's tests on
/// both).
#[cfg(test)]
pub(crate) async fn test_store() -> Store {
    #[cfg(feature = "postgres")]
    if std::env::var("OPKERNEL_TEST_STORE").as_deref() == Ok("postgres") {
        let url = db::pgpool::test_database().await;
        return Store::connect(&url, StoreOptions::default()).await.unwrap();
    }
    sqlite_test_store()
}

/// Two stores on one fresh database, as two kernels would have: two
/// connections to one SQLite file, or two pools on one PostgreSQL database
/// (with `OPKERNEL_TEST_STORE=postgres`).
#[cfg(test)]
pub(crate) async fn test_store_pair() -> (Store, Store) {
    #[cfg(feature = "postgres")]
    if std::env::var("OPKERNEL_TEST_STORE").as_deref() == Ok("postgres") {
        let url = db::pgpool::test_database().await;
        return (
            Store::connect(&url, StoreOptions::default()).await.unwrap(),
            Store::connect(&url, StoreOptions::default()).await.unwrap(),
        );
    }
    let path = std::env::temp_dir().join(format!("opkernel-store-{}.db", uuid::Uuid::new_v4()));
    let open = || Store::open(&path, StoreOptions::default()).unwrap();
    (open(), open())
}

/// A store for a unit test on SQLite, in a fresh file.
#[cfg(test)]
pub(crate) fn sqlite_test_store() -> Store {
    let path = std::env::temp_dir().join(format!("opkernel-store-{}.db", uuid::Uuid::new_v4()));
    Store::open(&path, StoreOptions::default()).unwrap()
}

/// SQLite's query plan of `sql` (each step's detail) on a fresh store,
/// with `?1` bound to a run id.
#[cfg(test)]
pub(crate) async fn sqlite_query_plan(sql: &str) -> Vec<String> {
    let explain = format!("EXPLAIN QUERY PLAN {sql}");
    sqlite_test_store()
        .read(move |tx| tx.query(&explain, crate::vals!["r"]))
        .await
        .unwrap()
        .iter()
        .map(|row| row.get::<String>("detail").unwrap())
        .collect()
}

/// A test store that collects the text of every statement it runs.
#[cfg(test)]
pub(crate) fn recording_test_store() -> (Store, Arc<Lock<std::collections::BTreeSet<String>>>) {
    let seen = Arc::new(Lock::new(std::collections::BTreeSet::new()));
    let mut store = sqlite_test_store();
    if let Backend::Sqlite { writer } = &mut store.backend {
        let metrics = store.metrics.clone();
        *writer = db::batch::Writer::new(writer.conn().clone(), Some(seen.clone()), metrics);
    }
    (store, seen)
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
