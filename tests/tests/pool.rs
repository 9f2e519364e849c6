#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The warm pool (SPEC §22) against the real engine: a new run adopts a
//! ready container and keeps it across restarts, kills and reaps; only
//! pooled profiles adopt; a changed profile drains the pool, a smaller one
//! is trimmed; a graceful stop leaves no free container behind.

use std::time::{Duration, Instant};

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::unique_run;
use serde_json::{json, Value};

async fn kernel(tag: &str, env: &[(&str, &str)]) -> KernelProcess {
    KernelProcess::start(&kernel_binary().unwrap(), tag, env)
        .await
        .unwrap()
}

async fn containers(k: &KernelProcess) -> Vec<Value> {
    let list = k.client.get("/v1/containers").await.unwrap();
    list["containers"].as_array().cloned().unwrap()
}

/// Pool containers in `role` (free, bound, …), running.
async fn in_role(k: &KernelProcess, role: &str) -> Vec<Value> {
    containers(k)
        .await
        .into_iter()
        .filter(|c| c["pool"] == role && c["state"] == "running")
        .collect()
}

/// Waits until exactly `n` free pool containers are listed; returns them.
async fn free_exactly(k: &KernelProcess, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let free = in_role(k, "free").await;
        if free.len() == n {
            return free;
        }
        assert!(
            Instant::now() < deadline,
            "free pool: {free:#?}, wanted {n}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run_fg(k: &KernelProcess, run: &str, cmd: &[&str]) -> Value {
    k.client
        .post(
            &format!("/v1/runs/{run}/tools/run_command"),
            &json!({ "command": cmd }),
        )
        .await
        .unwrap()
}

fn ids(list: &[Value]) -> Vec<String> {
    list.iter()
        .map(|c| c["container_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_new_run_adopts_a_ready_container_and_keeps_it() {
    let k = kernel("pool-adopt", &[("OPKERNEL_POOL", "2")]).await;
    let ready = ids(&free_exactly(&k, 2).await);
    let run = unique_run("pool");
    let first = run_fg(&k, &run, &["sh", "-c", "echo one > /scratch/f; id -u"]).await;
    assert_eq!(first["exit_code"], 0, "{first}");
    assert_eq!(first["output"].as_str().unwrap().trim(), "1000", "{first}");
    let adopted = first["container_id"].as_str().unwrap().to_owned();
    assert!(
        ready.contains(&adopted),
        "{adopted} is not one of {ready:?}"
    );
    // the run's next op: the same container, the same /scratch
    let second = run_fg(&k, &run, &["cat", "/scratch/f"]).await;
    assert_eq!(second["container_id"], adopted.as_str());
    assert_eq!(second["output"].as_str().unwrap(), "one\n");
    // listed as the run's, and the pool is back to its size
    let bound = in_role(&k, "bound").await;
    assert_eq!(ids(&bound), vec![adopted.clone()]);
    assert_eq!(bound[0]["run_id"], run.as_str());
    let refilled = ids(&free_exactly(&k, 2).await);
    assert!(!refilled.contains(&adopted));
    // the operator's inspect finds it by the run, processes by its launcher
    let seen = k
        .client
        .get(&format!("/v1/containers/{run}"))
        .await
        .unwrap();
    assert_eq!(seen["container_id"], adopted.as_str(), "{seen}");
    assert_eq!(seen["run_id"], run.as_str());
    assert_eq!(seen["processes_source"], "launcher", "{seen}");
    // it took its run's container name (SPEC §24): Docker finds a run's
    // container by the same name whether it was adopted or made for it
    let prefix = format!("opkernel-{}-", sandbox::profile::scratch_key(&run));
    let name = seen["name"].as_str().unwrap();
    assert!(name.starts_with(&prefix), "{name} is not {run}'s name");
    let by_name = std::process::Command::new("docker")
        .args([
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("name=^{prefix}"),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&by_name.stdout).trim(), adopted);
    // the metrics count the pool by role
    let text = String::from_utf8(k.client.get_bytes("/metrics").await.unwrap()).unwrap();
    assert!(
        text.contains("opkernel_pool_containers{state=\"free\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("opkernel_pool_containers{state=\"bound\"} 1"),
        "{text}"
    );
    // a second new run never gets the first run's container
    let other = run_fg(&k, &unique_run("pool-b"), &["true"]).await;
    assert_ne!(other["container_id"], adopted.as_str());
}

#[tokio::test]
async fn an_adopted_container_keeps_its_ops_across_a_kernel_sigkill() {
    let mut k = kernel("pool-restart", &[("OPKERNEL_POOL", "1")]).await;
    free_exactly(&k, 1).await;
    let run = unique_run("pool-r");
    let op = k
        .start_bg(
            &run,
            &["sh", "-c", "sleep 3; echo done >> /scratch/ran"],
            60,
        )
        .await
        .unwrap();
    let long = k.start_bg(&run, &["sleep", "300"], 600).await.unwrap();
    let adopted = k.container_of(&op).await.unwrap();
    k.restart().await.unwrap();
    let s = k.wait_terminal(&op, Duration::from_secs(60)).await.unwrap();
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["exit_code"], 0);
    assert_eq!(s["container_id"], adopted.as_str());
    // a kill after the restart reaches the op in the adopted container
    let killed = k
        .client
        .post(
            &format!("/v1/runs/{run}/tools/kill_operation"),
            &json!({ "operation_id": long }),
        )
        .await
        .unwrap();
    assert_eq!(killed["killed"], true, "{killed}");
    let delivered = k
        .collect_deliveries(&run, 2, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(delivered.len(), 2, "{delivered:?}");
    let ran = std::fs::read_to_string(
        k.home
            .join("scratch")
            .join(sandbox::profile::scratch_key(&run))
            .join("ran"),
    )
    .unwrap();
    assert_eq!(ran, "done\n");
    // still the run's after the restart, and the pool refilled beside it
    let bound = in_role(&k, "bound").await;
    assert_eq!(ids(&bound), vec![adopted]);
    free_exactly(&k, 1).await;
}

#[tokio::test]
async fn the_reaper_takes_a_finished_runs_adopted_container_and_keeps_the_pool() {
    let k = kernel("pool-reap", &[("OPKERNEL_POOL", "1")]).await;
    free_exactly(&k, 1).await;
    let run = unique_run("pool-reap");
    let adopted = run_fg(&k, &run, &["true"]).await["container_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let link = k
        .home
        .join("scratch")
        .join(sandbox::profile::scratch_key(&run));
    let pool_dir = link.with_file_name(std::fs::read_link(&link).unwrap());
    assert!(pool_dir.is_dir());
    k.client
        .post(&format!("/v1/runs/{run}/finish"), &json!({}))
        .await
        .unwrap();
    let free = ids(&free_exactly(&k, 1).await);
    let reaped = k.client.post("/v1/reap", &json!({})).await.unwrap();
    let decisions = reaped["decisions"].as_array().unwrap();
    let on = |id: &str| decisions.iter().find(|d| d["container_id"] == id).unwrap();
    assert_eq!(on(&adopted)["removed"], true, "{reaped}");
    assert_eq!(on(&adopted)["run_id"], run.as_str());
    assert_eq!(on(&free[0])["action"], "keep", "{reaped}");
    assert!(on(&free[0])["reason"]
        .as_str()
        .unwrap()
        .contains("warm pool"));
    // the scratch dir, its binding file and the binding row went with it
    assert!(std::fs::symlink_metadata(&link).is_err());
    assert!(!pool_dir.exists());
    let rows = k
        .offline_rows("SELECT run_id FROM container_bindings", &[])
        .unwrap();
    assert!(rows.is_empty(), "bindings left: {}", rows.len());
}

#[tokio::test]
async fn only_pooled_profiles_adopt() {
    let narrow = "memory_bytes=1073741824";
    let k = kernel(
        "pool-profiles",
        &[("OPKERNEL_POOL", "1"), ("OPKERNEL_POOL_PROFILES", narrow)],
    )
    .await;
    // one free container per pooled profile
    free_exactly(&k, 2).await;
    let make =
        |run: &str, memory: u64| json!({"run_id": run, "envelope": {"memory_bytes": memory}});
    let listed = unique_run("pool-listed");
    let unlisted = unique_run("pool-unlisted");
    k.client
        .post("/v1/runs", &make(&listed, 1 << 30))
        .await
        .unwrap();
    k.client
        .post("/v1/runs", &make(&unlisted, 1 << 29))
        .await
        .unwrap();
    let a = run_fg(&k, &listed, &["true"]).await;
    let b = run_fg(&k, &unlisted, &["true"]).await;
    let list = containers(&k).await;
    let of = |op: &Value| {
        list.iter()
            .find(|c| c["container_id"] == op["container_id"])
            .cloned()
            .unwrap()
    };
    assert_eq!(of(&a)["pool"], "bound", "{:?}", of(&a));
    assert_eq!(of(&b)["pool"], Value::Null, "{:?}", of(&b));
    assert_eq!(of(&b)["run_id"], unlisted.as_str());
}

#[tokio::test]
async fn a_changed_profile_drains_the_pool_a_smaller_one_is_trimmed_a_stop_empties_it() {
    let mut k = kernel("pool-drain", &[("OPKERNEL_POOL", "2")]).await;
    let old = ids(&free_exactly(&k, 2).await);
    let run = unique_run("pool-drain");
    let first = run_fg(&k, &run, &["sh", "-c", "echo kept > /scratch/f"]).await;
    let adopted = first["container_id"].as_str().unwrap().to_owned();
    free_exactly(&k, 2).await;
    // another profile: the free ones go; the run gets a container of its
    // own for the new profile, with the same /scratch
    k.set_env("OPKERNEL_MEMORY", Some("1073741824"));
    k.restart().await.unwrap();
    let new = ids(&free_exactly(&k, 2).await);
    assert!(new.iter().all(|id| !old.contains(id)), "{new:?} vs {old:?}");
    let again = run_fg(&k, &run, &["cat", "/scratch/f"]).await;
    assert_eq!(again["output"].as_str().unwrap(), "kept\n", "{again}");
    assert_ne!(again["container_id"], adopted.as_str());
    // a smaller pool: the surplus goes
    k.set_env("OPKERNEL_POOL", Some("1"));
    k.restart().await.unwrap();
    free_exactly(&k, 1).await;
    // a graceful stop removes the free container, never a run's
    let pid = k.pid().unwrap();
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    k.wait_exit(Duration::from_secs(30)).await.unwrap();
    let left = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            "label=opkernel.pool",
            "--filter",
            &format!("id={adopted}"),
        ])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&left.stdout).trim().is_empty(),
        "the run's container went"
    );
    k.spawn().await.unwrap();
    let after = ids(&free_exactly(&k, 1).await);
    assert!(
        after.iter().all(|id| !new.contains(id)),
        "a free container outlived the stop"
    );
}

#[tokio::test]
async fn a_one_shot_command_adopts_and_leaves_nothing_behind() {
    let k = kernel("pool-oneshot", &[("OPKERNEL_POOL", "1")]).await;
    let ready = ids(&free_exactly(&k, 1).await);
    let done = k
        .client
        .post(
            "/v1/tools/run_command",
            &json!({"command": ["echo", "once"]}),
        )
        .await
        .unwrap();
    assert_eq!(done["output"].as_str().unwrap(), "once\n", "{done}");
    assert_eq!(done["container_id"], ready[0].as_str(), "{done}");
    // its container, scratch dir, binding file and binding row are gone
    let list = containers(&k).await;
    assert!(
        list.iter().all(|c| c["container_id"] != ready[0].as_str()),
        "{list:#?}"
    );
    let rows = k
        .offline_rows("SELECT run_id FROM container_bindings", &[])
        .unwrap();
    assert!(rows.is_empty());
    let run = done["run_id"].as_str().unwrap();
    let link = k
        .home
        .join("scratch")
        .join(sandbox::profile::scratch_key(run));
    assert!(std::fs::symlink_metadata(link).is_err());
    free_exactly(&k, 1).await;
}

/// Waits until the control plane holds no binding.
async fn no_bindings_within(k: &KernelProcess, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let rows = k
            .offline_rows("SELECT run_id FROM container_bindings", &[])
            .unwrap();
        if rows.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{} binding(s) left", rows.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_binding_whose_container_or_scratch_went_is_forgotten_and_the_run_goes_on() {
    let mut k = kernel("pool-gone", &[("OPKERNEL_POOL", "1")]).await;
    free_exactly(&k, 1).await;
    let home = k.home.clone();
    let link = move |run: &str| {
        home.join("scratch")
            .join(sandbox::profile::scratch_key(run))
    };
    // 1. the adopted container removed from outside, every result delivered:
    // its scratch and binding go within an upkeep round or two
    let gone = unique_run("pool-gone");
    let c = run_fg(&k, &gone, &["true"]).await["container_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let pool_dir = link(&gone).with_file_name(std::fs::read_link(link(&gone)).unwrap());
    std::process::Command::new("docker")
        .args(["rm", "-f", &c])
        .output()
        .unwrap();
    no_bindings_within(&k, Duration::from_secs(30)).await;
    assert!(std::fs::symlink_metadata(link(&gone)).is_err());
    assert!(!pool_dir.exists());
    // 2. a kill after the reaper removed a scratch, before it forgot the
    // binding: at the next start the binding goes, and the run goes on
    let cut = unique_run("pool-cut");
    let c = run_fg(&k, &cut, &["true"]).await["container_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let pool_dir = link(&cut).with_file_name(std::fs::read_link(link(&cut)).unwrap());
    k.sigkill();
    std::process::Command::new("docker")
        .args(["rm", "-f", &c])
        .output()
        .unwrap();
    std::fs::remove_file(link(&cut)).unwrap();
    std::fs::remove_dir_all(&pool_dir).unwrap();
    k.spawn().await.unwrap();
    no_bindings_within(&k, Duration::from_secs(5)).await;
    let again = run_fg(
        &k,
        &cut,
        &["sh", "-c", "echo on > /scratch/f; cat /scratch/f"],
    )
    .await;
    assert_eq!(again["exit_code"], 0, "{again}");
    assert_eq!(again["output"].as_str().unwrap(), "on\n");
}
