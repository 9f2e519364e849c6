#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The sandbox layer against the real Docker engine: labelled containers,
//! the shim's files, exit codes and usage, output fidelity, capping,
//! identity probes and tree kills, on both run images.

use std::time::Duration;

use opkernel_tests::{image_tests, wait_for, Image, SandboxFixture};
use sandbox::{ExitRecord, LaunchSpec, OpFileError, OpResult, PidRecord, RunIdentity, Signal};

fn op_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn cmd(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

image_tests!(
    shim_files_codes_and_usage,
    output_fidelity_and_cap,
    identity_probe_and_tree_kill,
    a_background_child_holding_the_output_does_not_hold_the_exit_code,
);

/// Launches a command and waits for its `.code`.
async fn run_to_record(
    fx: &SandboxFixture,
    run: &str,
    command: &[&str],
    cap: u64,
) -> (String, ExitRecord) {
    let (identity, info) = fx.container(run).await;
    let id = op_id();
    let spec = LaunchSpec {
        op_id: &id,
        run_as: Some("1000:1000"),
        log_cap_bytes: cap,
        io: sandbox::Io::Null,
    };
    fx.sandbox
        .launch(&info.id, &spec, &cmd(command))
        .await
        .unwrap();
    let ops = fx.sandbox.ops_dir(&identity.scratch_key);
    let code = wait_for("exit code", Duration::from_secs(30), || {
        let ops = ops.clone();
        let id = id.clone();
        async move {
            match ops.read_code(&id).ok()? {
                OpResult::Exited(record) => Some(record),
                OpResult::NotStarted(why) => panic!("not started: {why}"),
            }
        }
    })
    .await;
    (id, code)
}

async fn run_to_code(fx: &SandboxFixture, run: &str, command: &[&str], cap: u64) -> (String, i32) {
    let (id, record) = run_to_record(fx, run, command, cap).await;
    (id, record.code)
}

#[tokio::test]
async fn container_is_labelled_reused_and_mislabelled_twin_refused() {
    let fx = SandboxFixture::new("labels").await;
    let run = opkernel_tests::unique_run("labels");
    let (identity, first) = fx.container(&run).await;
    for (key, want) in [
        ("opkernel.managed", "true"),
        ("opkernel.run_id", run.as_str()),
        ("opkernel.scratch_key", identity.scratch_key.as_str()),
        ("opkernel.run_fingerprint", identity.fingerprint.as_str()),
    ] {
        assert_eq!(
            first.labels.get(key).map(String::as_str),
            Some(want),
            "{key}"
        );
    }
    assert!(first.labels.contains_key("opkernel.created_at"));
    let (_, second) = fx.container(&run).await;
    assert_eq!(first.id, second.id, "container is reused");
    let listed = fx.sandbox.list_managed().await.unwrap();
    assert!(listed.iter().any(|c| c.id == first.id));

    // a container squatting on the expected name without our labels
    let squat_run = opkernel_tests::unique_run("squat");
    let squat = RunIdentity::new(&squat_run, &opkernel_tests::test_profile()).unwrap();
    let out = std::process::Command::new("docker")
        .args([
            "create",
            "--name",
            &squat.name,
            "--label",
            "opkernel.managed=true",
        ])
        .arg(opkernel_tests::image())
        .args(["sleep", "60"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fx.track(String::from_utf8_lossy(&out.stdout).trim());
    let err = fx
        .sandbox
        .ensure_container(&squat, &opkernel_tests::test_profile())
        .await
        .unwrap_err();
    assert!(
        matches!(err, sandbox::SandboxError::Foreign { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("opkernel.run_id"), "{err}");
}

async fn shim_files_codes_and_usage(image: Image) {
    let fx = SandboxFixture::with_profile("codes", image.profile()).await;
    let run = opkernel_tests::unique_run("codes");
    for (command, want) in [
        (vec!["true"], 0),
        (vec!["sh", "-c", "exit 3"], 3),
        (vec!["sh", "-c", "kill -KILL $$"], 137),
        (vec!["no-such-program"], 127),
        (vec!["/scratch"], 126),
    ] {
        let (id, code) = run_to_code(&fx, &run, &command, 1 << 20).await;
        assert_eq!(code, want, "{command:?}");
        let ops = fx.sandbox.ops_dir(&fx.identity(&run).scratch_key);
        let pid: PidRecord = ops.read_pid(&id).unwrap();
        assert!(pid.pid > 1 && pid.start_ticks > 0 && !pid.hostname.is_empty());
        assert!(ops.log_tail(&id, 10).is_ok());
    }
    let ops = fx.sandbox.ops_dir(&fx.identity(&run).scratch_key);
    let (id, _) = run_to_code(&fx, &run, &["no-such-program"], 1 << 20).await;
    let log = String::from_utf8_lossy(&ops.log_tail(&id, 500).unwrap().0).into_owned();
    assert!(log.contains("cannot run \"no-such-program\""), "{log}");

    // a user the image does not have: nothing is executed, and the record says so
    let (_, info) = fx.container(&run).await;
    let id = op_id();
    let spec = LaunchSpec {
        op_id: &id,
        run_as: Some("nobody-here"),
        log_cap_bytes: 1024,
        io: sandbox::Io::Null,
    };
    fx.sandbox
        .launch(&info.id, &spec, &cmd(&["sh", "-c", "touch /scratch/ran"]))
        .await
        .unwrap();
    let result = wait_for("the not-started record", Duration::from_secs(30), || {
        let ops = ops.clone();
        let id = id.clone();
        async move { ops.read_code(&id).ok() }
    })
    .await;
    assert!(
        matches!(&result, OpResult::NotStarted(why) if why.contains("no user \"nobody-here\"")),
        "{result:?}"
    );
    assert!(!fx
        .home
        .join("scratch")
        .join(fx.identity(&run).scratch_key)
        .join("ran")
        .exists());

    // usage: the CPU of the whole tree, a grandchild's included
    let burn = "sh -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done' & wait";
    let (_, record) = run_to_record(&fx, &run, &["sh", "-c", burn], 1 << 20).await;
    let usage = record.usage.expect("the shim records usage");
    assert!(usage.cpu_ms >= 50, "{usage:?}");
    assert!(usage.max_rss_kb > 100, "{usage:?}");
}

async fn output_fidelity_and_cap(image: Image) {
    let fx = SandboxFixture::with_profile("output", image.profile()).await;
    let run = opkernel_tests::unique_run("output");
    let identity = fx.identity(&run);
    let (id, code) = run_to_code(
        &fx,
        &run,
        &["sh", "-c", "printf 'a\\000\\377b'; printf err >&2"],
        1 << 20,
    )
    .await;
    assert_eq!(code, 0);
    let ops = fx.sandbox.ops_dir(&identity.scratch_key);
    assert_eq!(ops.log_tail(&id, 100).unwrap().0, b"a\0\xffberr".to_vec());

    let (id, code) = run_to_code(
        &fx,
        &run,
        &["sh", "-c", "yes | head -c 3000000"],
        100 * 1024,
    )
    .await;
    assert_eq!(code, 0, "the capper never breaks the command's pipe");
    let (tail, size) = ops.log_tail(&id, 200).unwrap();
    let mark = format!(
        "\n[opkernel: output truncated: {} bytes over the {} byte cap dropped]\n",
        3_000_000 - 100 * 1024,
        100 * 1024
    );
    assert_eq!(size, 100 * 1024 + mark.len() as u64, "capped exactly");
    let tail = String::from_utf8_lossy(&tail);
    assert!(tail.contains("output truncated"), "{tail}");
    assert!(
        tail.contains(&format!("{} bytes", 3_000_000 - 100 * 1024)),
        "{tail}"
    );
}

async fn identity_probe_and_tree_kill(image: Image) {
    let fx = SandboxFixture::with_profile("kill", image.profile()).await;
    let run = opkernel_tests::unique_run("kill");
    let (identity, info) = fx.container(&run).await;
    let ops = fx.sandbox.ops_dir(&identity.scratch_key);
    let id = op_id();
    let spec = LaunchSpec {
        op_id: &id,
        run_as: Some("1000:1000"),
        log_cap_bytes: 1 << 20,
        io: sandbox::Io::Null,
    };
    // a tree that ignores SIGTERM, with a child in the background
    let script = "trap '' TERM; sleep 300 & sleep 301 & wait";
    fx.sandbox
        .launch(&info.id, &spec, &cmd(&["bash", "-c", script]))
        .await
        .unwrap();
    let record = wait_for("pid file", Duration::from_secs(10), || {
        let ops = ops.clone();
        let id = id.clone();
        async move { ops.read_pid(&id).ok() }
    })
    .await;
    let live = wait_for("three op processes", Duration::from_secs(10), || {
        let fx = &fx;
        let record = record.clone();
        let (cid, id) = (info.id.clone(), id.clone());
        async move {
            let live = fx.sandbox.probe_op(&cid, &id, &record).await.ok()?;
            (live.remaining >= 3).then_some(live)
        }
    })
    .await;
    assert!(live.wrapper_alive && !live.pid_reused);

    // a wrong start time or a foreign marker is never the op
    let forged = PidRecord {
        start_ticks: record.start_ticks + 1,
        ..record.clone()
    };
    assert!(
        !fx.sandbox
            .probe_op(&info.id, &id, &forged)
            .await
            .unwrap()
            .wrapper_alive
    );
    assert!(
        !fx.sandbox
            .probe_op(&info.id, &op_id(), &record)
            .await
            .unwrap()
            .wrapper_alive
    );
    // a record from "the future" protects every process: nothing is signalled
    let future = PidRecord {
        start_ticks: u64::MAX / 2,
        ..record.clone()
    };
    assert!(fx
        .sandbox
        .signal_processes(&info.id, &id, &future, Signal::Kill, false)
        .await
        .unwrap()
        .is_empty());

    let hit = fx
        .sandbox
        .signal_processes(&info.id, &id, &record, Signal::Term, false)
        .await
        .unwrap();
    assert!(hit.len() >= 3, "{hit:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(ops.read_code(&id).is_err(), "TERM is ignored by the tree");
    fx.sandbox
        .signal_processes(&info.id, &id, &record, Signal::Kill, false)
        .await
        .unwrap();
    let code = wait_for("exit code", Duration::from_secs(10), || {
        let ops = ops.clone();
        let id = id.clone();
        async move { ops.read_code(&id).ok() }
    })
    .await;
    assert!(
        matches!(code, OpResult::Exited(ExitRecord { code: 137, .. })),
        "{code:?}"
    );
    let left = fx.sandbox.probe_op(&info.id, &id, &record).await.unwrap();
    assert!(!left.any_alive(), "{left:?}");
    let top = fx.sandbox.top(&info.id).await.unwrap();
    assert!(
        !top.iter().any(|p| p.command.contains("sleep 30")),
        "{top:?}"
    );
    assert!(matches!(
        ops.read_code(&op_id()),
        Err(OpFileError::Missing(_))
    ));
}

async fn a_background_child_holding_the_output_does_not_hold_the_exit_code(image: Image) {
    let fx = SandboxFixture::with_profile("straggler", image.profile()).await;
    let run = opkernel_tests::unique_run("straggler");
    let began = std::time::Instant::now();
    let (id, code) =
        run_to_code(&fx, &run, &["sh", "-c", "sleep 30 & echo started"], 1 << 20).await;
    assert_eq!(code, 0);
    let waited = began.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "the code waited {waited:?} for the straggler"
    );
    let identity = fx.identity(&run);
    let (log, _) = fx
        .sandbox
        .ops_dir(&identity.scratch_key)
        .log_tail(&id, 100)
        .unwrap();
    // the straggler's pipe was closed off before the code: the log is final, and says so
    assert_eq!(
        String::from_utf8_lossy(&log),
        "started\n\n[opkernel: output written after the command exited is not captured]\n"
    );
}
