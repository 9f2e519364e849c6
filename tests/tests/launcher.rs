#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The resident launcher end to end (SPEC §13): ops start through the
//! container's `opkernel-shim serve`, not `docker exec`; a container made
//! before the launcher keeps running ops by `docker exec`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::query_parameters::CreateContainerOptionsBuilder;
use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::{image_tests, unique_run, Image};
use sandbox::{RunIdentity, RunUser, Sandbox};
use serde_json::json;

const T: Duration = Duration::from_secs(60);

image_tests!(ops_start_through_the_resident_launcher);

async fn kernel(tag: &str, image: &str) -> KernelProcess {
    KernelProcess::start(&kernel_binary().unwrap(), tag, &[("OPKERNEL_IMAGE", image)])
        .await
        .unwrap()
}

fn ops_dir(k: &KernelProcess, run: &str) -> PathBuf {
    k.home
        .join("scratch")
        .join(sandbox::profile::scratch_key(run))
        .join(".ops")
}

fn inbox_states(ops: &Path, op: &str) -> Vec<&'static str> {
    ["req", "claimed", "withdrawn"]
        .into_iter()
        .filter(|state| ops.join("inbox").join(format!("{op}.{state}")).exists())
        .collect()
}

async fn ops_start_through_the_resident_launcher(image: Image) {
    let k = kernel("launcher", &image.name()).await;
    let run = unique_run("launcher");
    let mut ops = Vec::new();
    for i in 0..5 {
        let cmd = format!("echo op{i}; exit {i}");
        ops.push(k.start_bg(&run, &["sh", "-c", &cmd], 60).await.unwrap());
    }
    let dir = ops_dir(&k, &run);
    for (i, op) in ops.iter().enumerate() {
        let s = k.wait_terminal(op, T).await.unwrap();
        assert_eq!(
            (s["status"].as_str(), s["exit_code"].as_i64()),
            (Some("completed"), Some(i as i64)),
            "{s}"
        );
        assert_eq!(s["output_tail"], format!("op{i}\n"));
        // it went through the launcher: handed over, no docker exec made;
        // and settled, its handover files left the inbox (SPEC §21)
        let launched = k
            .sql_offline_query(&format!(
                "SELECT COUNT(*) FROM ops WHERE id = '{op}' \
                 AND handed_over_at IS NOT NULL AND exec_id IS NULL"
            ))
            .unwrap();
        assert_eq!(launched, 1, "{op} went through the launcher");
        assert!(
            inbox_states(&dir, op).is_empty(),
            "{op} left its handover files"
        );
    }
    // the launcher is the container's main process, root, and recorded
    let container = k.container_of(&ops[0]).await.unwrap();
    let record = std::fs::read_to_string(dir.join("launcher.pid")).unwrap();
    let launcher = sandbox::PidRecord::parse(&record).unwrap();
    let top = opkernel_tests::docker_top(&container);
    assert!(
        top.iter().any(|r| r.user == "root"
            && opkernel_tests::is_container_own(r)
            && !r.args.contains("docker-init")),
        "{top:?}"
    );
    let inside = opkernel::drills::harness::docker_exec(
        &container,
        &format!("cat /proc/{}/cmdline | tr '\\0' ' '", launcher.pid),
    )
    .unwrap();
    assert!(
        sandbox::profile::is_launcher_command(inside.trim()),
        "{record}: {inside}"
    );
}

/// A run container made the way kernels before the launcher made them
/// (main process `shim idle`): the kernel adopts it and starts its ops by
/// `docker exec`; nothing is filed in an inbox.
#[tokio::test]
async fn a_container_made_before_the_launcher_runs_ops_by_exec() {
    let k = kernel("prelauncher", &Image::Default.name()).await;
    let run = unique_run("prelauncher");
    let profile = Image::Default.profile();
    let identity = RunIdentity::new(&run, &profile).unwrap();
    let sandbox = Sandbox::connect(None, k.home.join("scratch"))
        .await
        .unwrap();
    let scratch = sandbox.prepare_scratch(&identity.scratch_key).unwrap();
    sandbox
        .hand_scratch_to(
            &identity.scratch_key,
            RunUser {
                uid: 1000,
                gid: 1000,
            },
        )
        .unwrap();
    let shim = sandbox::shim::install_shim(&k.home.join("bin")).unwrap();
    let mut config = sandbox::profile::container_config(
        identity.labels(sandbox::unix_now()),
        &profile,
        &scratch,
        &shim,
    );
    config.cmd = Some(vec!["idle".to_owned()]);
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let options = CreateContainerOptionsBuilder::default()
        .name(&identity.name)
        .build();
    let created = docker
        .create_container(Some(options), config)
        .await
        .unwrap();
    docker.start_container(&created.id, None).await.unwrap();

    let op = k
        .start_bg(&run, &["sh", "-c", "echo by exec"], 60)
        .await
        .unwrap();
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(
        s["container_id"],
        json!(created.id),
        "the old container is adopted"
    );
    assert_eq!(
        (s["status"].as_str(), s["exit_code"].as_i64()),
        (Some("completed"), Some(0)),
        "{s}"
    );
    assert_eq!(s["output_tail"], "by exec\n");
    assert!(
        inbox_states(&ops_dir(&k, &run), &op).is_empty(),
        "nothing was filed for a container without a launcher"
    );
}

/// A probe asked of the launcher through the inbox lists the same marked
/// processes as the probe run by `docker exec`, and leaves nothing behind.
#[tokio::test]
async fn the_launcher_answers_probes_like_the_exec_probe() {
    let fx = opkernel_tests::SandboxFixture::new("lprobe").await;
    let run = unique_run("lprobe");
    let (identity, info) = fx.container(&run).await;
    assert!(info.has_launcher);
    let op = uuid::Uuid::new_v4().to_string();
    let request = sandbox::Request {
        host: info.hostname.clone(),
        op_id: op.clone(),
        run_as: "1000:1000".into(),
        log_cap: 1024,
        io: sandbox::Io::Null,
        argv: vec!["sh".into(), "-c".into(), "sleep 30 & sleep 31".into()],
    };
    let ops = fx.sandbox.ops_dir(&identity.scratch_key);
    ops.submit(&request).unwrap();
    let by_exec = opkernel_tests::wait_for("three marked processes", T, || {
        let (fx, id, op) = (&fx, info.id.clone(), op.clone());
        async move {
            let procs = fx.sandbox.probe(&id).await.ok()?;
            (procs.iter().filter(|p| p.op_id == op).count() == 3).then_some(procs)
        }
    })
    .await;
    let by_launcher = fx
        .sandbox
        .probe_by_launcher(
            &identity.scratch_key,
            &info.hostname,
            Duration::from_secs(5),
        )
        .await
        .unwrap()
        .expect("the launcher answers");
    let sorted = |mut v: Vec<sandbox::MarkedProcess>| {
        v.sort_by_key(|p| p.pid);
        v
    };
    assert_eq!(sorted(by_launcher), sorted(by_exec));
    let leftovers: Vec<String> = std::fs::read_dir(ops.path().join("inbox"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| !n.ends_with(".claimed"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
