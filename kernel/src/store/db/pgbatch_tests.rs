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
    let w = PgWriter::new(pool.clone(), Handle::current(), metrics.clone());
    Some((w, pool, metrics))
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
    let first = tokio::spawn({
        let w = w.clone();
        async move { w.write(hold(0.3)).await }
    });
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
    // the hold's commit, and the 17 kept writes in one more (a write the
    // test's scheduler queued late may take a third)
    let commits = commits(&metrics);
    assert!((2..=3).contains(&commits), "{commits} commits");
}

/// The server's count of deadlocks it broke in the current database.
async fn deadlocks(pool: &Pool) -> i64 {
    let client = super::super::pgpool::connection(pool).await.unwrap();
    // the statistics are a snapshot per transaction: read them afresh
    client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    let row = client
        .query_one(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .unwrap();
    row.get(0)
}

/// A write that takes tree `root`'s lock and keeps it a while (until its
/// batch commits).
fn take(root: &'static str) -> impl FnMut(&mut dyn Tx) -> StoreResult<String> + Send + 'static {
    move |tx: &mut dyn Tx| {
        tx.lock_tree(root)?;
        tx.execute("SELECT pg_sleep(0.3)", &[])?;
        Ok(root.to_owned())
    }
}

/// A write that takes tree `root`'s lock and inserts `name`.
fn then(
    root: &'static str,
    name: &'static str,
) -> impl FnMut(&mut dyn Tx) -> StoreResult<String> + Send + 'static {
    move |tx: &mut dyn Tx| {
        tx.lock_tree(root)?;
        tx.execute("INSERT INTO t (n) VALUES (?1)", vals![name])?;
        Ok(name.to_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_a_deadlock_rolled_back_runs_again_alone() {
    let Some((a, pool, _)) = writer().await else {
        return;
    };
    // a second node's writer on the same database
    let b = PgWriter::new(pool.clone(), Handle::current(), Default::default());
    let before = deadlocks(&pool).await;
    // each writer is held, then gets a batch of two: the first job takes
    // one tree and keeps it, the second waits for the tree the other
    // writer's batch keeps: the server breaks the deadlock
    let mut calls = Vec::new();
    for w in [&a, &b] {
        let w = w.clone();
        calls.push(tokio::spawn(async move { w.write(hold(0.3)).await }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (w, mine, theirs, name) in [(&a, "x", "y", "a"), (&b, "y", "x", "b")] {
        let one = w.clone();
        calls.push(tokio::spawn(async move { one.write(take(mine)).await }));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let two = w.clone();
        calls.push(tokio::spawn(
            async move { two.write(then(theirs, name)).await },
        ));
    }
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert!(deadlocks(&pool).await > before, "no deadlock was broken");
    assert_eq!(rows(&pool).await, vec!["a", "b", "taken"]);
}
