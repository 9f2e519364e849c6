//! Group commit on PostgreSQL: a node's write transactions that arrive
//! while its writer is busy wait in a queue, and the writer's next turn
//! commits all of them at once (one `BEGIN … COMMIT`, one flush of the
//! server's WAL), each inside a savepoint of its own, so that one's error
//! or panic rolls back only its own writes. As on SQLite
//! ([`super::batch`]), every caller is answered once the commit that made
//! its writes durable returned, or with that commit's error.
//!
//! A batch holds the tree locks its jobs took until it commits. One
//! writer per node keeps a node's own batches from waiting on each other;
//! another node's batch may still hold a tree this batch's job waits for
//! while waiting for one of this batch's trees. The server breaks such a
//! deadlock by failing one statement: its job is rolled back to its
//! savepoint and run again alone once its batch committed, so a batch's
//! neighbours never make a job fail that would have passed on its own.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use deadpool_postgres::{Object, Pool};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::postgres::{copy_error, PgTx};
use super::Tx;
use crate::base::metrics::Metrics;
use crate::base::sync::Lock;
use crate::store::{StoreError, StoreResult};

/// Sends a job's result, given the batch's failure (`Some` when its
/// commit, or its begin, failed: then nothing of the batch is kept).
type Answer = Box<dyn FnOnce(Option<&StoreError>) + Send>;

/// How a job is run: on the open transaction (`retry`: a conflict with
/// another transaction may be answered by running it again alone), or
/// refused unrun with the batch's failure.
enum Attempt<'a> {
    Run(&'a mut dyn Tx, bool),
    Refused(&'a StoreError),
}

/// A queued write: what became of it (whether its writes are kept, and
/// its answer), or `None` when it asks to be run again alone.
type Job = Box<dyn FnMut(Attempt<'_>) -> Option<(bool, Answer)> + Send>;

/// A node's writer on its PostgreSQL pool.
pub struct PgWriter {
    pool: Pool,
    handle: Handle,
    queue: Lock<VecDeque<Job>>,
    /// Held by the runner whose turn it is: one batch at a time.
    turn: Lock<()>,
    /// A runner is on its way and will take the queue.
    scheduled: AtomicBool,
    /// Where each commit is counted.
    metrics: Arc<Metrics>,
}

impl PgWriter {
    /// The writer on `pool`; runners block on `handle`'s runtime.
    pub fn new(pool: Pool, handle: Handle, metrics: Arc<Metrics>) -> Arc<PgWriter> {
        Arc::new(PgWriter {
            pool,
            handle,
            queue: Lock::new(VecDeque::new()),
            turn: Lock::new(()),
            scheduled: AtomicBool::new(false),
            metrics,
        })
    }

    /// Runs `f` in the writer's next batch; answers once that batch
    /// committed (or with why it did not). `f`'s `Err` rolls back only
    /// `f`'s writes; `f` runs again (alone) only after a conflict with
    /// another transaction rolled its first run back.
    pub async fn write<T, F>(self: &Arc<Self>, mut f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
    {
        let (send, answered) = oneshot::channel();
        let mut send = Some(send);
        let job: Job = Box::new(move |attempt| {
            let result = match attempt {
                Attempt::Run(tx, retry) => match f(tx) {
                    Err(e) if retry && conflict(&e) => return None,
                    result => result,
                },
                Attempt::Refused(e) => Err(copy_error(e)),
            };
            let send = send.take()?;
            let kept = result.is_ok();
            let answer: Answer = Box::new(move |failed| {
                let result = match failed {
                    Some(e) if kept => Err(copy_error(e)),
                    _ => result,
                };
                let _ = send.send(result);
            });
            Some((kept, answer))
        });
        self.queue.lock().push_back(job);
        if !self.scheduled.swap(true, Ordering::SeqCst) {
            self.send_runner();
        }
        answered
            .await
            .map_err(|_| StoreError::Worker("the write transaction panicked".into()))?
    }

    /// Sends a runner to the blocking pool; one the runtime refuses (it
    /// is shutting down) fails the queued writes (see [`Unrun`]).
    fn send_runner(self: &Arc<Self>) {
        let mut guard = Unrun(Some(self.clone()));
        tokio::task::spawn_blocking(move || {
            if let Some(writer) = guard.0.take() {
                writer.run();
            }
        });
    }

    /// Takes the queued writes (at most [`MAX_BATCH`]), commits them
    /// together on a pooled connection, runs alone those a conflict sent
    /// back; sends another runner for any left over.
    fn run(self: &Arc<Self>) {
        let turn = self.turn.lock();
        self.scheduled.store(false, Ordering::SeqCst);
        let jobs: Vec<Job> = {
            let mut queue = self.queue.lock();
            let n = queue.len().min(MAX_BATCH);
            queue.drain(..n).collect()
        };
        if !jobs.is_empty() {
            self.turn(jobs);
        }
        drop(turn);
        if !self.queue.lock().is_empty() && !self.scheduled.swap(true, Ordering::SeqCst) {
            self.send_runner();
        }
    }

    /// One batch, and then each job it sent back, alone.
    fn turn(&self, jobs: Vec<Job>) {
        let client = match self.handle.block_on(super::pgpool::connection(&self.pool)) {
            Ok(client) => client,
            Err(e) => {
                for mut job in jobs {
                    if let Some((_, answer)) = job(Attempt::Refused(&e)) {
                        answer(None);
                    }
                }
                return;
            }
        };
        let mut again = self.batch(&client, jobs);
        let mut read_only = again.read_only_server;
        for job in std::mem::take(&mut again.retry) {
            // alone, a conflict is its caller's to hear (as without batches)
            let alone = self.batch(&client, vec![job]);
            read_only |= alone.read_only_server;
        }
        if read_only {
            // a server that answers but takes no writes (made read-only
            // while up, SPEC §31): its connection leaves the pool, so the
            // next batch opens on a host that takes them
            drop(Object::take(client));
        }
    }

    /// Commits `jobs` in one transaction; answers them once it ended.
    fn batch(&self, client: &Object, jobs: Vec<Job>) -> Batch {
        let mut batch = Batch::default();
        // a panic outside the jobs' own (a bug here) must not leave the
        // transaction open on a pooled connection
        let ran = catch_unwind(AssertUnwindSafe(|| self.commit(client, jobs, &mut batch)));
        if let Err(panic) = ran {
            let _ = self.handle.block_on(client.batch_execute("ROLLBACK"));
            std::panic::resume_unwind(panic)
        }
        if batch.kept && batch.failed.is_none() {
            self.metrics.committed();
        }
        for answer in std::mem::take(&mut batch.answers) {
            answer(batch.failed.as_ref());
        }
        batch
    }

    /// Runs each job in its savepoint (a lone job needs none: its `Err`
    /// rolls the transaction back), then commits what was kept.
    fn commit(&self, client: &Object, jobs: Vec<Job>, batch: &mut Batch) {
        let alone = jobs.len() == 1;
        let mut begun = false;
        for mut job in jobs {
            if let Some(e) = &batch.failed {
                // the transaction is lost already: the rest are refused unrun
                batch
                    .answers
                    .extend(job(Attempt::Refused(e)).map(|(_, a)| a));
                continue;
            }
            let prefix = match (begun, alone) {
                (false, true) => BEGIN,
                (false, false) => BEGIN_SAVED,
                (true, _) => NEXT_SAVED,
            };
            let mut tx = PgTx::batched(client, self.handle.clone(), prefix);
            let ran = catch_unwind(AssertUnwindSafe(|| job(Attempt::Run(&mut tx, !alone))));
            let (sent, broken, read_only) = tx.outcome();
            begun |= sent;
            batch.read_only_server |= read_only;
            if let Some(e) = broken {
                // its savepoint, or the transaction's begin, failed
                batch.failed = Some(e);
            }
            let undo = match ran {
                Ok(Some((kept, answer))) => {
                    batch.kept |= kept;
                    batch.answers.push(answer);
                    !kept
                }
                Ok(None) => {
                    batch.retry.push(job);
                    true
                }
                // its caller learns it from the dropped answer
                Err(_) => true,
            };
            if undo && sent && !alone && batch.failed.is_none() {
                let back = self
                    .handle
                    .block_on(client.batch_execute("ROLLBACK TO job"));
                batch.failed = back.err().map(super::postgres::pg_error);
            }
        }
        self.end(client, begun, batch);
    }

    /// Commits a batch that kept writes and did not fail; rolls back any
    /// other that began.
    fn end(&self, client: &Object, begun: bool, batch: &mut Batch) {
        if !begun {
            return;
        }
        if batch.failed.is_none() && batch.kept {
            let done = self.handle.block_on(client.batch_execute("COMMIT"));
            batch.failed = done.err().map(super::postgres::pg_error);
            if batch.failed.is_none() {
                return;
            }
        }
        let _ = self.handle.block_on(client.batch_execute("ROLLBACK"));
    }
}

/// What a batch did.
#[derive(Default)]
struct Batch {
    answers: Vec<Answer>,
    /// Whether any job kept its writes.
    kept: bool,
    /// Why nothing of it was kept, if it failed.
    failed: Option<StoreError>,
    /// The jobs a conflict rolled back, to run again alone.
    retry: Vec<Job>,
    /// A statement was refused by a server that takes no writes.
    read_only_server: bool,
}

/// Sent with a lone job's first statement.
const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";
/// Sent with the first statement of a batch's first job.
const BEGIN_SAVED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; SAVEPOINT job";
/// Sent with the first statement of each later job: the savepoint
/// before it (the one before the previous job, kept or rolled back to,
/// is released).
const NEXT_SAVED: &str = "RELEASE job; SAVEPOINT job";

/// The most writes one commit holds.
const MAX_BATCH: usize = 128;

/// Whether `e` is a conflict with another transaction that running the
/// same script again may not meet: a deadlock broken by the server, or a
/// serialization failure.
fn conflict(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(m) if m.starts_with("40P01:") || m.starts_with("40001:"))
}

/// A runner not yet run: dropped so (refused by the runtime), it fails
/// the queued writes and clears the flag for the next write to send
/// another.
struct Unrun(Option<Arc<PgWriter>>);

impl Drop for Unrun {
    fn drop(&mut self) {
        if let Some(writer) = self.0.take() {
            let queued = std::mem::take(&mut *writer.queue.lock());
            writer.scheduled.store(false, Ordering::SeqCst);
            drop(queued);
        }
    }
}

#[cfg(test)]
#[path = "pgbatch_tests.rs"]
mod tests;
