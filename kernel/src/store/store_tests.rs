use crate::lifecycle::Status;

#[test]
fn a_database_from_a_newer_kernel_is_refused_and_left_alone() {
    let path = std::env::temp_dir().join(format!("opkernel-newer-{}.db", uuid::Uuid::new_v4()));
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    let before = std::fs::read(&path).unwrap();
    match super::Store::open(&path, Default::default()) {
        Err(e @ super::StoreError::NewerSchema { found: 99, .. }) => {
            assert!(e.to_string().contains("written by a newer opkernel"), "{e}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a newer database was opened"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), before, "the file changed");
    assert!(!path.with_extension("db-wal").exists());
    let _ = std::fs::remove_file(&path);
}

#[test]
fn schema_check_lists_every_status() {
    // the latest migration that (re)creates the ops table
    let sql = super::db::migrations::MIGRATIONS[5].sqlite;
    for s in Status::ALL {
        assert!(sql.contains(&format!("'{}'", s.as_str())), "{s:?}");
    }
    assert!(sql.contains(&format!(
        "WHERE status IN ({})",
        crate::lifecycle::live_sql()
    )));
}

#[tokio::test]
async fn failed_attempts_count_in_a_row_only() {
    use crate::store::{Admission, AttemptStart, NewOp, StartRequest};
    let store = super::test_store().await;
    let req = StartRequest {
        run_id: "r".into(),
        scratch_key: "k".into(),
        command: vec!["true".into()],
        background: true,
        timeout_sec: 60,
        io: sandbox::Io::Null,
        idempotency_key: None,
        approval: None,
        schedule_id: None,
        origin: crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
    };
    let NewOp::Created(op) = store.insert_op(req, Admission::UNLIMITED).await.unwrap() else {
        panic!()
    };
    let begin = |start| {
        let store = store.clone();
        let id = op.id.clone();
        async move { store.begin_attempt(&id, "k", start).await.unwrap().unwrap() }
    };
    // three transient failures, each after a healthy stretch: never 3 in a row
    for _ in 0..3 {
        assert_eq!(
            begin(AttemptStart::AfterIsolatedFailure)
                .await
                .failed_attempts,
            1
        );
    }
    assert_eq!(
        begin(AttemptStart::AfterFailureInARow)
            .await
            .failed_attempts,
        2
    );
    assert_eq!(
        begin(AttemptStart::AfterFailureInARow)
            .await
            .failed_attempts,
        3
    );
    assert_eq!(begin(AttemptStart::Clean).await.failed_attempts, 3);
    assert_eq!(
        begin(AttemptStart::AfterIsolatedFailure)
            .await
            .failed_attempts,
        1
    );
}

#[test]
fn a_version_5_database_upgrades_with_its_rows() {
    let path = std::env::temp_dir().join(format!("opkernel-v5-{}.db", uuid::Uuid::new_v4()));
    {
        let mut conn = rusqlite::Connection::open(&path).unwrap();
        for m in &super::db::migrations::MIGRATIONS[..5] {
            let tx = conn.transaction().unwrap();
            tx.execute_batch(m.sqlite).unwrap();
            tx.pragma_update(None, "user_version", m.version).unwrap();
            tx.commit().unwrap();
        }
        conn.execute_batch(
            "INSERT INTO runs (run_id, created_at) VALUES ('r', 1);
             INSERT INTO ops (id, run_id, command, background, timeout_sec, status, scratch_key, created_at, exit_code)
             VALUES ('00000000-0000-4000-8000-000000000001', 'r', '[\"true\"]', 1, 60, 'completed', 'k', 1, 0);",
        )
        .unwrap();
    }
    let store = super::Store::open(&path, Default::default()).unwrap();
    let super::Backend::Sqlite { writer } = &store.backend else {
        unreachable!("an SQLite store")
    };
    let conn = writer.conn().lock();
    let (status, code): (String, i64) = conn
        .query_row("SELECT status, exit_code FROM ops", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((status.as_str(), code), ("completed", 0));
    let leftovers: i64 = conn
        .query_row("SELECT leftovers FROM ops", [], |r| r.get(0))
        .unwrap();
    assert_eq!(leftovers, 0, "rows settled before the count stopped none");
    let n: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM pragma_table_info('runs') WHERE name = 'paused_by'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn reopening_keeps_the_schema_version() {
    let path = std::env::temp_dir().join(format!("opkernel-mig-{}.db", uuid::Uuid::new_v4()));
    drop(super::Store::open(&path, Default::default()).unwrap());
    let store = super::Store::open(&path, Default::default()).unwrap();
    let v: i64 = store
        .call(|c| Ok(c.pragma_query_value(None, "user_version", |r| r.get(0))?))
        .await
        .unwrap();
    assert_eq!(v, super::db::migrations::MIGRATIONS.len() as i64);
}
