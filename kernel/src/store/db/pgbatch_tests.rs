//! The PostgreSQL writer against a real server (`OPKERNEL_TEST_PG`, as
//! in `pg_tests.rs`; without it these tests say so and pass).

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::vals;

/// A writer on a new database of the test server with a table `t`, its
/// pool (for reads), and the metrics it counts commits in.
async fn writer() -> Option<(Arc<PgWriter>, Pool, Arc<Metrics>)> {
    let Ok(url) = std::env::var("OPKERNEL_TEST_PG") else {
        eprintln!("OPKERNEL_TEST_PG unset: no PostgreSQL to test against");
        return None;
    };
    let url = super::super::pgpool::create_test_database(&url)
        .await
        .unwrap();
    let pool = super::super::pgpool::pool(&url, 4).unwrap();
    let client = super::super::pgpool::connection(&pool).await.unwrap();
    client
        .batch_execute("CREATE TABLE t (n TEXT PRIMARY KEY); INSERT INTO t (n) VALUES ('taken')")
        .await
        .unwrap();
    let metrics: Arc<Metrics> = Default::default();
    // one lane: the writes sent while it is busy make one batch
    let w = PgWriter::with_lanes(pool.clone(), Handle::current(), metrics.clone(), 1);
    Some((w, pool, metrics))
}

/// Another node's transaction on `pool`, begun with `sql` (taking a lock
/// it keeps until the test commits it).
async fn elsewhere(pool: &Pool, sql: &str) -> Object {
    let other = super::super::pgpool::connection(pool).await.unwrap();
    other.batch_execute(&format!("BEGIN; {sql}")).await.unwrap();
    other
}

/// `f` written by `w` in a task of its own.
fn spawn_write(
    w: &Arc<PgWriter>,
    f: impl FnMut(&mut dyn Tx) -> StoreResult<String> + Send + 'static,
) -> tokio::task::JoinHandle<StoreResult<String>> {
    let w = w.clone();
    tokio::spawn(async move { w.write(f).await })
}

fn insert(n: &str) -> impl FnMut(&mut dyn Tx) -> StoreResult<String> + Send + 'static {
    let n = n.to_owned();
    move |tx: &mut dyn Tx| {
        tx.execute("INSERT INTO t (n) VALUES (?1)", vals![n.clone()])?;
        Ok(n.clone())
    }
}

async fn rows(pool: &Pool) -> Vec<String> {
    let client = super::super::pgpool::connection(pool).await.unwrap();
    let rows = client
        .query("SELECT n FROM t ORDER BY n", &[])
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

fn commits(metrics: &Metrics) -> u32 {
    let text = metrics.render(&Default::default());
    text.lines()
        .find_map(|l| l.strip_prefix("opkernel_store_commits_total "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// A write that holds the writer for `secs` (the writes sent meanwhile
/// queue for its next batch).
fn hold(secs: f64) -> impl FnMut(&mut dyn Tx) -> StoreResult<String> + Send + 'static {
    move |tx: &mut dyn Tx| {
        tx.execute("SELECT pg_sleep(?1)", vals![secs])?;
        Ok("held".into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_writes_commit_together_and_fail_alone() {
    let Some((w, pool, metrics)) = writer().await else {
        return;
    };
    let first = spawn_write(&w, hold(0.3));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut calls = Vec::new();
    for n in 0..20 {
        let w = w.clone();
        let name = format!("n{n:02}");
        calls.push(tokio::spawn(async move {
            match n {
                // an error rolls back its own insert only
                5 => {
                    w.write(move |tx: &mut dyn Tx| {
                        tx.execute("INSERT INTO t (n) VALUES ('n05')", &[])?;
                        Err::<String, _>(StoreError::Corrupt("refused".into()))
                    })
                    .await
                }
                // a panic too, and its caller hears of it
                7 => {
                    w.write(move |tx: &mut dyn Tx| {
                        tx.execute("INSERT INTO t (n) VALUES ('n07')", &[])?;
                        panic!("a script's bug")
                    })
                    .await
                }
                // a duplicate key fails this write, not its neighbours
                9 => w.write(insert("taken")).await,
                _ => w.write(insert(&name)).await,
            }
        }));
    }
    assert_eq!(first.await.unwrap().unwrap(), "held");
    for (n, call) in calls.into_iter().enumerate() {
        let answer = call.await.unwrap();
        match n {
            5 => assert!(matches!(answer, Err(StoreError::Corrupt(_))), "{answer:?}"),
            7 => assert!(matches!(answer, Err(StoreError::Worker(_))), "{answer:?}"),
            9 => assert!(
                matches!(answer, Err(StoreError::Database { .. })),
                "{answer:?}"
            ),
            _ => assert_eq!(answer.unwrap(), format!("n{n:02}")),
        }
    }
    let mut want: Vec<String> = (0..20)
        .filter(|n| ![5, 7, 9].contains(n))
        .map(|n| format!("n{n:02}"))
        .collect();
    want.push("taken".into());
    assert_eq!(rows(&pool).await, want);
    // the hold's commit, the first writes each on a lane still free, then
    // the rest together (fewer commits than writes, at any rate)
    let commits = commits(&metrics);
    assert!(
        (2..=super::LANES as u32 + 3).contains(&commits),
        "{commits} commits"
    );
}

/// A write that inserts `name`, waits for tree `root`'s lock, then
/// inserts `name` again with a mark.
fn then(
    root: &'static str,
    name: &'static str,
) -> impl FnMut(&mut dyn Tx) -> StoreResult<String> + Send + 'static {
    move |tx: &mut dyn Tx| {
        tx.execute(
            "INSERT INTO t (n) VALUES (?1)",
            vals![format!("{name}-pre")],
        )?;
        tx.lock_tree(root)?;
        tx.execute("INSERT INTO t (n) VALUES (?1)", vals![name])?;
        Ok(name.to_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_meets_a_lock_runs_again_alone_and_its_neighbours_go_on() {
    let Some((w, pool, _)) = writer().await else {
        return;
    };
    // another node's transaction holds tree `y` for a second
    let other = elsewhere(
        &pool,
        "SELECT pg_advisory_xact_lock(hashtextextended('y', 0))",
    )
    .await;
    let held = spawn_write(&w, hold(0.3));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // one batch of three: the middle one waits for `y` past the batch's
    // bound, so it is rolled back (its first insert too) and runs alone
    let mut calls = Vec::new();
    type Script = Box<dyn FnMut(&mut dyn Tx) -> StoreResult<String> + Send>;
    let scripts: [Script; 3] = [
        Box::new(insert("n1")),
        Box::new(then("y", "a")),
        Box::new(insert("n2")),
    ];
    for f in scripts {
        calls.push(spawn_write(&w, f));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.await.unwrap().unwrap();
    let mut calls = calls.into_iter();
    let (n1, a, n2) = (
        calls.next().unwrap(),
        calls.next().unwrap(),
        calls.next().unwrap(),
    );
    assert_eq!(n1.await.unwrap().unwrap(), "n1");
    assert_eq!(n2.await.unwrap().unwrap(), "n2");
    assert!(
        !a.is_finished(),
        "the job waiting for `y` ended while `y` was held"
    );
    other.batch_execute("COMMIT").await.unwrap();
    assert_eq!(a.await.unwrap().unwrap(), "a");
    assert_eq!(rows(&pool).await, vec!["a", "a-pre", "n1", "n2", "taken"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_broke_the_transaction_fails_its_batch_rather_than_commit_nothing() {
    let Some((w, pool, _)) = writer().await else {
        return;
    };
    let held = spawn_write(&w, hold(0.3));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = spawn_write(&w, insert("n1"));
    tokio::time::sleep(Duration::from_millis(10)).await;
    // the batch's last script swallows a statement's error (none of the
    // store's does): the transaction is aborted, and a bare COMMIT would
    // answer as if it committed
    let broken = tokio::spawn({
        let w = w.clone();
        async move {
            w.write(|tx: &mut dyn Tx| {
                let _ = tx.execute("SELECT 1 / 0", &[]);
                Ok("swallowed".to_owned())
            })
            .await
        }
    });
    held.await.unwrap().unwrap();
    assert!(before.await.unwrap().is_err());
    assert!(broken.await.unwrap().is_err());
    assert_eq!(rows(&pool).await, vec!["taken"]);
    // the writer goes on
    assert_eq!(w.write(insert("n2")).await.unwrap(), "n2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_write_holds_one_lane_and_the_others_go_on() {
    let Some((_, pool, metrics)) = writer().await else {
        return;
    };
    let w = PgWriter::new(pool.clone(), Handle::current(), metrics);
    let held = spawn_write(&w, hold(1.0));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let quick = tokio::time::timeout(Duration::from_millis(800), w.write(insert("n1"))).await;
    assert_eq!(
        quick
            .expect("a write waited for another lane's batch")
            .unwrap(),
        "n1"
    );
    assert!(!held.is_finished());
    held.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_commit_waits_for_what_the_commit_itself_waits_for() {
    let Some((w, pool, _)) = writer().await else {
        return;
    };
    // work done at commit that waits for a lock held elsewhere, as a
    // notification waits for the server's queue under load
    let client = super::super::pgpool::connection(&pool).await.unwrap();
    client
        .batch_execute(
            "CREATE FUNCTION at_commit() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_advisory_xact_lock(42); RETURN NULL; END $$; \
             CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON t \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION at_commit()",
        )
        .await
        .unwrap();
    let other = elsewhere(&pool, "SELECT pg_advisory_xact_lock(42)").await;
    let held = spawn_write(&w, hold(0.3));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut calls = Vec::new();
    for n in ["n1", "n2"] {
        calls.push(spawn_write(&w, insert(n)));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    other.batch_execute("COMMIT").await.unwrap();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(rows(&pool).await, vec!["n1", "n2", "taken"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_write_that_meets_a_lock_frees_its_lane() {
    let Some((w, pool, _)) = writer().await else {
        return;
    };
    let other = elsewhere(
        &pool,
        "SELECT pg_advisory_xact_lock(hashtextextended('y', 0))",
    )
    .await;
    // alone on the writer's one lane, it waits for `y` past the lane's
    // bound and goes on waiting off the lane
    let a = spawn_write(&w, then("y", "a"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let quick = tokio::time::timeout(Duration::from_millis(800), w.write(insert("n1"))).await;
    assert_eq!(quick.expect("the lane waited for `y`").unwrap(), "n1");
    assert!(!a.is_finished());
    other.batch_execute("COMMIT").await.unwrap();
    assert_eq!(a.await.unwrap().unwrap(), "a");
    assert_eq!(rows(&pool).await, vec!["a", "a-pre", "n1", "taken"]);
}
