//! The SQLite dialect of the seam: one open rusqlite transaction (an
//! `IMMEDIATE` one for writes, so the whole file is the run trees' lock),
//! statements prepared once per connection (`prepare_cached`), [`Value`]s
//! bound as SQLite's own four kinds and cells read back as them.

use std::path::Path;
use std::sync::Arc;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{params_from_iter, Connection, ToSql};

use super::{Dialect, Row, Tx, Value};
use crate::store::{StoreError, StoreResult};

/// Where a test collects the text of every statement a store runs (to
/// prepare each on PostgreSQL, `pg_tests.rs`); `None` outside tests.
pub type Seen = Option<Arc<crate::base::sync::Lock<std::collections::BTreeSet<String>>>>;

/// One open transaction on the store's connection (the caller began it and
/// commits or rolls it back).
pub struct SqliteTx<'c> {
    conn: &'c Connection,
    seen: Seen,
}

impl<'c> SqliteTx<'c> {
    /// The seam over `conn`, inside a transaction the caller holds open.
    pub fn new(conn: &'c Connection, seen: Seen) -> SqliteTx<'c> {
        SqliteTx { conn, seen }
    }

    fn note(&self, sql: &str) {
        if let Some(seen) = &self.seen {
            seen.lock().insert(sql.to_owned());
        }
    }
}

impl Tx for SqliteTx<'_> {
    fn execute(&mut self, sql: &str, params: &[Value]) -> StoreResult<u64> {
        self.note(sql);
        let mut stmt = self.conn.prepare_cached(sql)?;
        let n = stmt.execute(params_from_iter(params))?;
        Ok(n as u64)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> StoreResult<Vec<Row>> {
        self.note(sql);
        let mut stmt = self.conn.prepare_cached(sql)?;
        let names: Arc<[String]> = stmt.column_names().into_iter().map(str::to_owned).collect();
        let width = names.len();
        let mut rows = stmt.query(params_from_iter(params))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let cells = (0..width)
                .map(|i| cell(row.get_ref(i)?, i))
                .collect::<StoreResult<Vec<Value>>>()?;
            out.push(Row::new(names.clone(), cells));
        }
        Ok(out)
    }

    /// Nothing to do: the transaction is `IMMEDIATE`, so it already holds
    /// the file's only write lock, every run tree's at once.
    fn lock_tree(&mut self, _root: &str) -> StoreResult<()> {
        Ok(())
    }

    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }
}

/// A cell as a [`Value`]; the store keeps no blobs.
fn cell(v: ValueRef<'_>, i: usize) -> StoreResult<Value> {
    Ok(match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(n) => Value::Int(n),
        ValueRef::Real(x) => Value::Real(x),
        ValueRef::Text(t) => Value::Text(
            String::from_utf8(t.to_vec())
                .map_err(|e| StoreError::Corrupt(format!("column {i}: {e}")))?,
        ),
        ValueRef::Blob(_) => {
            return Err(StoreError::Corrupt(format!(
                "column {i} holds a blob: the store writes none"
            )))
        }
    })
}

impl ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Int(n) => ValueRef::Integer(*n),
            Value::Real(x) => ValueRef::Real(*x),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
        }))
    }
}

/// Largest undo journal of a savepoint or statement kept in memory before
/// it spills to a temporary file (SQLite's default is 64 KiB).
const UNDO_JOURNAL_IN_MEMORY: std::os::raw::c_int = 8 << 20;

/// Group commit gives every write a savepoint, and SQLite journals the
/// first change of each page under a savepoint in an undo journal: past
/// 64 KiB it went to a temporary file, about 90 writes of 4 KiB per op
/// under load. Up to [`UNDO_JOURNAL_IN_MEMORY`] they stay in memory now;
/// a larger one (a retention purge of a big tree) still spills, so its
/// memory stays bounded. SQLite takes this only before its first
/// connection in the process (the kernel's store is that one); later, the
/// default stays.
fn keep_undo_journals_in_memory() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `sqlite3_config` with this option takes one int; it
        // touches only SQLite's global configuration, and refuses (MISUSE)
        // once SQLite is initialized, which changes nothing
        #[allow(unsafe_code)]
        let rc = unsafe {
            rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_STMTJRNL_SPILL,
                UNDO_JOURNAL_IN_MEMORY,
            )
        };
        if rc != rusqlite::ffi::SQLITE_OK {
            tracing::debug!(
                rc,
                "SQLite was initialized already: undo journals spill at 64 KiB"
            );
        }
    });
}

/// Opens (or creates) the database at `path`: refused untouched when a
/// newer kernel wrote it; else WAL, full sync, foreign keys, a busy wait,
/// the pending migrations, and an update hook that sends each appended
/// event's sequence number to `journal` (before the writer commits;
/// readers only re-read).
pub fn open(path: &Path, journal: Arc<tokio::sync::watch::Sender<i64>>) -> StoreResult<Connection> {
    keep_undo_journals_in_memory();
    let mut conn = Connection::open(path)?;
    // a database from a newer kernel is refused before anything here
    // writes to it (not even the journal mode)
    let found: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let known = super::migrations::known();
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
    conn.update_hook(Some(
        move |action: rusqlite::hooks::Action, _db: &str, table: &str, rowid: i64| {
            if table == "events" && action == rusqlite::hooks::Action::SQLITE_INSERT {
                journal.send_replace(rowid);
            }
        },
    ));
    Ok(conn)
}

/// One SQLite transaction: `BEGIN IMMEDIATE` for a write (the file's one
/// writer, every run tree serialized), deferred for a read; committed when
/// `f` returns `Ok`, rolled back on `Err`. The store's reads run here; its
/// writes go through the group commit (`batch.rs`).
pub fn transaction<T>(
    conn: &mut Connection,
    read_only: bool,
    seen: Seen,
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

/// Applies the migrations past the file's `user_version`, one
/// transaction each.
fn migrate(conn: &mut Connection) -> StoreResult<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    for m in super::migrations::MIGRATIONS {
        if m.version <= version {
            continue;
        }
        let tx = conn.transaction()?;
        tx.execute_batch(m.sqlite)?;
        tx.pragma_update(None, "user_version", m.version)?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vals;

    #[test]
    fn values_round_trip_and_rows_are_read_by_name() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (n INTEGER, x REAL, s TEXT, z TEXT)")
            .unwrap();
        let mut tx = SqliteTx::new(&conn, None);
        let tx: &mut dyn Tx = &mut tx;
        let n = tx
            .execute(
                "INSERT INTO t (n, x, s, z) VALUES (?1, ?2, ?3, ?4)",
                vals![7u32, 1.5, "a", None::<String>],
            )
            .unwrap();
        assert_eq!(n, 1);
        let row = tx
            .query_one(
                "SELECT n, x, s, z FROM t WHERE n = ?1",
                vals![true as i64 + 6],
            )
            .unwrap();
        assert_eq!(row.get::<u32>("n").ok(), Some(7));
        assert_eq!(row.get::<f64>("x").ok(), Some(1.5));
        assert_eq!(row.get::<String>("s").ok().as_deref(), Some("a"));
        assert_eq!(row.get::<Option<String>>("z").ok(), Some(None));
        let seq: i64 = tx
            .scalar("INSERT INTO t (n) VALUES (8) RETURNING n", &[])
            .unwrap();
        assert_eq!(seq, 8);
        assert!(tx
            .query_opt("SELECT n FROM t WHERE n = 9", &[])
            .unwrap()
            .is_none());
        assert!(matches!(
            tx.execute("INSERT INTO nowhere VALUES (1)", &[]),
            Err(StoreError::Database {
                dialect: Dialect::Sqlite,
                ..
            })
        ));
        assert_eq!(tx.dialect(), Dialect::Sqlite);
    }
}
