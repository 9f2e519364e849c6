#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The `opkernel` CLI end to end against a real kernel, and the orphan
//! reaper's decisions on real containers.

use std::process::{Command, Output};
use std::time::Duration;

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::unique_run;
use serde_json::{json, Value};

fn cli(k: &KernelProcess, args: &[&str]) -> Output {
    Command::new(kernel_binary().unwrap())
        .args(args)
        .env("OPKERNEL_URL", k.client.base())
        .env("OPKERNEL_HOME", &k.home)
        .env_remove("OPKERNEL_TOKEN")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test]
async fn the_cli_drives_a_whole_run() {
    let k = KernelProcess::start(&kernel_binary().unwrap(), "cli", &[])
        .await
        .unwrap();
    let run = unique_run("cli");
    // foreground: output verbatim (binary, no trailing newline), exit code propagated
    let fg = cli(
        &k,
        &[
            "run",
            "--run",
            &run,
            "--",
            "sh",
            "-c",
            "printf 'a\\001b'; exit 3",
        ],
    );
    assert_eq!(fg.status.code(), Some(3));
    assert_eq!(fg.stdout, b"a\x01b");
    let bad = cli(
        &k,
        &["run", "--run", &run, "--timeout", "901", "--", "true"],
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("900"),
        "{bad:?}"
    );
    // one-shot: a throwaway container that is gone afterwards
    let once = cli(&k, &["run", "--", "sh", "-c", "echo oneshot"]);
    assert_eq!(
        (once.status.code(), stdout(&once).as_str()),
        (Some(0), "oneshot\n")
    );
    let once: Value =
        serde_json::from_slice(&cli(&k, &["run", "--json", "--", "true"]).stdout).unwrap();
    let throwaway = once["container_id"].as_str().unwrap();
    assert!(
        !exists(throwaway),
        "the one-shot container {throwaway} was removed"
    );
    assert!(!managed_containers()
        .iter()
        .any(|c| throwaway.starts_with(c.as_str())));
    // background, ps, state, logs, note, report, kill, finish
    let started = cli(
        &k,
        &[
            "run",
            "--run",
            &run,
            "--background",
            "--json",
            "--",
            "sh",
            "-c",
            "echo bg; exit 5",
        ],
    );
    let bg: Value = serde_json::from_slice(&started.stdout).unwrap();
    let bg_id = bg["operation_id"].as_str().unwrap().to_owned();
    assert!(bg["message"]
        .as_str()
        .unwrap()
        .starts_with("Started in background as operation"));
    let long: Value = serde_json::from_slice(
        &cli(
            &k,
            &[
                "run",
                "--run",
                &run,
                "--background",
                "--json",
                "--",
                "sleep",
                "300",
            ],
        )
        .stdout,
    )
    .unwrap();
    let long_id = long["operation_id"].as_str().unwrap().to_owned();
    k.wait_terminal(&bg_id, Duration::from_secs(30))
        .await
        .unwrap();
    // the op is accepted as `starting`; `ps` is checked once it runs
    k.wait_state(&long_id, Duration::from_secs(30), |s| {
        s["status"] == "running"
    })
    .await
    .unwrap();
    let ps = stdout(&cli(&k, &["ps", "--run", &run]));
    assert!(
        ps.contains(&long_id) && ps.contains("running") && ps.contains("sleep 300"),
        "{ps}"
    );
    let state: Value =
        serde_json::from_slice(&cli(&k, &["state", &bg_id, "--json"]).stdout).unwrap();
    assert_eq!(
        (state["status"].as_str(), state["exit_code"].as_i64()),
        (Some("completed"), Some(5))
    );
    assert_eq!(stdout(&cli(&k, &["logs", &bg_id])), "bg\n");
    let follow = cli(&k, &["logs", &bg_id, "--follow"]);
    assert_eq!(
        (follow.status.code(), stdout(&follow).as_str()),
        (Some(5), "bg\n")
    );
    assert!(cli(&k, &["note", "--run", &run, "wrap up"])
        .status
        .success());
    let report = stdout(&cli(&k, &["report", "--run", &run, "--wait", "10"]));
    assert!(
        report.contains(&format!("- {bg_id} finished: exit_code=5")),
        "{report}"
    );
    assert!(
        report.contains("wrap up") && report.contains(&format!("- {long_id} `sleep 300`")),
        "{report}"
    );
    // the report was acked: asking again delivers nothing new
    let again: Value =
        serde_json::from_slice(&cli(&k, &["report", "--run", &run, "--json"]).stdout).unwrap();
    assert_eq!(again["report_id"], Value::Null);
    let killed = stdout(&cli(&k, &["kill", &long_id]));
    assert!(
        killed.contains("completed")
            && killed.contains("exit_code=143")
            && killed.contains("killed=true"),
        "{killed}"
    );
    let finish: Value =
        serde_json::from_slice(&cli(&k, &["finish", "--run", &run, "--json"]).stdout).unwrap();
    assert_eq!(finish["operations"].as_array().unwrap().len(), 3);
    assert!(finish["report"]["text"]
        .as_str()
        .unwrap()
        .contains(&format!("- {long_id} killed: exit_code=143")));
    // errors are clear and exit non-zero
    let missing = cli(&k, &["state", &uuid::Uuid::new_v4().to_string()]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no operation"));
}

fn cli_as(k: &KernelProcess, token: &str, args: &[&str]) -> Output {
    Command::new(kernel_binary().unwrap())
        .args(args)
        .env("OPKERNEL_URL", k.client.base())
        .env("OPKERNEL_HOME", &k.home)
        .env("OPKERNEL_TOKEN", token)
        .output()
        .unwrap()
}

#[tokio::test]
async fn the_cli_drives_runs_as_tasks() {
    let k = KernelProcess::start(&kernel_binary().unwrap(), "clitasks", &[])
        .await
        .unwrap();
    let p = unique_run("clip");
    let c = format!("{p}.clic");
    let made = cli(
        &k,
        &[
            "token",
            "--run",
            &p,
            "--budget",
            r#"{"tokens": 1000}"#,
            "--json",
        ],
    );
    assert!(made.status.success(), "{made:?}");
    let v: Value = serde_json::from_slice(&made.stdout).unwrap();
    let parent_token = v["token"].as_str().unwrap().to_owned();
    assert_eq!(v["budget"]["tokens"], 1000);
    // a child through the parent's token; a wider budget is refused by name
    let wide = cli_as(
        &k,
        &parent_token,
        &["token", "--run", &c, "--budget", r#"{"tokens": 2000}"#],
    );
    assert_eq!(wide.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&wide.stderr).contains("budget.tokens"),
        "{wide:?}"
    );
    let child = cli_as(&k, &parent_token, &["token", "--run", &c]);
    assert!(child.status.success(), "{child:?}");
    let bad = cli(&k, &["token", "--run", &c, "--envelope", "{nope"]);
    assert_eq!(bad.status.code(), Some(1));
    let tree = stdout(&cli(&k, &["runs"]));
    let (pl, cl) = (
        tree.lines().find(|l| l.starts_with(&p)).unwrap(),
        tree.lines()
            .find(|l| l.trim_start().starts_with(&c))
            .unwrap(),
    );
    assert!(
        pl.contains("active") && pl.contains("tokens=1000"),
        "{tree}"
    );
    assert!(
        cl.starts_with("  "),
        "the child is indented under its parent: {tree}"
    );
    let used = cli_as(
        &k,
        &parent_token,
        &[
            "usage",
            &p,
            "--model",
            "m",
            "--input-tokens",
            "10",
            "--output-tokens",
            "5",
            "--json",
        ],
    );
    let v: Value = serde_json::from_slice(&used.stdout).unwrap();
    assert_eq!(
        (
            v["used"]["tokens"].as_u64(),
            v["remaining"]["tokens"].as_u64()
        ),
        (Some(15), Some(985))
    );
    let state = stdout(&cli(&k, &["run-state", &c]));
    assert!(state.contains(&format!("chain      {p}")), "{state}");
    assert!(cli_as(&k, &parent_token, &["pause", &c]).status.success());
    let refused = cli(&k, &["run", "--run", &c, "--", "true"]);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("is paused"),
        "{refused:?}"
    );
    assert!(cli_as(&k, &parent_token, &["resume", &c]).status.success());
    let op = stdout(&cli(
        &k,
        &[
            "run",
            "--run",
            &c,
            "--background",
            "--json",
            "--",
            "sleep",
            "60",
        ],
    ));
    let op: Value = serde_json::from_str(&op).unwrap();
    k.container_of(op["operation_id"].as_str().unwrap())
        .await
        .unwrap();
    let cancel = cli_as(&k, &parent_token, &["cancel", &p]);
    assert!(cancel.status.success(), "{cancel:?}");
    assert!(
        stdout(&cancel).contains("1 live operations are being killed"),
        "{cancel:?}"
    );
    k.wait_terminal(
        op["operation_id"].as_str().unwrap(),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let done = cli(&k, &["complete", &p, "--summary", "x"]);
    assert!(
        String::from_utf8_lossy(&done.stderr).contains("cancelled"),
        "{done:?}"
    );
    let events = stdout(&cli(&k, &["events", &c]));
    let kinds: Vec<&str> = events
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(
        kinds,
        [
            "run.paused",
            "run.resumed",
            "tool.started",
            "run.cancelled",
            "tool.completed"
        ],
        "{events}"
    );
}

fn managed_containers() -> Vec<String> {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter", "label=opkernel.managed=true"])
        .output()
        .unwrap();
    let mut ids: Vec<String> = stdout(&out).split_whitespace().map(str::to_owned).collect();
    ids.sort();
    ids
}

fn exists(container: &str) -> bool {
    Command::new("docker")
        .args(["inspect", container])
        .output()
        .unwrap()
        .status
        .success()
}

#[tokio::test]
async fn the_reaper_removes_only_what_is_provably_abandoned() {
    let k = KernelProcess::start(
        &kernel_binary().unwrap(),
        "reap",
        &[("OPKERNEL_REAP_TTL", "2s")],
    )
    .await
    .unwrap();
    let (busy, done) = (unique_run("busy"), unique_run("done"));
    let live = k.start_bg(&busy, &["sleep", "300"], 600).await.unwrap();
    let busy_c = k.container_of(&live).await.unwrap();
    let quick = k.start_bg(&done, &["true"], 60).await.unwrap();
    let done_c = k
        .wait_terminal(&quick, Duration::from_secs(30))
        .await
        .unwrap()["container_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // a container without our label, and one of ours whose run is unknown but has a live process
    let stranger = stdout(
        &Command::new("docker")
            .args(["run", "-d", "--label", "purpose=not-ours"])
            .arg(opkernel_tests::image())
            .args(["sleep", "300"])
            .output()
            .unwrap(),
    )
    .trim()
    .to_owned();
    let decide = |dry: bool| {
        let k = &k;
        async move {
            let v = k
                .client
                .post(&format!("/v1/reap?dry_run={dry}"), &json!({}))
                .await
                .unwrap();
            v["decisions"].as_array().unwrap().clone()
        }
    };
    let of = |ds: &[Value], c: &str| {
        ds.iter()
            .find(|d| d["container_id"] == c)
            .cloned()
            .unwrap_or(Value::Null)
    };
    // young containers are kept, with the reason
    let first = decide(true).await;
    assert_eq!(of(&first, &busy_c)["action"], "keep");
    assert!(
        of(&first, &busy_c)["reason"]
            .as_str()
            .unwrap()
            .contains(&live),
        "{first:?}"
    );
    assert_eq!(
        of(&first, &stranger),
        Value::Null,
        "unmanaged containers are not even considered"
    );
    // past the ttl: the idle one is a removal candidate; a dry run acts on nothing
    tokio::time::sleep(Duration::from_secs(3)).await;
    let dry = decide(true).await;
    assert_eq!(of(&dry, &done_c)["action"], "remove", "{dry:?}");
    assert_eq!(of(&dry, &done_c)["removed"], false);
    assert!(exists(&done_c));
    let real = decide(false).await;
    assert_eq!(of(&real, &done_c)["removed"], true, "{real:?}");
    assert!(!exists(&done_c));
    assert_eq!(
        of(&real, &busy_c)["action"],
        "keep",
        "a live op keeps its container"
    );
    assert!(exists(&busy_c) && exists(&stranger));
    // the run's result survives its container
    let s = k.state(&quick).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["exit_code"].as_i64()),
        (Some("completed"), Some(0))
    );
    Command::new("docker")
        .args(["rm", "-f", &stranger])
        .output()
        .unwrap();
}

/// `opkernel run` sends its start with one `Idempotency-Key` and sends it
/// again, same key, while the kernel does not answer (issue 36 item 18):
/// a kernel down in the middle of a start costs a wait, the command runs
/// once (before, the CLI failed at once, and a retry by hand could run it
/// twice when the first commit had landed).
#[tokio::test]
async fn a_cli_start_across_a_kernel_restart_runs_once() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let env = [("OPKERNEL_TEST_LISTEN", listen.as_str())];
    let mut k = KernelProcess::start(&kernel_binary().unwrap(), "cli-retry", &env)
        .await
        .unwrap();
    let run = unique_run("retry");
    let first = cli(&k, &["run", "--run", &run, "--", "true"]);
    assert_eq!(first.status.code(), Some(0), "{first:?}");
    k.sigkill();
    let (url, home, bin) = (
        k.client.base().to_owned(),
        k.home.clone(),
        kernel_binary().unwrap(),
    );
    let side = "echo once >> /scratch/side; wc -l < /scratch/side";
    let args: Vec<String> = ["run", "--run", &run, "--", "sh", "-c", side]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let started = std::thread::spawn(move || {
        Command::new(bin)
            .args(&args)
            .env("OPKERNEL_URL", url)
            .env("OPKERNEL_HOME", home)
            .env_remove("OPKERNEL_TOKEN")
            .output()
            .unwrap()
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    k.spawn().await.unwrap();
    let out = tokio::task::spawn_blocking(move || started.join().unwrap())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(stdout(&out).trim(), "1", "{out:?}");
    let count = cli(&k, &["run", "--run", &run, "--", "cat", "/scratch/side"]);
    assert_eq!(stdout(&count), "once\n", "the command ran once");
}
