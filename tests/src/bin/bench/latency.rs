//! Latency: kernel start reply, kernel "running", bare API exec and the
//! docker CLI, interleaved in one run against one warm container; and the
//! delay from an op's exit to a waiting report returning it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::exec::{CreateExecOptions, StartExecOptions};
use opkernel::drills::harness::KernelProcess;
use serde_json::json;

use crate::{ms, scratch_dir, wait_file, wait_output};

pub struct Latency {
    pub start: Vec<f64>,
    pub running: Vec<f64>,
    pub api: Vec<f64>,
    pub cli: Vec<f64>,
    /// API call until the op's first output byte is in its log.
    pub first_output: Vec<f64>,
    /// See [`shim_overhead`].
    pub shim_overhead_ms: f64,
}

pub async fn measure(k: &KernelProcess, samples: usize) -> anyhow::Result<Latency> {
    let run = "bench-latency";
    let warm = k
        .client
        .post(
            &format!("/v1/runs/{run}/tools/run_command"),
            &json!({"command": ["true"]}),
        )
        .await?;
    let container = warm["container_id"].as_str().unwrap_or_default().to_owned();
    let dir = scratch_dir(k, run).join("lat");
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    let docker = bollard::Docker::connect_with_local_defaults()?
        .negotiate_version()
        .await?;
    let mut lat = Latency {
        start: vec![],
        running: vec![],
        api: vec![],
        cli: vec![],
        first_output: vec![],
        shim_overhead_ms: shim_overhead(&container, 200)?,
    };
    let touch = |name: String| {
        vec![
            "sh".to_owned(),
            "-c".to_owned(),
            format!("touch /scratch/lat/{name}"),
        ]
    };
    // the kernel's op also prints, first thing: its first output byte
    let echo_touch = |name: String| {
        vec![
            "sh".to_owned(),
            "-c".to_owned(),
            format!("echo out; touch /scratch/lat/{name}"),
        ]
    };
    let ops = scratch_dir(k, run).join(".ops");
    let timeout = Duration::from_secs(20);
    for i in 0..samples + 3 {
        let keep = i >= 3; // three warm-up rounds
                           // kernel
        let t0 = Instant::now();
        let (status, body) = k
            .client
            .request(
                reqwest::Method::POST,
                &format!("/v1/runs/{run}/tools/run_command"),
                Some(&json!({"command": echo_touch(format!("k{i}")), "background": true})),
                &[],
            )
            .await?;
        let replied = t0.elapsed();
        anyhow::ensure!(status == 200, "start failed: {body}");
        let log = ops.join(format!(
            "{}.log",
            body["operation_id"].as_str().unwrap_or("?")
        ));
        let path = dir.join(format!("k{i}"));
        let (output, ran) = tokio::task::spawn_blocking(move || {
            Ok::<_, anyhow::Error>((wait_output(&log, timeout)?, wait_file(&path, timeout)?))
        })
        .await??;
        if keep {
            lat.start.push(ms(replied));
            lat.running.push(ms(ran - t0));
            lat.first_output.push(ms(output - t0));
        }
        // bare API exec
        let t0 = Instant::now();
        let exec = docker
            .create_exec(
                &container,
                CreateExecOptions {
                    cmd: Some(touch(format!("a{i}"))),
                    ..Default::default()
                },
            )
            .await?;
        docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: true,
                    ..Default::default()
                }),
            )
            .await?;
        let path = dir.join(format!("a{i}"));
        let ran = tokio::task::spawn_blocking(move || wait_file(&path, timeout)).await??;
        if keep {
            lat.api.push(ms(ran - t0));
        }
        // docker CLI
        let t0 = Instant::now();
        let out = tokio::process::Command::new("docker")
            .args([
                "exec",
                "-d",
                &container,
                "sh",
                "-c",
                &format!("touch /scratch/lat/c{i}"),
            ])
            .output()
            .await?;
        anyhow::ensure!(out.status.success(), "docker exec failed");
        let path = dir.join(format!("c{i}"));
        let ran = tokio::task::spawn_blocking(move || wait_file(&path, timeout)).await??;
        if keep {
            lat.cli.push(ms(ran - t0));
        }
    }
    // let the kernel's ops settle before the next phase
    k.client
        .post(&format!("/v1/runs/{run}/finish"), &json!({}))
        .await?;
    Ok(lat)
}

/// From the op's own exit timestamp to a waiting report call returning it;
/// and how many of the `samples` ops never came back in a report within a
/// minute (each counted, never waited for forever).
pub async fn notify(k: &KernelProcess, samples: usize) -> anyhow::Result<(Vec<f64>, usize)> {
    let run = "bench-notify";
    k.client
        .post(
            &format!("/v1/runs/{run}/tools/run_command"),
            &json!({"command": ["true"]}),
        )
        .await?;
    let dir = scratch_dir(k, run);
    let mut out = Vec::new();
    let mut missing = 0;
    for i in 0..samples {
        let script = format!("sleep 0.3; echo $EPOCHREALTIME > /scratch/exit-{i}");
        let op = k.start_bg(run, &["bash", "-c", &script], 60).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut found = false;
        while !found && Instant::now() < deadline {
            let report = k
                .client
                .get(&format!("/v1/runs/{run}/report?wait=30"))
                .await?;
            let returned = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
            found = report["resolved"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["operation_id"] == op.as_str());
            if let Some(id) = report["report_id"].as_str() {
                k.client
                    .post(&format!("/v1/runs/{run}/report/{id}/ack"), &json!({}))
                    .await?;
            }
            if found {
                let exited: f64 = std::fs::read_to_string(dir.join(format!("exit-{i}")))?
                    .trim()
                    .parse()?;
                out.push((returned - exited) * 1000.0);
            }
        }
        missing += usize::from(!found);
    }
    Ok((out, missing))
}

/// The shim's own cost per op inside a run container, in ms: `n` runs of
/// `/.opkernel/shim launch ... /bin/true` (pid file, log, identity drop,
/// wait4, code file) minus `n` runs of `/bin/true` alone, timed by bash's
/// clock inside the container (no Docker round trip in the figure).
pub fn shim_overhead(container: &str, n: usize) -> anyhow::Result<f64> {
    let script = format!(
        r#"id=00000000-0000-4000-8000-00000000b0b0
t() {{ local s=${{EPOCHREALTIME/./}}; for ((i = 0; i < {n}; i++)); do "$@" >/dev/null 2>&1; done; echo $(( ${{EPOCHREALTIME/./}} - s )); }}
bare=$(t /bin/true); shim=$(t {shim} launch "$id" 1000:1000 65536 /bin/true)
rm -f /scratch/.ops/$id.*
echo "$bare $shim""#,
        shim = sandbox::shim::SHIM_PATH
    );
    let out = std::process::Command::new("docker")
        .args(["exec", container, "bash", "-c", &script])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut micros = text.split_whitespace().map(str::parse::<f64>);
    match (micros.next(), micros.next()) {
        (Some(Ok(bare)), Some(Ok(shim))) => Ok((shim - bare) / n as f64 / 1000.0),
        _ => anyhow::bail!(
            "shim overhead probe failed: {text:?} {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}
