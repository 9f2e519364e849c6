#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The operators' surfaces (SPEC §23) against a live kernel: inspect of a
//! container with a live op (its process in the table, over the API and
//! the CLI); its Prometheus metrics, scraped by a real Prometheus server (Debian's
//! `prometheus` package, which `scripts/test.sh` installs) and checked by
//! `promtool check metrics`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel::surfaces::cli::client::Client;
use opkernel_tests::unique_run;
use reqwest::Method;
use serde_json::{json, Value};

/// A free loopback port (bound, read, released).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

async fn get_text(url: &str, token: Option<&str>) -> (u16, String) {
    let mut req = reqwest::Client::new().get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// The value of the one sample line `series` (name and labels as printed).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// A kernel with one completed background op, delivered, and a run token.
async fn kernel_with_history(metrics_port: u16) -> (KernelProcess, String, Client) {
    let listen = format!("127.0.0.1:{metrics_port}");
    let env = [("OPKERNEL_METRICS_LISTEN", listen.as_str())];
    let k = KernelProcess::start(&kernel_binary().unwrap(), "metrics", &env)
        .await
        .unwrap();
    let run = unique_run("metrics");
    let (s, v) = k
        .client
        .request(Method::POST, "/v1/runs", Some(&json!({"run_id": run})), &[])
        .await
        .unwrap();
    assert_eq!(s, 200, "{v}");
    let run_client = Client::new(
        k.client.base().to_owned(),
        v["token"].as_str().unwrap().to_owned(),
    );
    let op = k.start_bg(&run, &["sh", "-c", "exit 3"], 60).await.unwrap();
    k.wait_terminal(&op, Duration::from_secs(60)).await.unwrap();
    let delivered = k
        .collect_deliveries(&run, 1, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(delivered, vec![op]);
    (k, run, run_client)
}

#[tokio::test]
async fn metrics_are_served_to_the_operator_and_on_the_open_listener() {
    let port = free_port();
    let (k, _run, run_client) = kernel_with_history(port).await;
    let url = format!("{}/metrics", k.client.base());
    let (status, text) = get_text(&url, Some(k.client.token())).await;
    assert_eq!(status, 200, "{text}");
    assert!(sample(&text, "opkernel_ops_total{status=\"completed\"}").unwrap() >= 1.0);
    assert_eq!(
        sample(&text, "opkernel_ops_total{status=\"lost\"}"),
        Some(0.0)
    );
    assert!(sample(&text, "opkernel_op_starts_total").unwrap() >= 1.0);
    assert!(sample(&text, "opkernel_op_start_seconds_count").unwrap() >= 1.0);
    assert!(sample(&text, "opkernel_op_report_seconds_count").unwrap() >= 1.0);
    assert_eq!(sample(&text, "opkernel_live_ops"), Some(0.0));
    assert_eq!(sample(&text, "opkernel_reports_pending"), Some(0.0));
    assert!(sample(&text, "opkernel_containers{state=\"running\"}").unwrap() >= 1.0);
    assert!(
        sample(
            &text,
            "opkernel_store_transaction_seconds_count{kind=\"write\"}"
        )
        .unwrap()
            > 0.0
    );

    // a run token is refused; no token at all too
    let (status, body) = get_text(&url, Some(run_client.token())).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(get_text(&url, None).await.0, 401);

    // the open listener needs none, and serves nothing else
    let open = format!("http://127.0.0.1:{port}");
    let (status, open_text) = get_text(&format!("{open}/metrics"), None).await;
    assert_eq!(status, 200);
    assert!(open_text.contains("# TYPE opkernel_ops_total counter"));
    assert_eq!(get_text(&format!("{open}/v1/runs"), None).await.0, 404);

    // Prometheus's own linter accepts the exposition
    let file = k.home.join("metrics.txt");
    std::fs::write(&file, &text).unwrap();
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .expect("promtool (Debian's prometheus package) must be installed");
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    k.remove_containers();
}

/// A Prometheus server scraping `targets` (job name, address, bearer
/// token) every second, on a port of its own; stopped when dropped.
struct Prometheus {
    child: std::process::Child,
    url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(dir: &std::path::Path, targets: &[(&str, String, Option<&str>)]) -> Prometheus {
        let mut config = String::from("global:\n  scrape_interval: 1s\nscrape_configs:\n");
        for (job, addr, token) in targets {
            config += &format!("  - job_name: {job}\n");
            if let Some(t) = token {
                config += &format!("    authorization:\n      credentials: {t}\n");
            }
            config += &format!("    static_configs:\n      - targets: ['{addr}']\n");
        }
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).unwrap();
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus (Debian's package) must be installed");
        Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// The instant vector of `query` (empty while Prometheus is not up).
    async fn query(&self, query: &str) -> Vec<Value> {
        let resp = reqwest::Client::new()
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", query)])
            .send()
            .await;
        let Ok(resp) = resp else { return Vec::new() };
        let v: Value = resp.json().await.unwrap_or_default();
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Waits (at most 60 s) until `query` returns `n` series.
    async fn wait_series(&self, query: &str, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = self.query(query).await;
            if got.len() == n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus: {query} gave {got:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

#[tokio::test]
async fn a_real_prometheus_scrapes_both_listeners() {
    let port = free_port();
    let (k, _run, _) = kernel_with_history(port).await;
    let api = k.client.base().trim_start_matches("http://").to_owned();
    let prom = Prometheus::start(
        &k.home,
        &[
            ("open", format!("127.0.0.1:{port}"), None),
            ("api", api, Some(k.client.token())),
        ],
    );
    let up = prom.wait_series("up == 1", 2).await;
    assert_eq!(up.len(), 2, "{up:?}");
    let completed = prom
        .wait_series("opkernel_ops_total{status=\"completed\"} >= 1", 2)
        .await;
    assert_eq!(completed.len(), 2, "{completed:?}");
    let hist = prom
        .wait_series("opkernel_op_start_seconds_count{job=\"api\"}", 1)
        .await;
    assert_eq!(hist.len(), 1);
    drop(prom);
    k.remove_containers();
}

/// Inspects `target` until a process whose command starts with `command`
/// shows (at most 20 s).
async fn inspect_until(k: &KernelProcess, target: &str, command: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = k
            .client
            .get(&format!("/v1/containers/{target}"))
            .await
            .unwrap();
        let shows = v["processes"].as_array().is_some_and(|procs| {
            procs.iter().any(|p| {
                p["command"]
                    .as_str()
                    .is_some_and(|c| c.starts_with(command))
            })
        });
        if shows || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn cli(k: &KernelProcess, args: &[&str]) -> std::process::Output {
    Command::new(kernel_binary().unwrap())
        .args(args)
        .env("OPKERNEL_URL", k.client.base())
        .env("OPKERNEL_TOKEN", k.client.token())
        .output()
        .unwrap()
}

#[tokio::test]
async fn inspect_shows_a_live_op_and_its_process() {
    let k = KernelProcess::start(&kernel_binary().unwrap(), "inspect", &[])
        .await
        .unwrap();
    let run = unique_run("inspect");
    let op = k
        .start_bg(&run, &["sh", "-c", "echo started; sleep 40"], 120)
        .await
        .unwrap();
    let container = k.container_of(&op).await.unwrap();
    // until the shell has started its sleep
    let v = inspect_until(&k, &run, "sleep 40").await;
    assert_eq!(v["container_id"], container.as_str(), "{v}");
    assert_eq!(v["run_id"], run.as_str());
    assert_eq!(v["state"], "running");
    assert!(
        v["fingerprint"].as_str().is_some_and(|f| f.len() == 64),
        "{v}"
    );
    assert!(v["labels"]["opkernel.managed"] == "true", "{v}");
    assert!(v["profile"]["image"].is_string(), "{v}");
    assert_eq!(v["ops"][0]["operation_id"], op.as_str());
    assert_eq!(v["ops"][0]["status"], "running");
    assert!(v["scratch_bytes"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["reaper"]["verdict"], "keep", "{v}");
    assert!(v["reaper"]["reason"].as_str().unwrap().contains(&op), "{v}");
    let procs = v["processes"].as_array().unwrap_or_else(|| panic!("{v}"));
    let sleep = procs
        .iter()
        .find(|p| p["command"].as_str().unwrap().starts_with("sleep 40"))
        .unwrap_or_else(|| panic!("no sleep in {v}"));
    assert_eq!(sleep["operation_id"], op.as_str());
    assert!(sleep["pid"].as_u64().unwrap() > 1);
    assert!(sleep["rss"].as_u64().unwrap() > 0, "{sleep}");
    assert!(sleep["age"].as_f64().unwrap() >= 0.0);
    assert!(sleep["cpu"].as_f64().unwrap() >= 0.0);
    assert_ne!(sleep["user"], "root", "commands run unprivileged: {sleep}");
    assert!(procs.iter().all(|p| p["operation_id"] == op.as_str()));
    assert_eq!(v["processes_source"], "launcher", "asked through the inbox");

    // the same container by id prefix and by name; unknown and run tokens refused
    let by_prefix = k
        .client
        .get(&format!("/v1/containers/{}", &container[..12]))
        .await
        .unwrap();
    assert_eq!(by_prefix["container_id"], container.as_str());
    let name = v["name"].as_str().unwrap();
    let by_name = k
        .client
        .get(&format!("/v1/containers/{name}"))
        .await
        .unwrap();
    assert_eq!(by_name["container_id"], container.as_str());
    let (status, _) = k
        .client
        .request(Method::GET, "/v1/containers/no-such-thing", None, &[])
        .await
        .unwrap();
    assert_eq!(status, 404);

    // the CLI: a readable summary, and the same JSON
    let out = cli(&k, &["inspect", &run]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&container) && text.contains("sleep 40"),
        "{text}"
    );
    assert!(text.contains("reaper      keep"), "{text}");
    let out = cli(&k, &["inspect", &container[..12], "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["container_id"], container.as_str());
    let out = cli(&k, &["inspect", "a/b"]);
    assert!(!out.status.success());

    k.client
        .post(
            &format!("/v1/runs/{run}/tools/kill_operation"),
            &json!({"operation_id": op}),
        )
        .await
        .unwrap();
    let after = k
        .client
        .get(&format!("/v1/containers/{run}"))
        .await
        .unwrap();
    assert_eq!(after["processes"], json!([]), "{after}");
    k.remove_containers();
}

#[tokio::test]
async fn without_a_launcher_inspect_reads_the_table_by_exec() {
    let env = [("OPKERNEL_LAUNCHER", "off")];
    let k = KernelProcess::start(&kernel_binary().unwrap(), "inspect-exec", &env)
        .await
        .unwrap();
    let run = unique_run("inspectx");
    let op = k.start_bg(&run, &["sleep", "30"], 60).await.unwrap();
    k.container_of(&op).await.unwrap();
    let v = inspect_until(&k, &run, "sleep 30").await;
    assert_eq!(v["processes_source"], "exec", "{v}");
    let procs = v["processes"].as_array().unwrap();
    assert!(procs.iter().any(|p| p["command"] == "sleep 30"), "{v}");
    k.remove_containers();
}

/// A bad value of any setting refuses the start, naming the setting; it
/// never quietly becomes the default (SPEC §24, issue 36 item 12: before,
/// `OPKERNEL_GRACE_MS=60s` started a kernel on the defaults), under its
/// name and under its old one (issue 37: one settings table).
#[test]
fn a_bad_setting_refuses_the_start_naming_it() {
    let bin = kernel_binary().unwrap();
    for (name, value) in [
        ("OPKERNEL_GRACE", "60"),
        ("OPKERNEL_GRACE_MS", "60s"),
        ("OPKERNEL_MEMORY", "2 gallons"),
        ("OPKERNEL_MAX_OPS", "lots"),
        ("OPKERNEL_LOG_CAP", "-5"),
        ("OPKERNEL_REAP_TTL_SECONDS", "1h"),
        ("OPKERNEL_NODE_TTL", "ten"),
        ("OPKERNEL_LAUNCHER", "maybe"),
    ] {
        let home = opkernel_tests::temp_home("settings");
        let out = Command::new(&bin)
            .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
            .env("OPKERNEL_HOME", &home)
            .env(name, value)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}={value} started: {stderr}");
        assert!(
            stderr.contains(name) && stderr.contains(value),
            "{name}={value}: the refusal names the setting and its value: {stderr}"
        );
        let _ = std::fs::remove_dir_all(&home);
    }
    // sizes take one syntax with units, and plain bytes as before; an old
    // name is read in its old unit, with a warning
    let home = opkernel_tests::temp_home("settings");
    let mut child = Command::new(&bin)
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .env("OPKERNEL_HOME", &home)
        .env("OPKERNEL_MEMORY", "512MiB")
        .env("OPKERNEL_LOG_CAP_BYTES", "1048576")
        .env("OPKERNEL_GRACE_MS", "3000")
        .env("OPKERNEL_POOL", "0")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        child.try_wait().unwrap().is_none(),
        "512MiB, a plain byte count and old names are accepted"
    );
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("OPKERNEL_GRACE_MS is the old name of OPKERNEL_GRACE")
            && stderr.contains("OPKERNEL_LOG_CAP_BYTES is the old name of OPKERNEL_LOG_CAP"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&home);
}

#[tokio::test]
async fn non_loopback_listen_needs_an_explicit_flag() {
    let home = opkernel_tests::temp_home("remote");
    let out = Command::new(kernel_binary().unwrap())
        .args(["serve", "--listen", "0.0.0.0:0", "--home"])
        .arg(&home)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-remote"));
    let _ = std::fs::remove_dir_all(home);
}

#[tokio::test]
async fn a_second_kernel_on_the_same_home_refuses_to_start() {
    let k = KernelProcess::start(&kernel_binary().unwrap(), "lock", &[])
        .await
        .unwrap();
    let out = Command::new(kernel_binary().unwrap())
        .args(["serve", "--listen", "127.0.0.1:0", "--home"])
        .arg(&k.home)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("another opkernel serve owns"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
