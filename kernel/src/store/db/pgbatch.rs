//! Group commit on PostgreSQL: a kernel's write transactions that arrive
//! while its writer's lanes are busy wait in a queue, and a lane's next
//! turn commits many of them at once (one `BEGIN … COMMIT`, one flush of
//! the server's WAL), each inside a savepoint of its own, so that one's
//! error or panic rolls back only its own writes. As on SQLite
//! ([`super::batch`]), every caller is answered once the commit that made
//! its writes durable returned, or with that commit's error.
//!
//! A batch holds the locks its jobs took until it commits, so it is kept
//! short and never waits long for anyone: a few lanes run batches side by
//! side (independent trees proceed in parallel, SPEC §19), a batch takes
//! no new job after 25 ms, and inside a lane's turn a lock is waited for
//! at most 50 ms (5 ms once a neighbour met a conflict). A job that met a
//! lock held elsewhere (or a deadlock, or a serialization failure) is
//! rolled back (to its savepoint) and runs again alone, as a write
//! without batches would, on a connection of the pool: a batch's
//! neighbours never make a job fail that would have passed on its own,
//! and a lease renewal waiting for a row a batch holds waits for one short
//! batch at most.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{Object, Pool};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::postgres::{copy_error, pg_error, PgTx};
use super::Tx;
use crate::base::metrics::Metrics;
use crate::base::sync::Lock;
use crate::store::{StoreError, StoreResult};

/// Sends a job's result, given the batch's failure (`Some` when its
/// commit, or its begin, failed: then nothing of the batch is kept).
type Answer = Box<dyn FnOnce(Option<&StoreError>) + Send>;

/// How a job is run: on the open transaction (`in_batch`: a conflict with
/// another transaction is answered by running it again alone), or refused
/// unrun with the batch's failure.
enum Attempt<'a> {
    Run(&'a mut dyn Tx, bool),
    Refused(&'a StoreError),
}

/// A queued write: what became of it (whether its writes are kept, and
/// its answer), or `None` when it asks to be run again alone.
type Job = Box<dyn FnMut(Attempt<'_>) -> Option<(bool, Answer)> + Send>;

/// The writes waiting, and how many lanes are running.
#[derive(Default)]
struct Waiting {
    queue: VecDeque<Job>,
    lanes: usize,
}

/// A kernel's writer on its PostgreSQL pool.
pub struct PgWriter {
    pool: Pool,
    handle: Handle,
    waiting: Lock<Waiting>,
    /// How many batches may be open at once.
    lanes: usize,
    /// Where each commit is counted.
    metrics: Arc<Metrics>,
}

impl PgWriter {
    /// The writer on `pool`, with four lanes blocking on `handle`'s
    /// runtime.
    pub fn new(pool: Pool, handle: Handle, metrics: Arc<Metrics>) -> Arc<PgWriter> {
        PgWriter::with_lanes(pool, handle, metrics, LANES)
    }

    /// The writer on `pool` with `lanes` lanes (at least one).
    pub fn with_lanes(
        pool: Pool,
        handle: Handle,
        metrics: Arc<Metrics>,
        lanes: usize,
    ) -> Arc<PgWriter> {
        Arc::new(PgWriter {
            pool,
            handle,
            waiting: Lock::new(Waiting::default()),
            lanes: lanes.max(1),
            metrics,
        })
    }

    /// Runs `f` in a batch of the writer; answers once that batch
    /// committed (or with why it did not). `f`'s `Err` rolls back only
    /// `f`'s writes; `f` runs again (alone) only after a lock, a deadlock
    /// or a serialization failure rolled its first run back.
    pub async fn write<T, F>(self: &Arc<Self>, mut f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&mut dyn Tx) -> StoreResult<T> + Send + 'static,
    {
        let (send, answered) = oneshot::channel();
        let mut send = Some(send);
        let job: Job = Box::new(move |attempt| {
            let result = match attempt {
                Attempt::Run(tx, in_batch) => match f(tx) {
                    Err(e) if in_batch && conflict(&e) => return None,
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
        let start = {
            let mut waiting = self.waiting.lock();
            waiting.queue.push_back(job);
            let start = waiting.lanes < self.lanes;
            waiting.lanes += usize::from(start);
            start
        };
        if start {
            self.send_lane();
        }
        answered
            .await
            .map_err(|_| StoreError::Worker("the write transaction panicked".into()))?
    }

    /// Starts a lane on the blocking pool; one the runtime refuses (it is
    /// shutting down) is counted out again (see [`Unrun`]).
    fn send_lane(self: &Arc<Self>) {
        let mut guard = Unrun(Some(self.clone()));
        self.handle.spawn_blocking(move || {
            if let Some(writer) = guard.0.take() {
                writer.lane();
            }
        });
    }

    /// A lane: takes the queued writes (at most [`MAX_BATCH`]) and commits
    /// them together, turn after turn, until the queue is empty.
    fn lane(self: &Arc<Self>) {
        // a panic here (a bug) must not leave the lane counted
        let mut lane = Lane(Some(self.clone()), None);
        loop {
            let jobs: Vec<Job> = {
                let mut waiting = self.waiting.lock();
                if waiting.queue.is_empty() {
                    waiting.lanes -= 1;
                    lane.0 = None;
                    return;
                }
                let n = waiting.queue.len().min(MAX_BATCH);
                waiting.queue.drain(..n).collect()
            };
            self.turn(&mut lane.1, jobs);
        }
    }

    /// One batch on the lane's connection (opened when it has none).
    fn turn(self: &Arc<Self>, client: &mut Option<Object>, jobs: Vec<Job>) {
        if client.is_none() {
            match self.handle.block_on(super::pgpool::connection(&self.pool)) {
                Ok(opened) => *client = Some(opened),
                Err(e) => return refuse(jobs, &e),
            }
        }
        let Some(conn) = client.as_ref() else { return };
        let batch = self.batch(conn, jobs, true);
        for job in batch.again {
            self.send_alone(job);
        }
        // a server that answers but takes no writes (made read-only while
        // up, SPEC §31), or a connection lost or failing: it leaves the
        // pool, so the next turn opens one afresh (on a host that takes
        // writes)
        let lost = matches!(batch.failed, Some(StoreError::Unavailable(_)));
        if batch.read_only_server || lost || conn.is_closed() {
            if let Some(conn) = client.take() {
                drop(Object::take(conn));
            }
        }
    }

    /// Runs a job a conflict sent back alone, on a connection of the pool
    /// and in a transaction of its own (as a write without batches).
    fn send_alone(self: &Arc<Self>, job: Job) {
        let writer = self.clone();
        self.handle.spawn_blocking(move || {
            let client = match writer
                .handle
                .block_on(super::pgpool::connection(&writer.pool))
            {
                Ok(client) => client,
                Err(e) => return refuse(vec![job], &e),
            };
            if writer.batch(&client, vec![job], false).read_only_server {
                drop(Object::take(client));
            }
        });
    }

    /// Commits `jobs` in one transaction; answers them once it ended.
    /// `bounded`: a lane's turn, whose lock waits are bounded (a job that
    /// meets a conflict runs again alone); else a job run again alone.
    fn batch(self: &Arc<Self>, client: &Object, jobs: Vec<Job>, bounded: bool) -> Batch {
        let mut batch = Batch {
            bounded,
            ..Batch::default()
        };
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

    /// Runs each job (in a savepoint of its own when it has neighbours: a
    /// lone job's `Err` rolls the transaction back), then commits what
    /// was kept. A batch past [`BATCH_TIME`] (the waits of jobs sent back
    /// not counted) leaves its other jobs, in order, to the next turn.
    fn commit(self: &Arc<Self>, client: &Object, jobs: Vec<Job>, batch: &mut Batch) {
        let alone = jobs.len() == 1;
        let began = Instant::now();
        let mut jobs = jobs.into_iter();
        let mut begun = false;
        while let Some(mut job) = jobs.next() {
            if let Some(e) = &batch.failed {
                // the transaction is lost already: the rest are refused unrun
                batch
                    .answers
                    .extend(job(Attempt::Refused(e)).map(|(_, a)| a));
                continue;
            }
            if !alone {
                // the savepoint before this job (the one before the
                // previous job, kept or rolled back to, is released); once
                // a job met a conflict, the rest wait for locks briefly
                let savepoint = match (begun, batch.again.is_empty()) {
                    (false, _) => BEGIN_SAVED,
                    (true, true) => NEXT_SAVED,
                    (true, false) => NEXT_SAVED_BRIEF,
                };
                begun = true;
                if let Err(e) = self.handle.block_on(client.batch_execute(savepoint)) {
                    let e = pg_error(e);
                    batch
                        .answers
                        .extend(job(Attempt::Refused(&e)).map(|(_, a)| a));
                    batch.failed = Some(e);
                    continue;
                }
            }
            let at = Instant::now();
            let sent_back = batch.again.len();
            self.one(client, job, alone, &mut begun, batch);
            if batch.again.len() > sent_back {
                batch.waited += at.elapsed();
            }
            let spent = began.elapsed().saturating_sub(batch.waited);
            if !alone && batch.failed.is_none() && spent > BATCH_TIME {
                let rest: Vec<Job> = jobs.by_ref().collect();
                let mut waiting = self.waiting.lock();
                for job in rest.into_iter().rev() {
                    waiting.queue.push_front(job);
                }
            }
        }
        self.end(client, begun, alone, batch);
    }

    /// Runs one job on the open transaction; rolls it back to its
    /// savepoint when it failed, panicked or asked to run again alone.
    fn one(&self, client: &Object, mut job: Job, alone: bool, begun: &mut bool, batch: &mut Batch) {
        let begin = match batch.bounded {
            true => BEGIN_BOUNDED,
            false => BEGIN,
        };
        let mut tx = PgTx::batched(client, self.handle.clone(), alone.then_some(begin));
        let ran = catch_unwind(AssertUnwindSafe(|| {
            job(Attempt::Run(&mut tx, batch.bounded))
        }));
        let (sent, read_only) = tx.outcome();
        *begun |= sent;
        batch.read_only_server |= read_only;
        let undo = match ran {
            Ok(Some((kept, answer))) => {
                batch.kept |= kept;
                batch.answers.push(answer);
                !kept
            }
            Ok(None) => {
                batch.again.push(job);
                true
            }
            // its caller learns it from the dropped answer
            Err(_) => true,
        };
        if undo && !alone {
            let back = self
                .handle
                .block_on(client.batch_execute("ROLLBACK TO job"));
            batch.failed = back.err().map(pg_error);
        }
    }

    /// Commits a batch that kept writes and did not fail
    /// ([`BATCH_COMMIT`]); rolls back any other that began.
    fn end(&self, client: &Object, begun: bool, alone: bool, batch: &mut Batch) {
        if !begun {
            return;
        }
        if batch.failed.is_none() && batch.kept {
            let commit = match (alone, batch.bounded) {
                (false, _) => BATCH_COMMIT,
                (true, true) => BOUNDED_COMMIT,
                (true, false) => "COMMIT",
            };
            let done = self.handle.block_on(client.batch_execute(commit));
            batch.failed = done.err().map(pg_error);
            if batch.failed.is_none() {
                return;
            }
        }
        let _ = self.handle.block_on(client.batch_execute("ROLLBACK"));
    }
}

/// Answers each of `jobs` with `e`, unrun.
fn refuse(jobs: Vec<Job>, e: &StoreError) {
    for mut job in jobs {
        if let Some((_, answer)) = job(Attempt::Refused(e)) {
            answer(None);
        }
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
    again: Vec<Job>,
    /// How long they ran before they were sent back.
    waited: Duration,
    /// A lane's turn: lock waits are bounded, conflicts sent back.
    bounded: bool,
    /// A statement was refused by a server that takes no writes.
    read_only_server: bool,
}

/// How many batches of one kernel may be open at once.
const LANES: usize = 4;
/// The most writes one commit holds (each a subtransaction: the server
/// keeps 64 of a transaction's in its cache).
const MAX_BATCH: usize = 64;
/// A batch open this long takes no new job: it commits, and the jobs it
/// took but did not run go to the next turn.
const BATCH_TIME: Duration = Duration::from_millis(25);

/// A job run again alone: it waits for locks as long as it must.
const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";
/// A lane's lone job: it waits for a lock at most 50 ms (`lock_timeout`),
/// then runs again alone.
const BEGIN_BOUNDED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = 50";
/// Before a batch's first job: each job waits for a lock at most 50 ms.
const BEGIN_SAVED: &str =
    "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = 50; SAVEPOINT job";
/// Before each later job.
const NEXT_SAVED: &str = "RELEASE job; SAVEPOINT job";
/// Before each job after one that met a conflict: the lock it met may be
/// the next one's too, so the rest wait 5 ms at most.
const NEXT_SAVED_BRIEF: &str = "RELEASE job; SET LOCAL lock_timeout = 5; SAVEPOINT job";
/// A batch's commit: its last savepoint released first (on a transaction
/// some statement broke, that fails where a `COMMIT` would quietly roll
/// back), and the lock bound lifted, as the commit's own waits (a
/// notification's turn in the server's queue) are no neighbour's conflict.
const BATCH_COMMIT: &str = "RELEASE job; SET LOCAL lock_timeout TO DEFAULT; COMMIT";
/// A lane's lone job's commit, its bound lifted.
const BOUNDED_COMMIT: &str = "SET LOCAL lock_timeout TO DEFAULT; COMMIT";

/// Whether `e` is a conflict with another transaction that the same
/// script run alone may not meet: a lock not granted within the batch's
/// wait, a deadlock broken by the server, a serialization failure.
fn conflict(e: &StoreError) -> bool {
    let message = match e {
        StoreError::Unavailable(m) => m,
        StoreError::Database { message, .. } => message,
        _ => return false,
    };
    ["55P03:", "40P01:", "40001:"]
        .iter()
        .any(|code| message.starts_with(code))
}

/// A lane that ended without counting itself out (a panic): counts it
/// out, and starts another when writes still wait.
struct Lane(Option<Arc<PgWriter>>, Option<Object>);

impl Drop for Lane {
    fn drop(&mut self) {
        if let Some(writer) = self.0.take() {
            writer.waiting.lock().lanes -= 1;
            Unrun(Some(writer)).restart();
        }
    }
}

/// A lane not yet run: dropped so (refused by the runtime), it is counted
/// out; the writes waiting then are failed when no lane is left to take
/// them.
struct Unrun(Option<Arc<PgWriter>>);

impl Unrun {
    /// Starts a lane again for the writes still waiting, if none runs.
    fn restart(mut self) {
        let Some(writer) = self.0.take() else { return };
        let start = {
            let mut waiting = writer.waiting.lock();
            let start = waiting.lanes == 0 && !waiting.queue.is_empty();
            waiting.lanes += usize::from(start);
            start
        };
        if start {
            writer.send_lane();
        }
    }
}

impl Drop for Unrun {
    fn drop(&mut self) {
        if let Some(writer) = self.0.take() {
            let queued = {
                let mut waiting = writer.waiting.lock();
                waiting.lanes -= 1;
                match waiting.lanes {
                    0 => std::mem::take(&mut waiting.queue),
                    _ => VecDeque::new(),
                }
            };
            drop(queued);
        }
    }
}

#[cfg(test)]
#[path = "pgbatch_tests.rs"]
mod tests;
