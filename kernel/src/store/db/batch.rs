//! Group commit on SQLite: write transactions that arrive while the
//! connection is busy wait in a queue, and the next runner commits all of
//! them at once (one `BEGIN IMMEDIATE … COMMIT`, one sync of the WAL),
//! each inside a savepoint of its own, so that one's error or panic rolls
//! back only its own writes. Every caller is answered once the commit that
//! made its writes durable returned, or with that commit's error: nothing
//! is answered from an uncommitted write. The queue's order is the order
//! of the transactions, as if each had committed alone.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::sqlite::{Seen, SqliteTx};
use super::{Dialect, Tx};
use crate::base::metrics::Metrics;
use crate::base::sync::Lock;
use crate::store::{StoreError, StoreResult};

/// Sends a job's result, given the batch's failure (`Some` when its
/// commit, or its begin, failed).
type Answer = Box<dyn FnOnce(Option<&str>) + Send>;

/// A queued write: runs on the open transaction (or learns why there is
/// none) and says whether its writes are kept, with its answer.
type Job = Box<dyn FnOnce(Result<&mut dyn Tx, &str>) -> (bool, Answer) + Send>;

/// The SQLite store's connection (reads take it under its lock) and the
/// writes waiting for it.
pub struct Writer {
    conn: Arc<Lock<Connection>>,
    queue: Lock<Vec<Job>>,
    /// A runner is on its way to the connection and will take the queue.
    scheduled: AtomicBool,
    seen: Seen,
    /// Where each commit is counted.
    metrics: Arc<Metrics>,
}

impl Writer {
    /// The writer of `conn` (which reads share, under its lock).
    pub fn new(conn: Arc<Lock<Connection>>, seen: Seen, metrics: Arc<Metrics>) -> Arc<Writer> {
        Arc::new(Writer {
            conn,
            queue: Lock::new(Vec::new()),
            scheduled: AtomicBool::new(false),
            seen,
            metrics,
        })
    }

    /// The connection, which reads take under its lock.
    pub fn conn(&self) -> &Arc<Lock<Connection>> {
        &self.conn
    }

    /// Where the statements run are collected (`None` but in tests).
    pub fn seen(&self) -> Seen {
        self.seen.clone()
    }

    /// Runs `f` in the next batch; answers once that batch committed (or
    /// with why it did not). `f`'s `Err` rolls back only `f`'s writes.
    pub async fn write<T, F>(self: &Arc<Self>, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
    {
        let (send, answered) = oneshot::channel();
        let job: Job = Box::new(move |tx| {
            let result = match tx {
                Ok(tx) => f(tx),
                Err(e) => Err(StoreError::database(Dialect::Sqlite, e)),
            };
            let kept = result.is_ok();
            let answer: Answer = Box::new(move |failed| {
                let result = match failed {
                    Some(e) if kept => Err(StoreError::database(Dialect::Sqlite, e)),
                    _ => result,
                };
                let _ = send.send(result);
            });
            (kept, answer)
        });
        self.queue.lock().push(job);
        // a runner not yet at its take will take this job too (it clears
        // the flag before taking); else one is sent
        if !self.scheduled.swap(true, Ordering::SeqCst) {
            self.send_runner();
        }
        answered
            .await
            .map_err(|_| StoreError::Worker("the write transaction panicked".into()))?
    }

    /// Sends a runner to the blocking pool. One the runtime refuses (it is
    /// shutting down) is dropped unrun: then its guard fails the queued
    /// writes and clears the flag, so no write waits for a runner forever.
    fn send_runner(self: &Arc<Self>) {
        let mut guard = Unrun(Some(self.clone()));
        tokio::task::spawn_blocking(move || {
            if let Some(writer) = guard.0.take() {
                writer.run();
            }
        });
    }

    /// Takes the queued writes (at most [`MAX_BATCH`]) once the connection
    /// is free and commits them together; sends another runner for any
    /// left over.
    fn run(self: &Arc<Self>) {
        let conn = self.conn.lock();
        self.scheduled.store(false, Ordering::SeqCst);
        let jobs: Vec<Job> = {
            let mut queue = self.queue.lock();
            let n = queue.len().min(MAX_BATCH);
            queue.drain(..n).collect()
        };
        if jobs.is_empty() {
            return;
        }
        // a panic outside the jobs' own (a bug here) must not leave the
        // transaction open on the shared connection
        let done = catch_unwind(AssertUnwindSafe(|| commit(&conn, jobs, &self.seen)));
        let (answers, kept, failed) = match done {
            Ok(done) => done,
            Err(panic) => {
                let _ = conn.execute_batch("ROLLBACK");
                std::panic::resume_unwind(panic)
            }
        };
        if kept && failed.is_none() {
            self.metrics.committed();
        }
        // answered after the commit returned, and off the connection's lock
        drop(conn);
        for answer in answers {
            answer(failed.as_deref());
        }
        if !self.queue.lock().is_empty() && !self.scheduled.swap(true, Ordering::SeqCst) {
            self.send_runner();
        }
    }
}

/// The most writes one commit holds: a long queue is committed in turns,
/// and reads get the connection between them.
const MAX_BATCH: usize = 128;

/// A runner not yet run: dropped so (refused by the runtime), it fails
/// the queued writes (their callers hear a worker error) and clears the
/// flag for the next write to send another.
struct Unrun(Option<Arc<Writer>>);

impl Drop for Unrun {
    fn drop(&mut self) {
        if let Some(writer) = self.0.take() {
            let queued = std::mem::take(&mut *writer.queue.lock());
            writer.scheduled.store(false, Ordering::SeqCst);
            drop(queued);
        }
    }
}

/// One transaction for `jobs`, each in its savepoint (a lone job needs
/// none: its `Err` rolls the transaction back): their answers, whether any
/// kept its writes, and the batch's failure if it did not commit (then
/// nothing of it is kept).
fn commit(conn: &Connection, jobs: Vec<Job>, seen: &Seen) -> (Vec<Answer>, bool, Option<String>) {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let e = e.to_string();
        let answers = jobs.into_iter().map(|job| job(Err(&e)).1).collect();
        return (answers, false, Some(e));
    }
    let alone = jobs.len() == 1;
    let mut answers = Vec::with_capacity(jobs.len());
    let (mut kept, mut failed) = (false, None::<String>);
    for job in jobs {
        let answer = match &failed {
            // the transaction is lost already: the rest are refused unrun
            Some(e) => Some(job(Err(e)).1),
            None => {
                let ran = in_savepoint(conn, job, seen, !alone);
                kept |= ran.1;
                failed = ran.2;
                ran.0
            }
        };
        // `None`: it panicked, and its caller learns it from the dropped answer
        answers.extend(answer);
    }
    if failed.is_none() && kept {
        failed = conn.execute_batch("COMMIT").err().map(|e| e.to_string());
    }
    if failed.is_some() || !kept {
        let _ = conn.execute_batch("ROLLBACK");
    }
    (answers, kept, failed)
}

/// Runs one job, inside a savepoint of its own when `saved` (rolled back
/// to it when the job fails or panics): its answer (`None` if it
/// panicked), whether it kept its writes, and the batch's failure when the
/// savepoint itself failed.
fn in_savepoint(conn: &Connection, job: Job, seen: &Seen, saved: bool) -> Ran {
    if saved {
        if let Err(e) = savepoint(conn, "SAVEPOINT job") {
            let e = e.to_string();
            return (Some(job(Err(&e)).1), false, Some(e));
        }
    }
    let ran = catch_unwind(AssertUnwindSafe(|| {
        let mut tx = SqliteTx::new(conn, seen.clone());
        job(Ok(&mut tx))
    }));
    let (kept, answer) = match ran {
        Ok((kept, answer)) => (kept, Some(answer)),
        Err(_) => (false, None),
    };
    if !saved {
        return (answer, kept, None);
    }
    let undone = match kept {
        true => Ok(()),
        false => savepoint(conn, "ROLLBACK TO job"),
    };
    let released = undone.and_then(|()| savepoint(conn, "RELEASE job"));
    (answer, kept, released.err().map(|e| e.to_string()))
}

/// What running one job gave: its answer, whether it kept its writes, the
/// batch's failure.
type Ran = (Option<Answer>, bool, Option<String>);

/// A savepoint statement, parsed once per connection.
fn savepoint(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vals;

    fn writer() -> (Arc<Writer>, Arc<Lock<Connection>>) {
        let (w, conn, _) = counted_writer();
        (w, conn)
    }

    fn counted_writer() -> (Arc<Writer>, Arc<Lock<Connection>>, Arc<Metrics>) {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE t (n INTEGER PRIMARY KEY); INSERT INTO t (n) VALUES (100)",
        )
        .unwrap();
        let conn = Arc::new(Lock::new(conn));
        let metrics: Arc<Metrics> = Default::default();
        (
            Writer::new(conn.clone(), None, metrics.clone()),
            conn,
            metrics,
        )
    }

    fn insert(n: i64) -> impl FnOnce(&mut dyn Tx) -> StoreResult<i64> + Send + 'static {
        move |tx: &mut dyn Tx| {
            tx.execute("INSERT INTO t (n) VALUES (?1)", vals![n])?;
            Ok(n)
        }
    }

    fn rows(conn: &Lock<Connection>) -> Vec<i64> {
        let conn = conn.lock();
        let mut stmt = conn.prepare("SELECT n FROM t ORDER BY n").unwrap();
        let got = stmt.query_map([], |r| r.get(0)).unwrap();
        got.map(Result::unwrap).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiting_writes_commit_together_and_fail_alone() {
        let (w, conn, metrics) = counted_writer();
        // the connection is held, so every write below queues for one batch
        let (held, release) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let holder = conn.clone();
        let holding = std::thread::spawn(move || {
            let _guard = holder.lock();
            held.0.send(()).unwrap();
            let _ = release.1.recv();
        });
        held.1.recv().unwrap();
        let mut calls = Vec::new();
        for n in 0..20i64 {
            let w = w.clone();
            calls.push(tokio::spawn(async move {
                match n {
                    // an error rolls back its own insert only
                    5 => {
                        w.write(move |tx: &mut dyn Tx| {
                            tx.execute("INSERT INTO t (n) VALUES (?1)", vals![n])?;
                            Err::<i64, _>(StoreError::Corrupt("refused".into()))
                        })
                        .await
                    }
                    // a panic too, and its caller hears of it
                    7 => {
                        w.write(move |tx: &mut dyn Tx| {
                            tx.execute("INSERT INTO t (n) VALUES (?1)", vals![n])?;
                            panic!("a script's bug")
                        })
                        .await
                    }
                    // a duplicate key fails this write, not its neighbours
                    9 => w.write(insert(100)).await,
                    _ => w.write(insert(n)).await,
                }
            }));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        release.0.send(()).unwrap();
        holding.join().unwrap();
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap());
        }
        for (n, answer) in answers.iter().enumerate() {
            match n {
                5 => assert!(matches!(answer, Err(StoreError::Corrupt(_)))),
                7 => assert!(matches!(answer, Err(StoreError::Worker(_)))),
                9 => assert!(matches!(answer, Err(StoreError::Database { .. }))),
                _ => assert_eq!(answer.as_ref().ok(), Some(&(n as i64))),
            }
        }
        let mut want: Vec<i64> = (0..20).filter(|n| ![5, 7, 9].contains(n)).collect();
        want.push(100);
        assert_eq!(rows(&conn), want);
        // 17 writes kept, and they shared their commit (a write the test's
        // scheduler queued late may take a second one)
        let text = metrics.render(&Default::default());
        let commits: u32 = text
            .lines()
            .find_map(|l| l.strip_prefix("opkernel_store_commits_total "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap();
        assert!((1..=2).contains(&commits), "{commits} commits");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_begin_answers_every_waiting_write() {
        let (w, conn) = writer();
        // a transaction already open: the batch's BEGIN fails
        conn.lock().execute_batch("BEGIN").unwrap();
        let answer = w.write(insert(1)).await;
        assert!(matches!(answer, Err(StoreError::Database { .. })));
        conn.lock().execute_batch("ROLLBACK").unwrap();
        assert_eq!(w.write(insert(2)).await.ok(), Some(2));
        assert_eq!(rows(&conn), vec![2, 100]);
    }
}
