#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The PostgreSQL control plane's ownership (SPEC §19): one kernel per
//! database, as one per home. A second `opkernel serve` on the same
//! database is refused before it recovers anything; the owner restarted
//! at once after a SIGKILL is not, and its op goes on. Against the test
//! server `scripts/test.sh` starts (`OPKERNEL_TEST_PG`), on both passes.

use std::time::Duration;

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::unique_run;

async fn database() -> String {
    let server = std::env::var("OPKERNEL_TEST_PG")
        .expect("these tests need a PostgreSQL server: OPKERNEL_TEST_PG (scripts/test.sh sets it)");
    opkernel::store::db::pgpool::create_test_database(&server)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_second_kernel_on_one_database_is_refused_and_the_owner_restarts_at_once() {
    let url = database().await;
    let env = [("OPKERNEL_STORE", url.as_str())];
    let bin = kernel_binary().unwrap();
    let mut owner = KernelProcess::start(&bin, "pgown", &env).await.unwrap();
    let run = unique_run("pgown");
    let op = owner
        .start_bg(&run, &["sh", "-c", "sleep 4; exit 6"], 60)
        .await
        .unwrap();
    owner
        .wait_state(&op, Duration::from_secs(30), |s| s["status"] == "running")
        .await
        .unwrap();

    let refused = KernelProcess::start(&bin, "pgown-b", &env).await;
    let why = format!(
        "{:#}",
        refused.err().expect("a second kernel must be refused")
    );
    assert!(
        why.contains("another opkernel serve holds this PostgreSQL control plane's ownership lock"),
        "{why}"
    );
    assert!(
        !why.contains("recovered live ops"),
        "refused before recovering: {why}"
    );

    // the owner's session ends with its process: a restart at once waits
    // for the server to notice, within the start's patience
    owner.restart().await.unwrap();
    let state = owner
        .wait_terminal(&op, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(state["status"], "completed", "{state}");
    assert_eq!(state["exit_code"], 6, "{state}");
    let delivered = owner
        .collect_deliveries(&run, 1, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(delivered, vec![op], "delivered once");
}
