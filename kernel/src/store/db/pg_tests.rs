//! The PostgreSQL dialect against a real server: `scripts/test.sh` starts a
//! throwaway one (`scripts/pg.sh`) and sets `OPKERNEL_TEST_PG` to its URL.
//! Each test makes a database of its own. Without the variable these tests
//! say so and pass: `cargo test` alone has no server to talk to.

use std::time::{Duration, Instant};

use super::migrations::known;
use super::pgpool::{connection, migrate, pool};
use super::postgres::{dollar_placeholders, PgTx};
use super::{Tx, Value};
use crate::store::StoreError;
use crate::vals;

/// A new, empty database of the test server, as a URL.
async fn fresh_url() -> Option<String> {
    let Ok(url) = std::env::var("OPKERNEL_TEST_PG") else {
        eprintln!("OPKERNEL_TEST_PG unset: no PostgreSQL to test against");
        return None;
    };
    Some(super::pgpool::create_test_database(&url).await.unwrap())
}

/// A pool on a new, empty database of the test server.
async fn fresh_db() -> Option<deadpool_postgres::Pool> {
    Some(pool(&fresh_url().await?, 4).unwrap())
}

/// Runs `f` in one transaction on the blocking pool; commits on Ok.
async fn in_tx<T: Send + 'static>(
    pool: &deadpool_postgres::Pool,
    f: impl FnOnce(&mut dyn Tx) -> crate::store::StoreResult<T> + Send + 'static,
) -> crate::store::StoreResult<T> {
    let client = connection(pool).await?;
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut tx = PgTx::begin(&client, handle, false)?;
        match f(&mut tx) {
            Ok(v) => tx.commit().map(|()| v),
            Err(e) => {
                let _ = tx.rollback();
                Err(e)
            }
        }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn migrations_apply_once_and_a_newer_schema_is_refused_untouched() {
    let Some(pool) = fresh_db().await else { return };
    let c = connection(&pool).await.unwrap();
    let known = known();
    assert_eq!(migrate(&c).await.unwrap(), known);
    assert_eq!(
        migrate(&c).await.unwrap(),
        known,
        "a second start changes nothing"
    );
    c.batch_execute("UPDATE opkernel_schema SET version = 99")
        .await
        .unwrap();
    match migrate(&c).await {
        Err(StoreError::NewerSchema {
            found: 99,
            known: k,
        }) => assert_eq!(k, known),
        other => panic!("a newer schema was not refused: {other:?}"),
    }
    let v: i64 = c
        .query_one("SELECT version FROM opkernel_schema", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(v, 99, "the refusal changed nothing");
}

#[tokio::test(flavor = "multi_thread")]
async fn statements_round_trip_and_the_ledger_is_append_only() {
    let Some(pool) = fresh_db().await else { return };
    migrate(&connection(&pool).await.unwrap()).await.unwrap();
    let got = in_tx(&pool, |tx| {
        tx.execute(
            "INSERT INTO runs (run_id, created_at, chain) VALUES (?1, ?2, ?3)",
            vals!["r1", 1_700_000_000_000i64, "[\"r1\"]"],
        )?;
        tx.execute(
            "INSERT INTO usage (run_id, at, source, operation_id, op_ms, cpu_ms) VALUES (?1, ?2, 'op', ?3, ?4, ?5)",
            vals!["r1", 5i64, "op-1", 1500u64, None::<i64>],
        )?;
        let row = tx.query_one(
            "SELECT run_id, created_at, state, CAST(SUM(u.op_ms) AS BIGINT) AS ms, MAX(u.cpu_ms) AS cpu \
             FROM runs JOIN usage u USING (run_id) WHERE run_id = ?1 GROUP BY run_id, created_at, state",
            vals!["r1"],
        )?;
        Ok((
            row.get::<String>("run_id")?,
            row.get::<i64>("created_at")?,
            row.get::<String>("state")?,
            row.get::<u64>("ms")?,
            row.get::<Option<u64>>("cpu")?,
        ))
    })
    .await
    .unwrap();
    assert_eq!(
        got,
        ("r1".into(), 1_700_000_000_000, "active".into(), 1500, None)
    );
    let dup = in_tx(&pool, |tx| {
        tx.execute(
            "INSERT INTO runs (run_id, created_at) VALUES (?1, 1)",
            vals!["r1"],
        )
    })
    .await;
    assert!(
        matches!(&dup, Err(StoreError::Database { message: m, .. }) if m.starts_with("23505")),
        "{dup:?}"
    );
    let erased = in_tx(&pool, |tx| tx.execute("DELETE FROM usage", &[])).await;
    assert!(
        matches!(&erased, Err(StoreError::Database { message: m, .. }) if m.contains("append-only")),
        "{erased:?}"
    );
    let left = in_tx(&pool, |tx| {
        tx.scalar::<i64>("SELECT COUNT(*) FROM usage", &[])
    })
    .await;
    assert_eq!(left.unwrap(), 1);
    let nulls = in_tx(&pool, |tx| {
        tx.scalar::<Option<String>>(
            "SELECT finished_at::TEXT FROM runs WHERE run_id = ?1",
            &[Value::from("r1")],
        )
    })
    .await;
    assert_eq!(nulls.unwrap(), None);
}

/// Two transactions on one run tree run one after the other: the second
/// waits on the root's advisory lock until the first commits.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_trees_transactions_serialize_on_its_roots_row() {
    let Some(pool) = fresh_db().await else { return };
    migrate(&connection(&pool).await.unwrap()).await.unwrap();
    in_tx(&pool, |tx| {
        tx.execute(
            "INSERT INTO runs (run_id, created_at) VALUES ('root', 1), ('other', 1)",
            &[],
        )
    })
    .await
    .unwrap();
    let hold = Duration::from_millis(600);
    let first = {
        let pool = pool.clone();
        tokio::spawn(async move {
            in_tx(&pool, move |tx| {
                tx.lock_tree("root")?;
                std::thread::sleep(hold);
                Ok(Instant::now())
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let started = Instant::now();
    let other = in_tx(&pool, |tx| tx.lock_tree("other").map(|()| Instant::now()))
        .await
        .unwrap();
    assert!(
        other - started < Duration::from_millis(300),
        "another tree does not wait"
    );
    let second = in_tx(&pool, |tx| tx.lock_tree("root").map(|()| Instant::now()))
        .await
        .unwrap();
    let first_done = first.await.unwrap().unwrap();
    assert!(
        second >= first_done,
        "the second took the root's lock before the first committed"
    );
}

/// A committed event wakes a listener with its run id; an event rolled
/// back wakes nobody; a listener whose connection drops comes back and
/// wakes everyone once.
#[tokio::test(flavor = "multi_thread")]
async fn committed_events_notify_listeners_with_their_run() {
    let Some(url) = fresh_url().await else { return };
    let pool = pool(&url, 4).unwrap();
    let c = connection(&pool).await.unwrap();
    migrate(&c).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let on_event: super::pglisten::OnEvent =
        std::sync::Arc::new(move |channel: &str, run: &str| {
            if channel != crate::store::hints::CHANNEL {
                let _ = tx.send(run.to_owned());
            }
        });
    let (stop, stopped) = crate::base::sync::Stop::new();
    let listener = tokio::spawn(super::pglisten::listen(url, on_event, stopped));
    assert_eq!(
        next(&mut rx).await.as_deref(),
        Some(""),
        "connected: everyone re-reads"
    );
    let add = |run: &'static str, commit: bool| {
        let pool = pool.clone();
        async move {
            in_tx(&pool, move |tx| {
                tx.execute(
                    "INSERT INTO events (run_id, at, kind) VALUES (?1, 1, 'note.received')",
                    vals![run],
                )?;
                if commit {
                    Ok(())
                } else {
                    Err(StoreError::Corrupt("roll back".into()))
                }
            })
            .await
        }
    };
    assert!(add("gone", false).await.is_err());
    add("r1", true).await.unwrap();
    assert_eq!(
        next(&mut rx).await.as_deref(),
        Some("r1"),
        "the rolled-back one woke nobody"
    );
    // the server drops the listener's connection: it comes back
    c.batch_execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()",
    )
    .await
    .unwrap();
    assert_eq!(
        next(&mut rx).await.as_deref(),
        Some(""),
        "dropped: everyone re-reads"
    );
    assert_eq!(
        next(&mut rx).await.as_deref(),
        Some(""),
        "back: everyone re-reads"
    );
    add("r2", true).await.unwrap();
    assert_eq!(next(&mut rx).await.as_deref(), Some("r2"));
    let _ = stop.send(true);
    listener.await.unwrap();
}

/// The next run id a listener was woken with (`None` after 10 s).
async fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> Option<String> {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .ok()
        .flatten()
}

/// Every statement the store runs prepares on the PostgreSQL schema: the
/// tour of the store (`store/statements_tests.rs`) runs on a recording
/// SQLite store, then each statement it ran is prepared here (`?N` as
/// `$N`), so SQL only SQLite accepts fails this test.
#[tokio::test(flavor = "multi_thread")]
async fn every_statement_of_the_store_prepares_on_postgres() {
    let (store, seen) = crate::store::recording_test_store();
    crate::store::statements_tests::tour(&store).await;
    let statements = seen.lock().clone();
    assert!(
        statements.len() > 100,
        "the tour ran only {} statements",
        statements.len()
    );
    let Some(pool) = fresh_db().await else { return };
    let client = connection(&pool).await.unwrap();
    migrate(&client).await.unwrap();
    let mut refused = Vec::new();
    for sql in &statements {
        if let Err(e) = client.prepare(&dollar_placeholders(sql)).await {
            let e = super::postgres::pg_error(e);
            refused.push(format!("{sql}\n    -> {e}"));
        }
    }
    assert!(
        refused.is_empty(),
        "{} of {} statements do not prepare on PostgreSQL:\n{}",
        refused.len(),
        statements.len(),
        refused.join("\n")
    );
}

/// A script that panics mid-transaction leaves nothing behind: its
/// connection goes back to the pool rolled back, so the next script on it
/// (the pool has one) neither commits the half-done writes nor inherits
/// the tree's lock.
#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_script_leaves_no_half_done_transaction_in_the_pool() {
    let Some(url) = fresh_url().await else { return };
    let admin = pool(&url, 4).unwrap();
    migrate(&connection(&admin).await.unwrap()).await.unwrap();
    let one = pool(&url, 1).unwrap();
    let crashed = super::pgpool::run(&one, false, |tx| -> crate::store::StoreResult<()> {
        tx.lock_tree("root")?;
        tx.execute(
            "INSERT INTO runs (run_id, created_at) VALUES ('half', 1)",
            &[],
        )?;
        panic!("a script's bug");
    })
    .await;
    assert!(matches!(crashed, Err(StoreError::Worker(_))), "{crashed:?}");
    let after = super::pgpool::run(&one, false, |tx| {
        tx.lock_tree("root")?;
        tx.execute(
            "INSERT INTO runs (run_id, created_at) VALUES ('next', 1)",
            &[],
        )?;
        tx.scalar::<i64>("SELECT COUNT(*) FROM runs", &[])
    })
    .await;
    assert_eq!(after.unwrap(), 1, "only the next script's run is there");
}

#[tokio::test(flavor = "multi_thread")]
async fn one_owner_per_control_plane_and_a_lock_taken_while_away_is_reported() {
    use super::pgowner::{lock_key, Owner};
    let Some(url) = fresh_url().await else { return };
    let pool = pool(&url, 4).unwrap();
    let key = lock_key("kernel");
    let first = Owner::take(&url, key, Duration::ZERO).await.unwrap();
    let second = Owner::take(&url, key, Duration::from_millis(600)).await;
    assert!(
        matches!(second, Err(StoreError::Owned)),
        "a second kernel is refused"
    );
    drop(first);
    // the freed session lets the next start in, within its patience
    let first = Owner::take(&url, key, Duration::from_secs(5))
        .await
        .unwrap();
    // the holder's session is cut and another takes the lock meanwhile
    let admin = connection(&pool).await.unwrap();
    let other = connection(&pool).await.unwrap();
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks \
             WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid() \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let row = other
            .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
            .await
            .unwrap();
        if row.get::<_, bool>(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cut session's lock was never freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reason = tokio::time::timeout(Duration::from_secs(40), first.lost())
        .await
        .expect("the holder learns that another took its control plane");
    assert!(reason.contains("another opkernel serve"), "{reason}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kernels_migrating_an_empty_database_together_make_one_schema() {
    let Some(pool) = fresh_db().await else { return };
    let (a, b) = (
        connection(&pool).await.unwrap(),
        connection(&pool).await.unwrap(),
    );
    let (ra, rb) = tokio::join!(migrate(&a), migrate(&b));
    let known = known();
    assert_eq!((ra.unwrap(), rb.unwrap()), (known, known));
    let rows: i64 = a
        .query_one("SELECT COUNT(*) FROM opkernel_schema", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1, "one version row");
}

/// A run's events are numbered in commit order: an append holds its
/// tree's lock to its commit, so a later append (a higher `seq`) cannot
/// commit first and be paged past by a reader before the earlier one lands.
#[tokio::test(flavor = "multi_thread")]
async fn a_runs_events_commit_in_the_order_of_their_numbers() {
    use crate::event_kind::{EventKind, NoteReceived};
    use crate::store::journal::append_event;
    let Some(pool) = fresh_db().await else { return };
    migrate(&connection(&pool).await.unwrap()).await.unwrap();
    in_tx(&pool, |tx| {
        tx.execute("INSERT INTO runs (run_id, created_at) VALUES ('r', 1)", &[])
    })
    .await
    .unwrap();
    let note = || EventKind::NoteReceived(NoteReceived::default());
    let first = {
        let pool = pool.clone();
        tokio::spawn(async move {
            in_tx(&pool, move |tx| {
                let seq = append_event(tx, "r", None, note())?;
                std::thread::sleep(Duration::from_millis(600));
                Ok((seq, Instant::now()))
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (second_seq, second_done) = in_tx(&pool, move |tx| {
        Ok((append_event(tx, "r", None, note())?, Instant::now()))
    })
    .await
    .unwrap();
    let (first_seq, first_done) = first.await.unwrap().unwrap();
    assert!(first_seq < second_seq);
    assert!(
        second_done >= first_done,
        "the later event committed before the earlier one"
    );
}

/// Collects `store`'s hints for up to `d`.
async fn hints_within(
    store: &crate::store::Store,
    d: std::time::Duration,
) -> Vec<(crate::store::hints::HintKind, String)> {
    let deadline = std::time::Instant::now() + d;
    let mut got = Vec::new();
    while std::time::Instant::now() < deadline {
        got.extend(
            store
                .hints()
                .wait(std::time::Duration::from_millis(100))
                .await,
        );
    }
    got
}

/// A start admitted on `store` for `run`: its op.
async fn admitted(store: &crate::store::Store, run: &str) -> crate::store::Op {
    let req = crate::store::runs::tests::start(run);
    match store
        .insert_op(req, crate::store::Admission::UNLIMITED)
        .await
        .unwrap()
    {
        crate::store::NewOp::Created(op) => op,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_start_or_kill_for_another_nodes_op_hints_that_node_alone() {
    use crate::store::hints::HintKind::{Kill, Start};
    use crate::store::Store;
    let Some(url) = fresh_url().await else { return };
    let node = |name: &str| crate::store::StoreOptions {
        node: Some(name.to_owned()),
        ..Default::default()
    };
    let (n1, n2, n3) = (
        Store::connect(&url, node("n1")).await.unwrap(),
        Store::connect(&url, node("n2")).await.unwrap(),
        Store::connect(&url, node("n3")).await.unwrap(),
    );
    for (store, name) in [(&n1, "n1"), (&n2, "n2"), (&n3, "n3")] {
        store
            .join_node(name, &format!("http://{name}:7878"), 60_000)
            .await
            .unwrap();
    }
    // the listeners connect in the background: start ops on a run of n2
    // through n1 until n2 hears one
    n2.pin_run(
        "on-n2",
        "n2",
        &crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
    )
    .await
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let op = loop {
        let op = admitted(&n1, "on-n2").await;
        assert_eq!(op.node.as_deref(), Some("n2"));
        let got = hints_within(&n2, std::time::Duration::from_millis(200)).await;
        if got.contains(&(Start, op.id.clone())) {
            break op;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "n2 never heard a hint"
        );
    };
    // n3 heard none of the hints sent while the listeners came up: each
    // named n2
    let early = hints_within(&n3, std::time::Duration::from_millis(300)).await;
    assert!(early.is_empty(), "n3 kept hints for n2: {early:?}");
    // a kill taken by n1 is hinted to n2; n1's own op hints nobody
    n1.request_kill(&op.id, crate::lifecycle::KillReason::Kill)
        .await
        .unwrap();
    n1.pin_run(
        "on-n1",
        "n1",
        &crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
    )
    .await
    .unwrap();
    let own = admitted(&n1, "on-n1").await;
    assert_eq!(own.node.as_deref(), Some("n1"));
    // heard within a bound (a loaded machine delays a notification)
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !got.contains(&(Kill, op.id.clone())) && std::time::Instant::now() < deadline {
        got.extend(hints_within(&n2, std::time::Duration::from_millis(200)).await);
    }
    assert!(got.contains(&(Kill, op.id.clone())), "{got:?}");
    got.extend(hints_within(&n2, std::time::Duration::from_millis(300)).await);
    assert!(got.iter().all(|(_, id)| *id != own.id), "{got:?}");
    let heard = hints_within(&n1, std::time::Duration::from_millis(300)).await;
    assert!(heard.is_empty(), "a node does not hint itself: {heard:?}");
    let none = hints_within(&n3, std::time::Duration::from_millis(300)).await;
    assert!(none.is_empty(), "n3 keeps no hint for n2: {none:?}");
}
