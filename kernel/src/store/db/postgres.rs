//! The PostgreSQL dialect of the seam (SPEC §19): `tokio-postgres` with a
//! `deadpool-postgres` pool. A transaction script is synchronous and runs on
//! the blocking pool, as on SQLite; each of its statements is one round trip,
//! awaited there on the runtime's handle. Statements are prepared once per
//! connection; `?N` placeholders become `$N`.

use std::error::Error;
use std::sync::Arc;

use bytes::BytesMut;
use deadpool_postgres::Object;
use tokio::runtime::Handle;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};

use super::{Dialect, Row, Tx, Value};
use crate::store::{StoreError, StoreResult};

/// One open transaction on a pooled connection. Dropped unfinished (a
/// script that panicked) it rolls back, so the pooled connection never
/// carries a half-done transaction into its next user's.
pub struct PgTx<'a> {
    client: &'a Object,
    handle: Handle,
    finished: bool,
    /// The `BEGIN` not sent yet: it goes with the first statement, in one
    /// round trip (pipelined), and a transaction that runs none sends none.
    pending_begin: Option<&'static str>,
    /// The run trees this transaction locked: locking one again is free.
    locked: std::collections::HashSet<String>,
    /// Runs whose tree this transaction locked, with their roots.
    roots: std::collections::HashMap<String, String>,
    /// A statement was refused by a server that takes no writes (25006).
    read_only_server: bool,
}

impl Drop for PgTx<'_> {
    fn drop(&mut self) {
        if !self.finished && self.pending_begin.is_none() {
            let _ = self.handle.block_on(self.client.batch_execute("ROLLBACK"));
        }
    }
}

impl<'a> PgTx<'a> {
    /// Begins a transaction: for writes READ COMMITTED (each statement
    /// sees what committed before it; a run tree's scripts serialize on its
    /// root's advisory lock, see [`Tx::lock_tree`]), for reads REPEATABLE READ
    /// READ ONLY (every statement reads one snapshot).
    pub fn begin(client: &'a Object, handle: Handle, read_only: bool) -> StoreResult<PgTx<'a>> {
        let begin = if read_only {
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        } else {
            "BEGIN ISOLATION LEVEL READ COMMITTED"
        };
        Ok(PgTx {
            client,
            handle,
            finished: false,
            pending_begin: Some(begin),
            locked: Default::default(),
            roots: Default::default(),
            read_only_server: false,
        })
    }

    /// One job of a batch ([`super::pgbatch`]): `begin` (a lone job's
    /// `BEGIN`) goes with its first statement; the batch's lane, not this,
    /// ends the transaction.
    pub fn batched(client: &'a Object, handle: Handle, begin: Option<&'static str>) -> PgTx<'a> {
        PgTx {
            client,
            handle,
            finished: true,
            pending_begin: begin,
            locked: Default::default(),
            roots: Default::default(),
            read_only_server: false,
        }
    }

    /// After a batched job: whether its `BEGIN` went out (with a
    /// statement), and whether a server that takes no writes refused a
    /// statement.
    pub fn outcome(self) -> (bool, bool) {
        (self.pending_begin.is_none(), self.read_only_server)
    }

    /// Commits the transaction. An error here may hide a commit that
    /// happened (its answer lost): callers never retry a script on it.
    pub fn commit(mut self) -> StoreResult<()> {
        self.end("COMMIT")
    }

    /// Rolls the transaction back.
    pub fn rollback(mut self) -> StoreResult<()> {
        self.end("ROLLBACK")
    }

    fn end(&mut self, how: &str) -> StoreResult<()> {
        self.finished = true;
        if self.pending_begin.is_some() {
            return Ok(());
        }
        self.handle
            .block_on(self.client.batch_execute(how))
            .map_err(pg_error)
    }

    /// Awaits one statement's future, the pending `BEGIN` pipelined ahead
    /// of it (sent first, on the same connection, in the same round trip).
    fn send<T>(
        &mut self,
        statement: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> StoreResult<T> {
        let client = self.client;
        let answer = match self.pending_begin.take() {
            None => self.handle.block_on(statement).map_err(pg_error),
            Some(begin) => {
                // biased: BEGIN is polled (so queued) first
                let (begun, answer) = self.handle.block_on(async {
                    tokio::join!(biased; client.batch_execute(begin), statement)
                });
                begun.map_err(pg_error)?;
                answer.map_err(pg_error)
            }
        };
        if let Err(StoreError::Unavailable(m)) = &answer {
            self.read_only_server |= m.starts_with(READ_ONLY_SERVER);
        }
        answer
    }

    fn prepared(&self, sql: &str) -> StoreResult<tokio_postgres::Statement> {
        let sql = dollar_placeholders(sql);
        self.handle
            .block_on(self.client.prepare_cached(&sql))
            .map_err(pg_error)
    }
}

impl Tx for PgTx<'_> {
    fn execute(&mut self, sql: &str, params: &[Value]) -> StoreResult<u64> {
        let stmt = self.prepared(sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|v| v as _).collect();
        let client = self.client;
        self.send(client.execute(&stmt, &refs))
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> StoreResult<Vec<Row>> {
        let stmt = self.prepared(sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|v| v as _).collect();
        let client = self.client;
        let rows = self.send(client.query(&stmt, &refs))?;
        let names: Arc<[String]> = stmt.columns().iter().map(|c| c.name().to_owned()).collect();
        rows.iter()
            .map(|r| Ok(Row::new(names.clone(), cells(r)?)))
            .collect()
    }

    fn lock_tree(&mut self, root: &str) -> StoreResult<()> {
        // a transaction-scoped advisory lock keyed by the root's id: it
        // holds whether or not the root's row exists yet (the first op of
        // an implicit run inserts it), and goes with the commit or rollback
        if self.locked.contains(root) {
            return Ok(());
        }
        self.query(
            "SELECT 1 AS locked FROM (SELECT pg_advisory_xact_lock(hashtextextended(?1, 0))) AS l",
            &[root.into()],
        )?;
        self.locked.insert(root.to_owned());
        Ok(())
    }

    fn locked_root(&self, run_id: &str) -> Option<String> {
        self.roots.get(run_id).cloned()
    }

    fn note_locked(&mut self, run_id: &str, root: &str) {
        self.roots.insert(run_id.to_owned(), root.to_owned());
    }

    fn note_tree_locked(&mut self, root: &str) {
        self.locked.insert(root.to_owned());
    }

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }
}

/// A PostgreSQL error as the store's: a lost or refused connection is the
/// store being unavailable (503 `store_unavailable`), anything else a
/// database error.
pub fn pg_error(e: tokio_postgres::Error) -> StoreError {
    // connection exceptions (08), insufficient resources (53: too many
    // clients), operator intervention (57: shutdown, cancel, a statement
    // or lock timeout), system errors (58) and a serialization failure or
    // deadlock (40001, 40P01), a write refused by a server that takes
    // none (25006: made read-only while it runs, SPEC §31; in a read
    // transaction `pgpool::run` makes it the statement's fault again):
    // none is a statement's fault, and the same request may be retried
    let away = e.as_db_error().is_some_and(|db| {
        let code = db.code().code();
        ["08", "53", "57", "58"]
            .iter()
            .any(|class| code.starts_with(class))
            || matches!(code, "40001" | "40P01" | "25006")
    });
    // with its cause: which certificate check failed, not only that one
    // did (a certificate refused is an outage too: at start it stops the
    // start with this reason, later calls answer 503 until it is fixed)
    let message = match (e.as_db_error(), e.source()) {
        (Some(db), _) => format!("{}: {}", db.code().code(), db.message()),
        (None, Some(cause)) => format!("{e}: {cause}"),
        (None, None) => e.to_string(),
    };
    if away
        || e.is_closed()
        || e.as_db_error().is_none() && e.source().is_some_and(|s| s.is::<std::io::Error>())
    {
        StoreError::Unavailable(message)
    } else {
        StoreError::database(super::Dialect::Postgres, message)
    }
}

/// How [`pg_error`] begins the message of a write refused by a server
/// that takes none (SQLSTATE 25006).
pub const READ_ONLY_SERVER: &str = "25006:";

/// The same error again (a batch's failure, told to each of its callers).
pub fn copy_error(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
        StoreError::Database { dialect, message } => StoreError::Database {
            dialect: *dialect,
            message: message.clone(),
        },
        other => StoreError::Worker(other.to_string()),
    }
}

/// `?1` → `$1` (the scripts' portable placeholders; no statement of the
/// store has a `?` inside a string literal).
pub fn dollar_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

fn cells(row: &tokio_postgres::Row) -> StoreResult<Vec<Value>> {
    (0..row.len()).map(|i| cell(row, i)).collect()
}

fn cell(row: &tokio_postgres::Row, i: usize) -> StoreResult<Value> {
    let ty = row.columns()[i].type_().clone();
    let bad = |e: tokio_postgres::Error| StoreError::Corrupt(format!("column {i} ({ty}): {e}"));
    let v = match ty {
        Type::INT8 => row
            .try_get::<_, Option<i64>>(i)
            .map_err(bad)?
            .map(Value::Int),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(i)
            .map_err(bad)?
            .map(Value::from),
        Type::INT2 => row
            .try_get::<_, Option<i16>>(i)
            .map_err(bad)?
            .map(|n| Value::Int(n.into())),
        Type::BOOL => row
            .try_get::<_, Option<bool>>(i)
            .map_err(bad)?
            .map(Value::from),
        Type::FLOAT8 => row
            .try_get::<_, Option<f64>>(i)
            .map_err(bad)?
            .map(Value::Real),
        Type::FLOAT4 => row
            .try_get::<_, Option<f32>>(i)
            .map_err(bad)?
            .map(|x| Value::Real(x.into())),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => row
            .try_get::<_, Option<String>>(i)
            .map_err(bad)?
            .map(Value::Text),
        other => {
            return Err(StoreError::Corrupt(format!(
                "column {i} has type {other}: cast it (sums to BIGINT) in the statement"
            )))
        }
    };
    Ok(v.unwrap_or(Value::Null))
}

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        match (self, ty) {
            (Value::Null, _) => Ok(IsNull::Yes),
            (Value::Int(n), &Type::INT8) => n.to_sql(ty, out),
            (Value::Int(n), &Type::INT4) => i32::try_from(*n)?.to_sql(ty, out),
            (Value::Int(n), &Type::INT2) => i16::try_from(*n)?.to_sql(ty, out),
            (Value::Int(n), &Type::BOOL) => (*n != 0).to_sql(ty, out),
            (Value::Int(n), &Type::FLOAT8) => (*n as f64).to_sql(ty, out),
            (Value::Real(x), &Type::FLOAT8) => x.to_sql(ty, out),
            (Value::Real(x), &Type::FLOAT4) => (*x as f32).to_sql(ty, out),
            (Value::Text(s), _) if <&str as ToSql>::accepts(ty) => s.as_str().to_sql(ty, out),
            (v, ty) => Err(format!("a {v:?} cannot be a {ty} parameter").into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_dollars_and_nothing_else_changes() {
        assert_eq!(
            dollar_placeholders("SELECT a FROM t WHERE x = ?1 AND y IN (?2, ?10) AND z = '?'"),
            "SELECT a FROM t WHERE x = $1 AND y IN ($2, $10) AND z = '?'"
        );
    }
}
