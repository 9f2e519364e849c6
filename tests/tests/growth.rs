#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Bounded growth (SPEC §21) against the real engine: handover files leave
//! the inbox, delivered ops' files leave after their retention (the log
//! endpoint then says 410), finished run trees leave the control plane,
//! and a short soak shows the database and the kernel's memory level off.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::{unique_run, KernelProcessExt};
use reqwest::Method;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

async fn kernel(tag: &str, env: &[(&str, &str)]) -> KernelProcess {
    KernelProcess::start(&kernel_binary().unwrap(), tag, env)
        .await
        .unwrap()
}

fn ops_dir(k: &KernelProcess, run: &str) -> PathBuf {
    k.home
        .join("scratch")
        .join(sandbox::profile::scratch_key(run))
        .join(".ops")
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

async fn call(k: &KernelProcess, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    k.client
        .request(method, path, body.as_ref(), &[])
        .await
        .unwrap()
}

/// Drains and acks every report of the run until nothing is pending.
async fn deliver_all(k: &KernelProcess, run: &str) -> usize {
    let mut delivered = 0;
    loop {
        let (s, v) = call(
            k,
            Method::GET,
            &format!("/v1/runs/{run}/report?wait=0"),
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        let Some(id) = v["report_id"].as_str() else {
            return delivered;
        };
        delivered += v["resolved"].as_array().unwrap().len();
        let (s, _) = call(
            k,
            Method::POST,
            &format!("/v1/runs/{run}/report/{id}/ack"),
            None,
        )
        .await;
        assert_eq!(s, 200);
    }
}

async fn poll<F: Fn() -> bool>(what: &str, limit: Duration, ok: F) {
    let until = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < until, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Issue 22, defect 7: every op used to leave `inbox/<id>.claimed` (up to
/// 256 KiB of argv) for the life of its container.
#[tokio::test]
async fn handover_files_leave_the_inbox_when_their_op_settles() {
    // a short files' retention makes the retention pass (and its inbox
    // sweep) run every 2 s instead of every minute; no op here is delivered,
    // so none of their files is pruned
    let k = kernel("inbox", &[("OPKERNEL_OP_FILES_RETENTION", "4s")]).await;
    let run = unique_run("inbox");
    let mut ops = Vec::new();
    for i in 0..5 {
        ops.push(
            k.start_bg(&run, &["sh", "-c", &format!("echo {i}")], 60)
                .await
                .unwrap(),
        );
    }
    for op in &ops {
        let s = k.wait_terminal(op, T).await.unwrap();
        assert_eq!(s["status"], "completed", "{s}");
    }
    let inbox = ops_dir(&k, &run).join("inbox");
    // the launcher took them (the op files exist) and the inbox is empty
    assert!(names(&ops_dir(&k, &run))
        .iter()
        .any(|n| n.ends_with(".code")));
    poll("an empty inbox", Duration::from_secs(5), || {
        names(&inbox)
            .iter()
            .all(|n| !n.ends_with(".claimed") && !n.ends_with(".req"))
    })
    .await;
    // a leftover from a crash (a settled op's claim) is swept
    std::fs::write(inbox.join(format!("{}.claimed", ops[0])), b"x").unwrap();
    poll(
        "the sweep of a stale claim",
        Duration::from_secs(15),
        || names(&inbox).is_empty(),
    )
    .await;
}

#[tokio::test]
async fn delivered_ops_files_leave_after_their_retention() {
    let k = kernel("files", &[("OPKERNEL_OP_FILES_RETENTION", "2s")]).await;
    let run = unique_run("files");
    let op = k
        .start_bg(&run, &["sh", "-c", "echo kept-tail"], 60)
        .await
        .unwrap();
    let live = k.start_bg(&run, &["sleep", "60"], 120).await.unwrap();
    k.wait_terminal(&op, T).await.unwrap();
    let (s, _) = call(&k, Method::GET, &format!("/v1/operations/{op}/log"), None).await;
    assert_eq!(s, 200);
    // not delivered yet: kept however old
    tokio::time::sleep(Duration::from_secs(4)).await;
    let dir = ops_dir(&k, &run);
    assert!(dir.join(format!("{op}.log")).exists());
    assert_eq!(deliver_all(&k, &run).await, 1);
    poll(
        "the files of a delivered op to go",
        Duration::from_secs(10),
        || !dir.join(format!("{op}.log")).exists(),
    )
    .await;
    assert!(!dir.join(format!("{op}.code")).exists() && !dir.join(format!("{op}.pid")).exists());
    let (s, v) = call(&k, Method::GET, &format!("/v1/operations/{op}/log"), None).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (410, Some("log_pruned")),
        "{v}"
    );
    let (s, _) = call(
        &k,
        Method::GET,
        &format!("/v1/operations/{op}/console"),
        None,
    )
    .await;
    assert_eq!(s, 410);
    let state = k.state(&op).await.unwrap();
    assert!(
        state["log_sha256"].is_string()
            && state["output_tail"].as_str().unwrap().contains("kept-tail")
    );
    // the live op's files stay
    assert!(dir.join(format!("{live}.pid")).exists());
}

#[tokio::test]
async fn a_finished_run_tree_leaves_the_control_plane() {
    let env = [
        ("OPKERNEL_RETENTION", "3s"),
        ("OPKERNEL_OP_FILES_RETENTION", "1s"),
    ];
    let k = kernel("purge", &env).await;
    let (gone, kept) = (unique_run("gone"), unique_run("kept"));
    let (s, v) = call(&k, Method::POST, "/v1/runs", Some(json!({"run_id": gone}))).await;
    assert_eq!(s, 200, "{v}");
    let op = k.start_bg(&gone, &["true"], 60).await.unwrap();
    let busy = k.start_bg(&kept, &["sleep", "60"], 120).await.unwrap();
    k.wait_terminal(&op, T).await.unwrap();
    // undelivered: kept
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (s, _) = call(&k, Method::GET, &format!("/v1/runs/{gone}"), None).await;
    assert_eq!(s, 200);
    deliver_all(&k, &gone).await;
    let (s, v) = call(
        &k,
        Method::POST,
        &format!("/v1/runs/{gone}/complete"),
        Some(json!({"summary": "done"})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let (s, _) = call(&k, Method::GET, &format!("/v1/runs/{gone}"), None).await;
        if s == 404 {
            break;
        }
        assert!(Instant::now() < until, "the finished tree was not purged");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (s, _) = call(&k, Method::GET, &format!("/v1/operations/{op}"), None).await;
    assert_eq!(s, 404);
    assert_eq!(k.state(&busy).await.unwrap()["status"], "running");
    let journal = k
        .sql_offline_query("SELECT COUNT(*) FROM kernel_journal WHERE kind = 'run_tree.purged'")
        .unwrap();
    assert!(journal >= 1, "the purge is in the kernel journal");
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The control plane's size: SQLite's files in bytes; on PostgreSQL (whose
/// files are the server's) the rows of every table, scaled to a byte-like
/// figure (a row ~ 1 KiB) so the same margins apply.
fn db_bytes(k: &KernelProcess) -> u64 {
    if k.on_postgres() {
        return opkernel_tests::pg_rows(k) as u64 * 1024;
    }
    let sizes: Vec<u64> = ["kernel.db", "kernel.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(k.home.join(f)).ok())
        .map(|m| m.len())
        .collect();
    assert!(
        !sizes.is_empty(),
        "no kernel.db read in {}",
        k.home.display()
    );
    sizes.iter().sum()
}

/// A short soak: rounds of fresh runs, each with ops, reports and a
/// completion, under small retentions. The database and the kernel's RSS
/// level off instead of growing with the rounds.
#[tokio::test]
async fn a_soak_levels_off_under_small_retentions() {
    let env = [
        ("OPKERNEL_OP_FILES_RETENTION", "1s"),
        ("OPKERNEL_RETENTION", "2s"),
    ];
    let k = kernel("soak", &env).await;
    let mut figures = Vec::new();
    for round in 0..8 {
        for r in 0..4 {
            let run = unique_run(&format!("soak{round}-{r}"));
            let mut ops = Vec::new();
            for i in 0..5 {
                let script = format!("head -c 20000 /dev/zero | tr '\\0' x; echo {i}");
                ops.push(k.start_bg(&run, &["sh", "-c", &script], 60).await.unwrap());
            }
            for op in &ops {
                k.wait_terminal(op, T).await.unwrap();
            }
            deliver_all(&k, &run).await;
            let (s, v) = call(
                &k,
                Method::POST,
                &format!("/v1/runs/{run}/complete"),
                Some(json!({"summary": "ok"})),
            )
            .await;
            assert_eq!(s, 200, "{v}");
        }
        // two passes of the retention loop (1 s apart at these settings)
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (s, v) = call(&k, Method::GET, "/v1/runs?limit=1000", None).await;
        assert_eq!(s, 200);
        let runs = v["runs"].as_array().unwrap().len();
        figures.push((round, db_bytes(&k), rss_kb(k.pid().unwrap()), runs));
    }
    println!("soak figures (round, db bytes, rss kB, runs kept): {figures:?}");
    // the runs of old rounds are gone: only the last rounds' remain
    let kept = figures.last().unwrap().3;
    assert!(kept <= 8, "runs pile up: {figures:?}");
    // past the warm-up the database and RSS stay level: the last rounds
    // are within a margin of round 3's
    let (_, db3, rss3, _) = figures[3];
    for &(round, db, rss, _) in &figures[4..] {
        assert!(
            db <= db3 + db3 / 2 + (256 << 10),
            "db grows at round {round}: {figures:?}"
        );
        assert!(
            rss <= rss3 + rss3 / 4 + 8192,
            "rss grows at round {round}: {figures:?}"
        );
    }
}
