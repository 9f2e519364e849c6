#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End-to-end guards of the reaper and the reports against the real
//! engine: new ops on finished runs are never reaped, foreground ops stay
//! out of reports, the CLI's finish shows what is undelivered, the shim
//! leaves nothing behind, and SIGTERM does not wait for the reaper.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel::drills::proxy::{DockerProxy, Hold};
use opkernel::report_text::{MAX_NOTE_BYTES, MAX_REPORT_ITEMS, MAX_REPORT_NOTE_BYTES};
use opkernel_tests::{assert_only_init_and_launcher, RequestWatch};
use serde_json::json;
use sha2::{Digest, Sha256};

const T: Duration = Duration::from_secs(60);

async fn kernel(tag: &str, env: &[(&str, &str)]) -> KernelProcess {
    KernelProcess::start(&kernel_binary().unwrap(), tag, env)
        .await
        .unwrap()
}

fn unique_run(tag: &str) -> String {
    opkernel_tests::unique_run(tag)
}

/// The drills' proxy in front of the real Docker socket (it holds chosen
/// requests), and a watch in front of it that sees each request reach it:
/// the kernel's socket is the watch's.
fn docker_proxy() -> (DockerProxy, RequestWatch, PathBuf) {
    let tmp = std::env::temp_dir();
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let upstream = std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_owned))
        .unwrap_or_else(|| "/var/run/docker.sock".into());
    let proxy_sock = tmp.join(format!("opk-proxy-{tag}.sock"));
    let proxy = DockerProxy::start(&proxy_sock, std::path::Path::new(&upstream)).unwrap();
    let sock = tmp.join(format!("opk-watch-{tag}.sock"));
    let watch = RequestWatch::start(&sock, &proxy_sock);
    (proxy, watch, sock)
}

/// The reaper against new ops of a finished run, each race forced by
/// holding the reaper at the Docker daemon: an op admitted between the
/// reaper's first look and its removal keeps the container (the second
/// look under the run's gate), and a launch that comes while the reaper
/// removes the container (holding the gate) waits for the removal and runs
/// in a new container, once.
#[tokio::test]
async fn new_ops_on_a_finished_run_are_never_reaped_from_under_them() {
    let (proxy, requests, sock) = docker_proxy();
    let k = kernel(
        "finished",
        &[("OPKERNEL_DOCKER_SOCKET", sock.to_str().unwrap())],
    )
    .await;
    // another run's container, made first: the reaper looks at it after
    // the finished run's (Docker lists the newest container first)
    let other = unique_run("other");
    let o = k.start_bg(&other, &["true"], 60).await.unwrap();
    let later = k.wait_terminal(&o, T).await.unwrap()["container_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = unique_run("finished");
    let first = k.start_bg(&run, &["true"], 60).await.unwrap();
    let old = k.wait_terminal(&first, T).await.unwrap()["container_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let listed = Command::new("docker")
        .args(["ps", "-a", "--no-trunc", "--format", "{{.ID}}"])
        .args(["--filter", "label=opkernel.managed=true"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    let at = |id: &str| listed.lines().position(|l| l == id).unwrap();
    assert!(
        at(&old) < at(&later),
        "Docker lists {old} after {later}: {listed}"
    );
    let finish = |k: &KernelProcess| {
        let c = k.client.clone();
        let path = format!("/v1/runs/{run}/finish");
        async move { c.post(&path, &json!({})).await.unwrap() }
    };
    finish(&k).await;
    let reap = |k: &KernelProcess| {
        let c = k.client.clone();
        tokio::spawn(async move { c.post("/v1/reap", &json!({})).await.unwrap() })
    };
    let decision_on = |reaped: &serde_json::Value, id: &str| {
        reaped["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["container_id"] == id)
            .unwrap_or_else(|| panic!("no decision on {id}: {reaped}"))
            .clone()
    };
    let ran = |k: &KernelProcess| {
        std::fs::read_to_string(
            k.home
                .join("scratch")
                .join(sandbox::profile::scratch_key(&run))
                .join("n"),
        )
        .unwrap_or_default()
    };

    // 1. the reaper's first look at the finished run's container is done
    // (it will remove it), its look at the other container is held at
    // `docker top`. An op of the finished run is admitted and ends meanwhile.
    let top = format!("/containers/{later}/top");
    proxy.hold(&[top.as_str()]);
    let looking = reap(&k);
    requests.wait_for(&["GET ", &top], 1, T).await;
    let a = k
        .start_bg(&run, &["sh", "-c", "echo a >> /scratch/n"], 60)
        .await
        .unwrap();
    let s = k.wait_terminal(&a, T).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["exit_code"].as_i64()),
        (Some("completed"), Some(0)),
        "{s}"
    );
    assert_eq!(s["container_id"], old.as_str(), "{s}");
    assert!(!looking.is_finished(), "the reaper was not held");
    proxy.end_hold(Hold::Release);
    let reaped = looking.await.unwrap();
    let d = decision_on(&reaped, &old);
    assert_eq!(
        (d["action"].as_str(), d["removed"].as_bool()),
        (Some("keep"), Some(false)),
        "{d}"
    );
    assert!(
        d["reason"]
            .as_str()
            .unwrap()
            .starts_with("kept on a second look under the run's gate: "),
        "{d}"
    );

    // 2. the reaper removes the container (its second look under the run's
    // gate found nothing new), holding the gate: the removal is held at the
    // daemon. An op started meanwhile must wait for the gate: started in
    // the doomed container, it would be cut off by the removal.
    finish(&k).await;
    let delete = format!("/containers/{old}");
    proxy.hold(&["DELETE ", &delete]);
    let removal = reap(&k);
    requests.wait_for(&["DELETE ", &delete], 1, T).await;
    let b = k
        .start_bg(&run, &["sh", "-c", "echo b >> /scratch/n"], 60)
        .await
        .unwrap();
    // time enough for a launch that does not wait for the gate to start in
    // the old container (op a, in the same container, took less)
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        let s = k.state(&b).await.unwrap();
        assert!(
            s["container_id"].is_null() && s["pid"].is_null() && s["status"] == "starting",
            "an op launched while its container {old} was being removed: {s}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!removal.is_finished(), "the removal was not held");
    proxy.end_hold(Hold::Release);
    let reaped = removal.await.unwrap();
    let d = decision_on(&reaped, &old);
    assert_eq!(
        (d["action"].as_str(), d["removed"].as_bool()),
        (Some("remove"), Some(true)),
        "{d}"
    );
    let s = k.wait_terminal(&b, T).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["exit_code"].as_i64()),
        (Some("completed"), Some(0)),
        "{s}"
    );
    assert_ne!(
        s["container_id"],
        old.as_str(),
        "the op ran in the removed container: {s}"
    );
    assert_eq!(ran(&k), "a\nb\n", "each op ran once");
    let _ = std::fs::remove_file(proxy.socket());
    drop(requests);
}

#[tokio::test]
async fn foreground_results_stay_out_of_reports() {
    let k = kernel("fgreport", &[]).await;
    let run = unique_run("fgreport");
    let bg = k
        .start_bg(&run, &["sh", "-c", "sleep 2; exit 1"], 60)
        .await
        .unwrap();
    let client = k.client.clone();
    let fg_path = format!("/v1/runs/{run}/tools/run_command");
    let fg = tokio::spawn(async move {
        client
            .post(
                &fg_path,
                &json!({"command": ["sh", "-c", "sleep 1; echo inline"], "background": false}),
            )
            .await
            .unwrap()
    });
    // reports drained while the foreground op runs and right after it ended
    let mut reports = Vec::new();
    for _ in 0..2 {
        let r = k
            .client
            .get(&format!("/v1/runs/{run}/report?wait=5"))
            .await
            .unwrap();
        if let Some(id) = r["report_id"].as_str() {
            k.client
                .post(&format!("/v1/runs/{run}/report/{id}/ack"), &json!({}))
                .await
                .unwrap();
        }
        reports.push(r);
    }
    let fg = fg.await.unwrap();
    assert_eq!(fg["status"], "completed");
    assert_eq!(fg["output"], "inline\n", "{fg}");
    let fg_id = fg["operation_id"].as_str().unwrap();
    for r in &reports {
        assert!(
            !r.to_string().contains(fg_id),
            "foreground op in a report: {r}"
        );
    }
    let delivered: Vec<_> = reports
        .iter()
        .flat_map(|r| r["resolved"].as_array().unwrap().clone())
        .map(|i| i["operation_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(delivered, vec![bg]);
}

/// More results and notes than one report holds: the CLI's finish prints
/// every op's own outcome and every pending report, acking each, until
/// nothing is left undelivered.
#[tokio::test]
async fn cli_finish_shows_every_undelivered_report_with_its_notes() {
    let k = kernel("clifinish", &[]).await;
    let run = unique_run("clifinish");
    // past one report's bound of results, with codes of their own
    let mut ops = Vec::new();
    for i in 0..MAX_REPORT_ITEMS + 3 {
        let code = i % 7;
        let id = k
            .start_bg(
                &run,
                &["sh", "-c", &format!("echo out-{i}; exit {code}")],
                60,
            )
            .await
            .unwrap();
        ops.push((id, code));
    }
    // and past one report's bound of note bytes
    let note_bytes = MAX_NOTE_BYTES * 3 / 4;
    let notes: Vec<String> = (0..3)
        .map(|i| format!("note-{i}: please wrap up {}", "z".repeat(note_bytes)))
        .collect();
    assert!(notes.iter().map(String::len).sum::<usize>() > MAX_REPORT_NOTE_BYTES);
    for note in &notes {
        k.client
            .post(&format!("/v1/runs/{run}/notes"), &json!({ "text": note }))
            .await
            .unwrap();
    }
    let out = Command::new(kernel_binary().unwrap())
        .args(["finish", "--run", &run])
        .env("OPKERNEL_URL", k.client.base())
        .env("OPKERNEL_HOME", &k.home)
        .env_remove("OPKERNEL_TOKEN")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports = text.matches("[Background operations report]").count();
    assert!(reports >= 2, "{reports} report(s) printed: {text}");
    for (id, code) in &ops {
        // the op's own outcome, then its one showing in a report
        assert_eq!(
            text.matches(&format!(
                "{id} completed attempt=1 exit_code={code} killed=false"
            ))
            .count(),
            1,
            "{id}'s outcome: {text}"
        );
        assert_eq!(
            text.matches(&format!("- {id} finished: exit_code={code}"))
                .count(),
            1,
            "{id} in the reports: {text}"
        );
    }
    for (i, note) in notes.iter().enumerate() {
        assert_eq!(text.matches(note.as_str()).count(), 1, "note {i}: {text}");
    }
    // every report was acked: nothing is served again, nothing is pending
    let again = k
        .client
        .get(&format!("/v1/runs/{run}/report"))
        .await
        .unwrap();
    assert!(again["report_id"].is_null(), "{again}");
    let listed = k
        .client
        .get(&format!("/v1/runs/{run}/reports"))
        .await
        .unwrap();
    let listed = listed["reports"].as_array().unwrap();
    assert_eq!(listed.len(), reports, "{listed:?}");
    assert!(
        listed.iter().all(|r| r["acked_at"].is_string()),
        "{listed:?}"
    );
    let delivered: u64 = listed.iter().map(|r| r["resolved"].as_u64().unwrap()).sum();
    assert_eq!(delivered, ops.len() as u64, "{listed:?}");
}

#[tokio::test]
async fn the_shim_leaves_nothing_behind_and_its_log_is_final() {
    let k = kernel("leftovers", &[]).await;
    let run = unique_run("leftovers");
    let op = k.start_bg(&run, &["true"], 60).await.unwrap();
    let s = k.wait_terminal(&op, T).await.unwrap();
    let container = s["container_id"].as_str().unwrap().to_owned();
    // once an op ended, its container holds only its init and launcher
    assert_only_init_and_launcher(&container, Duration::from_secs(1)).await;
    // a process the command leaves behind holds the output pipe: the log is
    // closed off (with a mark) before the code, so its digest is final
    let op = k
        .start_bg(&run, &["sh", "-c", "(sleep 3; echo late) & echo early"], 60)
        .await
        .unwrap();
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(s["exit_code"], 0, "{s}");
    // what the command left behind was stopped before its code
    assert_only_init_and_launcher(&container, Duration::from_secs(1)).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let log = std::fs::read(
        k.home
            .join("scratch")
            .join(sandbox::profile::scratch_key(&run))
            .join(format!(".ops/{op}.log")),
    )
    .unwrap();
    let text = String::from_utf8_lossy(&log);
    assert!(text.starts_with("early\n"), "{text}");
    assert!(
        text.contains("output written after the command exited is not captured"),
        "{text}"
    );
    assert!(!text.contains("late"), "{text}");
    assert_eq!(s["log_size"].as_u64(), Some(log.len() as u64), "{s}");
    assert_eq!(
        s["log_sha256"].as_str(),
        Some(hex::encode(Sha256::digest(&log)).as_str())
    );
}

/// SIGTERM stops the kernel promptly even while a reaper pass is stuck at
/// the Docker daemon (its `docker top` held): the scheduler's batch is the
/// only work a stop waits for, and the home's lock is free for the next
/// kernel at once.
#[tokio::test]
async fn sigterm_does_not_wait_for_a_stuck_reaper_pass() {
    let (proxy, requests, sock) = docker_proxy();
    let mut k = kernel(
        "sigterm",
        &[
            ("OPKERNEL_DOCKER_SOCKET", sock.to_str().unwrap()),
            ("OPKERNEL_REAP_INTERVAL", "1s"),
        ],
    )
    .await;
    let run = unique_run("sigterm");
    let op = k.start_bg(&run, &["true"], 60).await.unwrap();
    let c = k.wait_terminal(&op, T).await.unwrap()["container_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let top = format!("/containers/{c}/top");
    proxy.hold(&[top.as_str()]);
    // the periodic reaper reaches the held request and waits there
    requests.wait_for(&["GET ", &top], 1, T).await;
    let pid = k.pid().unwrap();
    let sent = std::time::Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let gone = |pid: u32| {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true)
    };
    while !gone(pid) && sent.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = sent.elapsed();
    proxy.end_hold(Hold::Release);
    assert!(gone(pid), "the kernel still runs {took:?} after SIGTERM");
    // the next kernel takes the home (the lock went with the process)
    k.restart().await.unwrap();
    let s = k.state(&op).await.unwrap();
    assert_eq!(s["status"], "completed", "{s}");
}
