//! The control plane's cost per op on PostgreSQL (SPEC §19): statements
//! (`pg_stat_statements`, when the server loads it) and commits
//! (`pg_stat_database`) of the kernel's database over a batch of background
//! ops, each from its start to its acked report; the kernel's background
//! work in the same seconds is counted too. `None` on SQLite.

use std::time::Duration;

use opkernel::drills::harness::KernelProcess;
use opkernel::store::db::pgpool;
use serde_json::json;

/// Statements and commits per op.
pub struct StoreCost {
    pub ops: usize,
    /// `None` when the server does not load `pg_stat_statements`.
    pub statements_per_op: Option<f64>,
    pub commits_per_op: f64,
}

/// The database's counters: statements run (if tracked) and commits.
async fn counters(c: &deadpool_postgres::Object) -> anyhow::Result<(Option<i64>, i64)> {
    let statements = c
        .query_one(
            "SELECT COALESCE(SUM(calls), 0)::BIGINT FROM pg_stat_statements \
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await
        .ok()
        .map(|row| row.get::<_, i64>(0));
    // pending statistics are flushed at most once a second
    let commits = c
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await?
        .get::<_, i64>(0);
    Ok((statements, commits))
}

/// The kernel database's commits so far (`None` on SQLite), after the
/// statistics of its idle connections were flushed (PostgreSQL 15 flushes
/// an idle backend's within about 10 s).
pub async fn commits(k: &KernelProcess) -> anyhow::Result<Option<i64>> {
    let Some(url) = k.postgres_url() else {
        return Ok(None);
    };
    tokio::time::sleep(Duration::from_secs(11)).await;
    let pool = pgpool::pool(&url, 1)?;
    let c = pgpool::connection(&pool).await?;
    Ok(Some(counters(&c).await?.1))
}

/// Runs `ops` background `true` ops on one warm run, one after another,
/// each to its acked report, and divides the counters' growth by `ops`.
pub async fn measure(k: &KernelProcess, ops: usize) -> anyhow::Result<Option<StoreCost>> {
    let Some(url) = k.postgres_url() else {
        return Ok(None);
    };
    let pool = pgpool::pool(&url, 1)?;
    let c = pgpool::connection(&pool).await?;
    // without the library loaded this fails, and statements go unreported
    let _ = c
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await;
    let run = format!(
        "bench-cost-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let path = format!("/v1/runs/{run}/tools/run_command");
    k.client.post(&path, &json!({"command": ["true"]})).await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = counters(&c).await?;
    for _ in 0..ops {
        let op = k.start_bg(&run, &["true"], 60).await?;
        k.wait_terminal(&op, Duration::from_secs(30)).await?;
        let got = k
            .collect_deliveries(&run, 1, Duration::from_secs(30))
            .await?;
        anyhow::ensure!(got == [op.clone()], "op {op} delivered as {got:?}");
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = counters(&c).await?;
    let per_op = |a: i64, b: i64| (a - b) as f64 / ops as f64;
    Ok(Some(StoreCost {
        ops,
        statements_per_op: after.0.zip(before.0).map(|(a, b)| per_op(a, b)),
        commits_per_op: per_op(after.1, before.1),
    }))
}
