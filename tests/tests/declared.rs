#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Declared schedules (SPEC §28; seed 000): the operator's TOML file,
//! reconciled at each start against the real engine and either store.
//! Created, updated in place (id, claim and history kept), removed;
//! schedules made through the API untouched; the API refuses to delete a
//! declared one; a file followed before (an older copy) is not applied
//! again; a kernel SIGKILLed inside the reconciliation applies it whole at
//! its next start; a bad file stops the start naming its line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::{unique_run, wait_for};
use reqwest::Method;
use serde_json::{json, Value};

fn entry(name: &str, run: &str, timing: &str, timeout: u64) -> String {
    format!(
        "[[schedule]]\nname = \"{name}\"\nrun = \"{run}\"\ncommand = [\"true\"]\n{timing}\ntimeout_sec = {timeout}\n\n"
    )
}

/// The declared schedules (by name, from their key) and the API's own.
async fn schedules(k: &KernelProcess) -> Vec<Value> {
    let v = k.client.get("/v1/schedules").await.unwrap();
    v["schedules"].as_array().unwrap().clone()
}

fn declared<'a>(all: &'a [Value], run: &str, timeout: u64) -> Option<&'a Value> {
    all.iter()
        .find(|s| s["run_id"] == run && s["source"] == "config" && s["timeout_sec"] == timeout)
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

struct Runs {
    a: String,
    b: String,
    c: String,
}

/// v1: a ticking one on `a` and a nightly one on `b`.
fn v1(r: &Runs) -> String {
    entry("tick", &r.a, "every_sec = 1", 30) + &entry("nightly", &r.b, "cron = \"0 3 * * *\"", 60)
}

/// v2: `tick` changed (its timeout), `nightly` gone, `hourly` new on `c`.
fn v2(r: &Runs) -> String {
    entry("tick", &r.a, "every_sec = 1", 45) + &entry("hourly", &r.c, "every_sec = 3600", 60)
}

#[tokio::test]
async fn declared_schedules_are_reconciled_at_each_start() {
    let dir = std::env::temp_dir().join(format!("opk-declared-{}", &unique_run("d")[2..]));
    std::fs::create_dir_all(&dir).unwrap();
    let file: PathBuf = dir.join("schedules.toml");
    let runs = Runs {
        a: unique_run("da"),
        b: unique_run("db"),
        c: unique_run("dc"),
    };
    write(&file, &v1(&runs));
    let path = file.display().to_string();
    let bin = kernel_binary().unwrap();
    let mut k = KernelProcess::start(&bin, "declared", &[("OPKERNEL_SCHEDULES", &path)])
        .await
        .unwrap();
    let all = schedules(&k).await;
    let tick = declared(&all, &runs.a, 30).expect("tick declared").clone();
    assert_eq!(tick["declared_in"], path.as_str(), "{tick}");
    assert!(declared(&all, &runs.b, 60).is_some(), "{all:?}");
    // the API's own schedule beside them, and the API refusing a declared one
    let body = json!({"command": ["true"], "every_sec": 3600});
    let own = k
        .client
        .post(&format!("/v1/runs/{}/schedules", runs.a), &body)
        .await
        .unwrap();
    assert_eq!(own["schedule"]["source"], "api");
    let id = tick["schedule_id"].as_str().unwrap().to_owned();
    let path_of = format!("/v1/runs/{}/schedules/{id}", runs.a);
    let (s, v) = k
        .client
        .request(Method::DELETE, &path_of, None, &[])
        .await
        .unwrap();
    assert_eq!(s, 409, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains(&format!("declared in {path}")));
    // it fires: its history, to keep across the update
    let fired = wait_for("tick's first fire", Duration::from_secs(30), || async {
        let s = k.client.get(&path_of).await.ok()?;
        s["last_operation_id"].as_str().map(str::to_owned)
    })
    .await;
    // v2 at the next start: updated in place, removed, created
    write(&file, &v2(&runs));
    k.restart().await.unwrap();
    let all = schedules(&k).await;
    let tick = declared(&all, &runs.a, 45).expect("tick updated").clone();
    assert_eq!(
        tick["schedule_id"],
        id.as_str(),
        "the same schedule: {tick}"
    );
    assert!(
        tick["last_operation_id"].is_string(),
        "its history kept: {tick} (fired {fired})"
    );
    assert!(
        all.iter().all(|s| s["run_id"] != runs.b.as_str()),
        "nightly removed: {all:?}"
    );
    assert!(
        declared(&all, &runs.c, 60).is_some(),
        "hourly created: {all:?}"
    );
    let own_id = own["schedule_id"].clone();
    assert!(
        all.iter().any(|s| s["schedule_id"] == own_id),
        "the API's own untouched"
    );
    older_file_and_crash_midway(&mut k, &file, &runs, &id).await;
    drop(k);
    let _ = std::fs::remove_dir_all(&dir);
}

/// v1 again is an older copy: not applied. v3 with the kernel SIGKILLed
/// inside the reconciliation: nothing of it is seen, and the next start
/// applies it whole.
async fn older_file_and_crash_midway(k: &mut KernelProcess, file: &Path, runs: &Runs, id: &str) {
    write(file, &v1(runs));
    k.restart().await.unwrap();
    let all = schedules(k).await;
    assert!(
        declared(&all, &runs.a, 45).is_some(),
        "v2 still followed: {all:?}"
    );
    assert!(
        all.iter().all(|s| s["run_id"] != runs.b.as_str()),
        "{all:?}"
    );
    assert!(k.log().contains("not applied"), "the older file is said");
    let v3 = entry("tick", &runs.a, "every_sec = 1", 50);
    write(file, &v3);
    k.set_env("OPKERNEL_DRILL_CRASH_AT", Some("declared.midway"));
    let crashed = k.restart().await;
    assert!(
        crashed.is_err(),
        "the kernel died inside the reconciliation"
    );
    k.set_env("OPKERNEL_DRILL_CRASH_AT", None);
    k.restart().await.unwrap();
    let all = schedules(k).await;
    let tick = declared(&all, &runs.a, 50).expect("v3 applied after the crash");
    assert_eq!(tick["schedule_id"], id);
    assert!(
        all.iter().all(|s| s["run_id"] != runs.c.as_str()),
        "hourly removed: {all:?}"
    );
}

#[tokio::test]
async fn a_bad_file_stops_the_start_naming_its_line() {
    let dir = std::env::temp_dir().join(format!("opk-declared-{}", &unique_run("b")[2..]));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.toml");
    write(
        &file,
        "[[schedule]]\nrun = \"r\"\ncommand = [\"true\"]\nevery_sec = 60\nevery = 5\n",
    );
    let path = file.display().to_string();
    let started = KernelProcess::start(
        &kernel_binary().unwrap(),
        "declared-bad",
        &[("OPKERNEL_SCHEDULES", &path)],
    )
    .await;
    let err = format!("{:#}", started.err().expect("the start is refused"));
    assert!(err.contains(&format!("{path}:5")), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts a kernel on `home`'s settings with the file holding `text`:
/// its start's outcome.
async fn start_with(k: &mut KernelProcess, file: &Path, text: &str) -> anyhow::Result<()> {
    write(file, text);
    k.restart().await
}

#[tokio::test]
async fn versions_order_files_and_the_apis_limits_hold() {
    let dir = std::env::temp_dir().join(format!("opk-declared-{}", &unique_run("v")[2..]));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("schedules.toml");
    let (a, capped) = (unique_run("va"), unique_run("vc"));
    let v = |n: i64, timeout: u64| {
        format!(
            "version = {n}\n\n{}",
            entry("t", &a, "every_sec = 3600", timeout)
        )
    };
    write(&file, &v(2, 30));
    let path = file.display().to_string();
    let bin = kernel_binary().unwrap();
    let mut k = KernelProcess::start(&bin, "declared-v", &[("OPKERNEL_SCHEDULES", &path)])
        .await
        .unwrap();
    assert!(declared(&schedules(&k).await, &a, 30).is_some());
    // a lower version never applies, even a file never seen
    start_with(&mut k, &file, &v(1, 40)).await.unwrap();
    assert!(
        declared(&schedules(&k).await, &a, 30).is_some(),
        "version 1 is older"
    );
    // the same version with other content stops the start
    let err = start_with(&mut k, &file, &v(2, 50)).await.unwrap_err();
    assert!(
        format!("{err:#}").contains("version 2 was applied with other content"),
        "{err:#}"
    );
    start_with(&mut k, &file, &v(3, 50)).await.unwrap();
    assert!(
        declared(&schedules(&k).await, &a, 50).is_some(),
        "version 3 applies"
    );
    // a run's envelope bounds a declared timeout, as the API's
    let body = json!({"run_id": capped, "envelope": {"max_timeout_sec": 60}});
    k.client.post("/v1/runs", &body).await.unwrap();
    let over = format!(
        "version = 4\n\n{}",
        entry("c", &capped, "every_sec = 3600", 120)
    );
    let err = start_with(&mut k, &file, &over).await.unwrap_err();
    assert!(format!("{err:#}").contains("over run"), "{err:#}");
    let defaulted = format!(
        "version = 5\n\n[[schedule]]\nname = \"c\"\nrun = \"{capped}\"\ncommand = [\"true\"]\nevery_sec = 3600\n"
    );
    start_with(&mut k, &file, &defaulted).await.unwrap();
    assert!(
        declared(&schedules(&k).await, &capped, 60).is_some(),
        "lowered to the envelope"
    );
    // a file cannot make a child run
    let child = format!(
        "version = 6\n\n{}",
        entry("x", &format!("{capped}.kid"), "every_sec = 60", 30)
    );
    let err = start_with(&mut k, &file, &child).await.unwrap_err();
    assert!(format!("{err:#}").contains("names a child run"), "{err:#}");
    k.set_env("OPKERNEL_SCHEDULES", None);
    drop(k);
    let _ = std::fs::remove_dir_all(&dir);
}
