//! The seam between the store's transaction scripts and a database
//! dialect. A script talks to one open transaction through [`Tx`], in
//! portable SQL (`?1` placeholders, `ON CONFLICT`, `RETURNING`, `CAST(… AS
//! BIGINT)`), with [`Value`] parameters and [`Row`]s read by column name;
//! each dialect (SQLite, and PostgreSQL per SPEC §19) implements `Tx`
//! and differs only where ARCHITECTURE.md's seam table says.

pub mod batch;
pub mod migrations;
#[cfg(feature = "postgres")]
pub mod pgbatch;
#[cfg(feature = "postgres")]
pub mod pghosts;
#[cfg(feature = "postgres")]
pub mod pglisten;
#[cfg(feature = "postgres")]
pub mod pgowner;
#[cfg(feature = "postgres")]
pub mod pgpool;
#[cfg(feature = "postgres")]
pub mod pgtls;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod sqlite;
mod value;

#[cfg(test)]
#[cfg(feature = "postgres")]
mod pg_tests;

pub use value::{FromValue, Row, Value};

use super::StoreResult;

/// The database a transaction runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// One file, one writer at a time (`BEGIN IMMEDIATE`).
    Sqlite,
    /// A server; a run tree's transactions are serialized by an advisory
    /// lock keyed by its root's id.
    Postgres,
}

impl std::fmt::Display for Dialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dialect::Sqlite => "SQLite",
            Dialect::Postgres => "PostgreSQL",
        })
    }
}

/// One open transaction, as a transaction script sees it.
pub trait Tx {
    /// Runs a statement; how many rows it changed.
    fn execute(&mut self, sql: &str, params: &[Value]) -> StoreResult<u64>;

    /// Runs a query; its rows, in order.
    fn query(&mut self, sql: &str, params: &[Value]) -> StoreResult<Vec<Row>>;

    /// Serializes this transaction with every other one touching the run
    /// tree rooted at `root` (admission, settlement, cancel, drain, fire).
    /// SQLite's write transactions are serial already; PostgreSQL takes a
    /// transaction-scoped advisory lock keyed by the root's id (it holds
    /// before the root's row exists, as for an implicit run's first op).
    fn lock_tree(&mut self, root: &str) -> StoreResult<()>;

    /// The root of `run_id`'s tree when this transaction already locked
    /// it (noted by [`Tx::note_locked`]): no need to read or lock again.
    fn locked_root(&self, _run_id: &str) -> Option<String> {
        None
    }

    /// Notes that `run_id`'s tree, rooted at `root`, is locked.
    fn note_locked(&mut self, _run_id: &str, _root: &str) {}

    /// Notes that the tree rooted at `root` is locked (by a statement of
    /// the caller's own that took [`Tx::lock_tree`]'s lock).
    fn note_tree_locked(&mut self, _root: &str) {}

    /// The dialect, for the few statements spelled differently.
    fn dialect(&self) -> Dialect;

    /// Notes a fact that holds once this transaction commits (for the
    /// metrics); forgotten when it rolls back.
    fn note_fact(&mut self, _fact: Fact) {}

    /// Whether notified events also go to the webhook outbox (the kernel
    /// has a webhook URL).
    fn outbox(&self) -> bool {
        false
    }

    /// Whether the control plane is a cluster's (SPEC §20): admissions
    /// place their run tree on a node.
    fn cluster(&self) -> bool {
        self.node().is_some()
    }

    /// The cluster node this kernel runs as, if any.
    fn node(&self) -> Option<&str> {
        None
    }
}

/// What a committed transaction did, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fact {
    /// An op was admitted.
    Admitted,
    /// An op reached this terminal status (its write won).
    Settled(crate::lifecycle::Status),
    /// A background op was delivered in a report this long after its end.
    Reported {
        /// Milliseconds from its end to the report.
        waited_ms: i64,
    },
}

/// A transaction that keeps the [`Fact`]s its script notes; the store
/// applies them after the commit.
pub struct Noting<'t> {
    inner: &'t mut dyn Tx,
    facts: Vec<Fact>,
    outbox: bool,
    node: Option<String>,
}

impl<'t> Noting<'t> {
    /// Wraps an open transaction; `outbox`: notified events go to the
    /// webhook outbox too; `node`: this kernel's cluster node (admissions
    /// place their run tree).
    pub fn new(inner: &'t mut dyn Tx, outbox: bool, node: Option<String>) -> Noting<'t> {
        Noting {
            inner,
            facts: Vec::new(),
            outbox,
            node,
        }
    }

    /// The facts noted, in order.
    pub fn into_facts(self) -> Vec<Fact> {
        self.facts
    }
}

impl Tx for Noting<'_> {
    fn execute(&mut self, sql: &str, params: &[Value]) -> StoreResult<u64> {
        self.inner.execute(sql, params)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> StoreResult<Vec<Row>> {
        self.inner.query(sql, params)
    }

    fn lock_tree(&mut self, root: &str) -> StoreResult<()> {
        self.inner.lock_tree(root)
    }

    fn locked_root(&self, run_id: &str) -> Option<String> {
        self.inner.locked_root(run_id)
    }

    fn note_locked(&mut self, run_id: &str, root: &str) {
        self.inner.note_locked(run_id, root)
    }

    fn note_tree_locked(&mut self, root: &str) {
        self.inner.note_tree_locked(root)
    }

    fn dialect(&self) -> Dialect {
        self.inner.dialect()
    }

    fn note_fact(&mut self, fact: Fact) {
        self.facts.push(fact);
    }

    fn outbox(&self) -> bool {
        self.outbox
    }

    fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }
}

impl dyn Tx + '_ {
    /// The first row of a query, if any.
    pub fn query_opt(&mut self, sql: &str, params: &[Value]) -> StoreResult<Option<Row>> {
        Ok(self.query(sql, params)?.into_iter().next())
    }

    /// The one row a query must return.
    pub fn query_one(&mut self, sql: &str, params: &[Value]) -> StoreResult<Row> {
        self.query_opt(sql, params)?
            .ok_or_else(|| super::StoreError::Corrupt(format!("no row for: {sql}")))
    }

    /// The first column of the one row a query returns.
    pub fn scalar<T: FromValue>(&mut self, sql: &str, params: &[Value]) -> StoreResult<T> {
        self.query_one(sql, params)?.at(0)
    }
}

/// Parameters for a statement: `vals![a, b, c]` is `&[Value::from(a), …]`.
#[macro_export]
macro_rules! vals {
    ($($v:expr),* $(,)?) => {
        &[$($crate::store::db::Value::from($v)),*][..]
    };
}
