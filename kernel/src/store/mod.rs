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
mod fire;
pub mod hints;
mod journal;
mod lease;
mod levels;
mod location;
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
#[cfg(test)]
mod statements_tests;
mod tree;

use std::path::Path;
use std::sync::Arc;

use rusqlite::Connection;

use crate::base::sync::Lock;
use db::sqlite::SqliteTx;
use db::Tx;

pub use admission::Refusal;
pub use approvals::{TimeoutAction, BY_KILL, BY_OPERATOR, BY_TIMEOUT};
pub use bindings::{Binding, Bound};
pub use journal::{Event, ModelUsage, UsageRecorded};
pub use location::StoreLocation;
pub use nodes::{Judge, NodeRow, Swept};
pub use ops::{Admission, ApprovalHold, AttemptStart, NewOp, Op, Settlement, StartRequest};
pub use outbox::{OutboxPost, PostOutcome};
pub use reports::{Report, ReportItem, RunningItem, MAX_PENDING_NOTES};
pub use retention::{PrunableOp, PurgedTree};
pub use runs::{CreatedRun, NewRun, RunChange, RunRecord};
pub use schedules::{Fire, NewSchedule, Schedule, StartupReport, MAX_LAST_TAIL};

/// Why a control-plane call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused or failed a statement.
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
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
    /// PostgreSQL answered with an error (its SQLSTATE first).
    #[error("database error: {0}")]
    Postgres(String),
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

/// A control-plane call's result.
pub type StoreResult<T> = Result<T, StoreError>;

/// Connections a PostgreSQL store keeps (each transaction holds one, on
/// the blocking pool, for its duration).
const POSTGRES_POOL: usize = 16;

/// Numbered migrations, applied in order inside one transaction each.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/0001_control_plane.sql")),
    (2, include_str!("../../migrations/0002_kill_evidence.sql")),
    (3, include_str!("../../migrations/0003_usage.sql")),
    (4, include_str!("../../migrations/0004_launcher.sql")),
    (5, include_str!("../../migrations/0005_runs_as_tasks.sql")),
    (
        6,
        include_str!("../../migrations/0006_approvals_schedules.sql"),
    ),
    (7, include_str!("../../migrations/0007_leftovers.sql")),
    (8, include_str!("../../migrations/0008_retention.sql")),
    (9, include_str!("../../migrations/0009_webhooks.sql")),
    (10, include_str!("../../migrations/0010_pool.sql")),
    (11, include_str!("../../migrations/0011_cluster.sql")),
    (
        12,
        include_str!("../../migrations/0012_cluster_features.sql"),
    ),
];

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
    /// Notified events also go to the webhook outbox (set once the kernel
    /// knows it has a webhook URL).
    outbox: Arc<std::sync::atomic::AtomicBool>,
    /// Admissions place their run tree on a cluster node (set once the
    /// kernel runs as a node).
    cluster: Arc<std::sync::atomic::AtomicBool>,
    /// This kernel's cluster node: its recovery, watchdog and hand-off see
    /// only the ops placed on it.
    node: Arc<std::sync::OnceLock<String>>,
    /// Hand-off hints heard for this node (PostgreSQL only).
    hints: Arc<hints::Hints>,
}

/// The database behind a [`Store`].
#[derive(Clone)]
enum Backend {
    /// One SQLite connection, shared and serialized.
    Sqlite {
        conn: Arc<Lock<Connection>>,
        /// Where the statements run are collected: `None` but in tests.
        seen: db::sqlite::Seen,
    },
    /// A PostgreSQL pool; the listener of its notifications stops when the
    /// last clone of the store goes (`_listening` is its switch).
    Postgres {
        pool: deadpool_postgres::Pool,
        /// A connection of its own for a cluster node's lease: a pool
        /// saturated by load never delays a renewal (opened on first use).
        lease: deadpool_postgres::Pool,
        _listening: Arc<tokio::sync::watch::Sender<bool>>,
    },
}

impl Store {
    /// Opens (or creates) the database at `path` and applies the pending
    /// migrations; a database from a newer kernel is refused untouched.
    pub fn open(path: &Path) -> StoreResult<Store> {
        let mut conn = Connection::open(path)?;
        // a database from a newer kernel is refused before anything here
        // writes to it (not even the journal mode)
        let found: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        let known = MIGRATIONS.last().map_or(0, |(n, _)| *n);
        if found > known {
            return Err(StoreError::NewerSchema { found, known });
        }
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // every hot statement stays parsed
        conn.set_prepared_statement_cache_capacity(256);
        migrate(&mut conn)?;
        let journal = Arc::new(tokio::sync::watch::channel(0).0);
        let hook = journal.clone();
        conn.update_hook(Some(
            move |action: rusqlite::hooks::Action, _db: &str, table: &str, rowid: i64| {
                if table == "events" && action == rusqlite::hooks::Action::SQLITE_INSERT {
                    hook.send_replace(rowid);
                }
            },
        ));
        Ok(Store {
            backend: Backend::Sqlite {
                conn: Arc::new(Lock::new(conn)),
                seen: None,
            },
            journal,
            metrics: Default::default(),
            outbox: Default::default(),
            cluster: Default::default(),
            node: Default::default(),
            hints: Default::default(),
        })
    }

    /// Connects to a PostgreSQL control plane at `url` (SPEC §19): a pool,
    /// the migrations this kernel knows (a schema from a newer kernel is
    /// refused untouched), and a listener whose notifications wake journal
    /// readers (they also re-read on their own timer).
    pub async fn connect(url: &str) -> StoreResult<Store> {
        let pool = db::pgpool::pool(url, POSTGRES_POOL)?;
        db::pgpool::migrate(&db::pgpool::connection(&pool).await?).await?;
        let journal = Arc::new(tokio::sync::watch::channel(0).0);
        let (listening, stop) = crate::base::sync::Stop::new();
        let hook = journal.clone();
        let hints = Arc::new(hints::Hints::default());
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
        Ok(Store {
            backend: Backend::Postgres {
                pool,
                lease: db::pgpool::pool(url, 1)?,
                _listening: Arc::new(listening),
            },
            journal,
            metrics: Default::default(),
            outbox: Default::default(),
            cluster: Default::default(),
            node: Default::default(),
            hints,
        })
    }

    /// Which database this store runs on.
    pub fn dialect(&self) -> db::Dialect {
        match self.backend {
            Backend::Sqlite { .. } => db::Dialect::Sqlite,
            Backend::Postgres { .. } => db::Dialect::Postgres,
        }
    }

    /// Changes whenever an event may have been appended to any journal.
    pub fn journal(&self) -> tokio::sync::watch::Receiver<i64> {
        self.journal.subscribe()
    }

    /// Runs `f` in one write transaction on the blocking pool: SQLite's
    /// `BEGIN IMMEDIATE` (the file's one writer, every run tree
    /// serialized), PostgreSQL's READ COMMITTED (a tree's scripts take its
    /// lock first); commits when `f` returns `Ok`, rolls back on `Err`.
    async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
    {
        self.transaction(false, f).await
    }

    /// Runs `f` in one read transaction on the blocking pool: every
    /// statement of `f` reads the same snapshot.
    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
    {
        self.transaction(true, f).await
    }

    /// From now on, every admission places its run tree on a cluster node
    /// (the kernel runs as one).
    pub fn enable_cluster(&self, node: &str) {
        let _ = self.node.set(node.to_owned());
        self.hints.set_node(node);
        self.cluster
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The cluster node this kernel runs as, if any.
    pub fn node(&self) -> Option<&str> {
        self.node.get().map(String::as_str)
    }

    /// From now on, every notified event also puts its post in the webhook
    /// outbox, in the event's own transaction.
    pub fn enable_outbox(&self) {
        self.outbox
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// This process's metrics.
    pub fn metrics(&self) -> &crate::base::metrics::Metrics {
        &self.metrics
    }

    /// Runs `f` in one transaction, timed; the facts it notes are counted
    /// once it committed.
    async fn transaction<T, F>(&self, read_only: bool, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
    {
        self.transaction_on(false, read_only, f).await
    }

    /// A write transaction of a cluster node's lease: on PostgreSQL on the
    /// lease's own connection, never queued behind the pool's load.
    async fn lease_write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
    {
        self.transaction_on(true, false, f).await
    }

    async fn transaction_on<T, F>(&self, lease: bool, read_only: bool, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
    {
        let began = std::time::Instant::now();
        let outbox = self.outbox.load(std::sync::atomic::Ordering::Relaxed);
        let node = self
            .cluster
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| self.node().map(str::to_owned))
            .flatten();
        let noted = move |tx: &mut dyn Tx| {
            let mut noting = db::Noting::new(tx, outbox, node);
            let value = f(&mut noting)?;
            Ok((value, noting.into_facts()))
        };
        let done = match &self.backend {
            Backend::Sqlite { seen, .. } => {
                let seen = seen.clone();
                self.call(move |conn| sqlite_transaction(conn, read_only, seen, noted))
                    .await
            }
            Backend::Postgres {
                pool, lease: own, ..
            } => db::pgpool::run(if lease { own } else { pool }, read_only, noted).await,
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
        let Backend::Sqlite { conn, .. } = &self.backend else {
            return Err(StoreError::Worker("not an SQLite store".into()));
        };
        let conn = conn.clone();
        tokio::task::spawn_blocking(move || {
            // a panic inside `f` rolled its transaction back as it unwound,
            // so the connection is usable by the next call
            f(&mut conn.lock())
        })
        .await
        .map_err(|e| StoreError::Worker(e.to_string()))?
    }
}

/// One SQLite transaction: `BEGIN IMMEDIATE` for a write (the file's one
/// writer, every run tree serialized), deferred for a read; committed when
/// `f` returns `Ok`, rolled back on `Err`.
fn sqlite_transaction<T>(
    conn: &mut Connection,
    read_only: bool,
    seen: db::sqlite::Seen,
    f: impl FnOnce(&mut dyn Tx) -> StoreResult<T>,
) -> StoreResult<T> {
    let behavior = if read_only {
        rusqlite::TransactionBehavior::Deferred
    } else {
        rusqlite::TransactionBehavior::Immediate
    };
    // dropped uncommitted on `Err`: rolled back
    let tx = conn.transaction_with_behavior(behavior)?;
    let value = f(&mut SqliteTx::new(&tx, seen))?;
    tx.commit()?;
    Ok(value)
}

fn migrate(conn: &mut Connection) -> StoreResult<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    for (number, sql) in MIGRATIONS {
        if *number <= version {
            continue;
        }
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", number)?;
        tx.commit()?;
    }
    Ok(())
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
    if std::env::var("OPKERNEL_TEST_STORE").as_deref() == Ok("postgres") {
        let url = db::pgpool::test_database().await;
        return Store::connect(&url).await.unwrap();
    }
    sqlite_test_store()
}

/// Two stores on one fresh database, as two kernels would have: two
/// connections to one SQLite file, or two pools on one PostgreSQL database
/// (with `OPKERNEL_TEST_STORE=postgres`).
#[cfg(test)]
pub(crate) async fn test_store_pair() -> (Store, Store) {
    if std::env::var("OPKERNEL_TEST_STORE").as_deref() == Ok("postgres") {
        let url = db::pgpool::test_database().await;
        return (
            Store::connect(&url).await.unwrap(),
            Store::connect(&url).await.unwrap(),
        );
    }
    let path = std::env::temp_dir().join(format!("opkernel-store-{}.db", uuid::Uuid::new_v4()));
    (Store::open(&path).unwrap(), Store::open(&path).unwrap())
}

/// A store for a unit test on SQLite, in a fresh file.
#[cfg(test)]
pub(crate) fn sqlite_test_store() -> Store {
    let path = std::env::temp_dir().join(format!("opkernel-store-{}.db", uuid::Uuid::new_v4()));
    Store::open(&path).unwrap()
}

/// A test store that collects the text of every statement it runs.
#[cfg(test)]
pub(crate) fn recording_test_store() -> (Store, Arc<Lock<std::collections::BTreeSet<String>>>) {
    let seen = Arc::new(Lock::new(std::collections::BTreeSet::new()));
    let mut store = sqlite_test_store();
    if let Backend::Sqlite { seen: s, .. } = &mut store.backend {
        *s = Some(seen.clone());
    }
    (store, seen)
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
