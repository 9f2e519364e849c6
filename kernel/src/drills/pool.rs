//! The warm pool under a kernel killed mid-adoption (SPEC §22): at each
//! step of an adoption the kernel SIGKILLs itself (its drill crash point);
//! after the restart the container is either the run's or the pool's,
//! never both, the op runs once, and no other run ever gets it.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

use super::harness::KernelProcess;
use super::{check, scratch_path, unique_run, Kit, LONG};
use crate::store::db::Value as Cell;

/// The steps of an adoption, in order: before the binding row's
/// transaction, after its commit, after the binding file.
const POINTS: [&str; 3] = ["pool.before_bind", "pool.after_bind", "pool.after_file"];

pub async fn pool_adopt_crash(kit: &Kit) -> anyhow::Result<String> {
    let mut seen = Vec::new();
    for point in POINTS {
        let found = crash_at(kit, point)
            .await
            .with_context(|| format!("killed at {point}"))?;
        seen.push(format!("{point}: {found}"));
    }
    Ok(seen.join("; "))
}

/// The managed containers as `GET /v1/containers` lists them.
async fn containers(k: &KernelProcess) -> anyhow::Result<Vec<Value>> {
    let list = k.client.get("/v1/containers").await?;
    Ok(list["containers"].as_array().cloned().unwrap_or_default())
}

/// Waits for `want` free pool containers; returns their entries.
async fn free_pool(k: &KernelProcess, want: usize) -> anyhow::Result<Vec<Value>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let free: Vec<Value> = containers(k)
            .await?
            .into_iter()
            .filter(|c| c["pool"] == "free" && c["state"] == "running")
            .collect();
        if free.len() >= want {
            return Ok(free);
        }
        anyhow::ensure!(Instant::now() < deadline, "the pool never filled: {free:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The run's binding row (container id) and binding file (pool key), as
/// the crash left them.
fn left_behind(k: &KernelProcess, run: &str) -> anyhow::Result<(Option<String>, Option<String>)> {
    let rows = k.offline_rows(
        "SELECT container_id FROM container_bindings WHERE run_id = ?1",
        &[Cell::Text(run.to_owned())],
    )?;
    let row = rows.first().map(|r| r.at::<String>(0)).transpose()?;
    let link = k
        .home
        .join("scratch")
        .join(sandbox::profile::scratch_key(run));
    let file = std::fs::read_link(link)
        .ok()
        .map(|t| t.to_string_lossy().into_owned());
    Ok((row, file))
}

async fn crash_at(kit: &Kit, point: &str) -> anyhow::Result<String> {
    let env = [("OPKERNEL_POOL", "1"), ("OPKERNEL_DRILL_CRASH_AT", point)];
    let mut k = kit.start("pool-crash", &env).await?;
    let pooled = free_pool(&k, 1).await?;
    let c = pooled[0]["container_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let key = pooled[0]["scratch_key"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let run = unique_run("adopt");
    // the kernel may die before its answer leaves: the op is found by its run
    let started = k
        .start_bg(&run, &["sh", "-c", "echo once >> /scratch/ran"], 60)
        .await;
    k.wait_exit(Duration::from_secs(30)).await?;
    let (row, file) = left_behind(&k, &run)?;
    let bound_before = point != "pool.before_bind";
    check(row.is_some() == bound_before, || {
        format!("binding row {row:?}")
    })?;
    check(row.is_none() || row.as_deref() == Some(c.as_str()), || {
        format!("row {row:?} vs {c}")
    })?;
    let file_want = (point == "pool.after_file").then(|| key.clone());
    check(file == file_want, || {
        format!("binding file {file:?}, expected {file_want:?}")
    })?;
    let op = match started {
        Ok(op) => op,
        Err(_) => {
            let rows = k.offline_rows(
                "SELECT id FROM ops WHERE run_id = ?1",
                &[Cell::Text(run.clone())],
            )?;
            rows.first()
                .context("the op was not admitted")?
                .at::<String>(0)?
        }
    };
    k.set_env("OPKERNEL_DRILL_CRASH_AT", None);
    k.spawn().await?;
    let s = k.wait_terminal(&op, LONG).await?;
    check(s["status"] == "completed" && s["exit_code"] == 0, || {
        format!("{s}")
    })?;
    let used = s["container_id"].as_str().unwrap_or_default().to_owned();
    // a committed binding makes the container the run's, whatever followed;
    // without one it stayed the pool's (recovered free: the one free
    // container the new run then adopts)
    check(used == c, || {
        format!("the pool's container {c}, but ran in {used}")
    })?;
    let ran = std::fs::read_to_string(scratch_path(&k, &run, "ran"))?;
    check(ran == "once\n", || format!("the command ran {:?}", ran))?;
    confirm_after(&k, &run, &used).await?;
    Ok(format!(
        "row {}, file {}; ran once in the pool container",
        if bound_before { "landed" } else { "absent" },
        if file_want.is_some() {
            "written"
        } else {
            "absent"
        },
    ))
}

/// After the restart: the container that served the run is the run's (no
/// free pool entry names it), its binding file mirrors the row, and a
/// second new run gets another container.
async fn confirm_after(k: &KernelProcess, run: &str, used: &str) -> anyhow::Result<()> {
    let list = containers(k).await?;
    let entry = list
        .iter()
        .find(|e| e["container_id"] == used)
        .context("the run's container is not listed")?;
    check(entry["run_id"] == run, || format!("{entry}"))?;
    check(entry["pool"] != "free", || format!("{entry}"))?;
    if entry["pool"] == "bound" {
        let (row, file) = left_behind(k, run)?;
        check(row.as_deref() == Some(used), || format!("row {row:?}"))?;
        check(
            file.as_ref() == entry["scratch_key"].as_str().map(str::to_owned).as_ref(),
            || format!("binding file {file:?} for {entry}"),
        )?;
        run_name_taken(k, run, used).await?;
    }
    let other = unique_run("adopt-next");
    let next = k.start_bg(&other, &["true"], 60).await?;
    let n = k.wait_terminal(&next, LONG).await?;
    check(
        n["status"] == "completed" && n["container_id"] != used,
        || format!("{n}"),
    )?;
    Ok(())
}

/// The adopted container takes its run's name, though its kernel died
/// before the rename: the restarted kernel gives it.
async fn run_name_taken(k: &KernelProcess, run: &str, used: &str) -> anyhow::Result<()> {
    let prefix = format!("opkernel-{}-", sandbox::profile::scratch_key(run));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = containers(k).await?;
        let name = list
            .iter()
            .find(|e| e["container_id"] == used)
            .and_then(|e| e["name"].as_str())
            .unwrap_or_default()
            .to_owned();
        if name.starts_with(&prefix) {
            return Ok(());
        }
        check(Instant::now() < deadline, || {
            format!("the run's container is still named {name:?}, not {prefix}…")
        })?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
