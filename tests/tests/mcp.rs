#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The MCP server through the official Python MCP client (PyPI `mcp`, in
//! the virtualenv `scripts/test.sh` makes): both transports, both protocol
//! eras, tools, reports exactly once across dropped sessions, resources,
//! resolution events, tool errors. The client's test file is
//! `tests/mcp/test_mcp.py`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use opkernel::drills::harness::{kernel_binary, KernelProcess};

fn python() -> PathBuf {
    match std::env::var_os("OPKERNEL_MCP_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-venv/bin/python"),
    }
}

#[tokio::test]
async fn the_official_python_client_drives_both_transports() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: scripts/test.sh makes the MCP client's virtualenv",
        python.display()
    );
    let k = KernelProcess::start(&kernel_binary().unwrap(), "mcp", &[])
        .await
        .unwrap();
    let operator = std::fs::read_to_string(k.home.join("operator.token")).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mcp/test_mcp.py");
    let out = tokio::task::spawn_blocking({
        let (base, bin) = (k.client.base().to_owned(), kernel_binary().unwrap());
        move || {
            Command::new(python)
                .arg(script)
                .env("OPKERNEL_URL", base)
                .env("OPKERNEL_BIN", bin)
                .env("OPKERNEL_OPERATOR_TOKEN", operator.trim())
                .env("PYTHONWARNINGS", "ignore")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // the latency line and the negotiated versions, for the record
    for line in stderr
        .lines()
        .filter(|l| l.starts_with("LATENCY") || l.contains("protocol"))
    {
        eprintln!("{line}");
    }
    assert!(out.status.success(), "python MCP tests failed:\n{stderr}");
    assert!(stderr.contains("Ran 9 tests"), "{stderr}");
}

/// A raw MCP client for one legacy (2025-11-25) session at `/mcp`: each
/// call is its own HTTP request, so a test decides exactly when a client
/// hangs up.
struct RawSession {
    base: String,
    token: String,
    session: String,
    http: reqwest::Client,
    next_id: u64,
}

/// The JSON-RPC message answering `id` in an SSE (or JSON) response body.
fn answer_in(body: &str, id: u64) -> Option<serde_json::Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .chain(std::iter::once(body))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d.trim()).ok())
        .find(|m| m["id"] == id)
}

impl RawSession {
    async fn open(base: &str, token: &str) -> RawSession {
        let http = reqwest::Client::new();
        let hello = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}});
        let resp = http
            .post(format!("{base}/mcp"))
            .bearer_auth(token)
            .header("Accept", "application/json, text/event-stream")
            .json(&hello)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let session = resp.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let body = resp.text().await.unwrap();
        assert!(answer_in(&body, 0).is_some(), "{body}");
        let s = RawSession {
            base: base.to_owned(),
            token: token.to_owned(),
            session,
            http,
            next_id: 1,
        };
        let initialized =
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let resp = s.post(&initialized).send().await.unwrap();
        assert_eq!(resp.status(), 202);
        s
    }

    fn post(&self, body: &serde_json::Value) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}/mcp", self.base))
            .bearer_auth(&self.token)
            .header("Accept", "application/json, text/event-stream")
            .header("Mcp-Session-Id", &self.session)
            .header("Mcp-Protocol-Version", "2025-11-25")
            .json(body)
    }

    fn tool_call(&mut self, name: &str, args: serde_json::Value) -> (u64, serde_json::Value) {
        let id = self.next_id;
        self.next_id += 1;
        let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                                      "params": {"name": name, "arguments": args}});
        (id, body)
    }

    /// Calls a tool and reads its whole answer: the result's structured content.
    async fn call(&mut self, name: &str, args: serde_json::Value) -> serde_json::Value {
        let (id, body) = self.tool_call(name, args);
        let resp = self.post(&body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.unwrap();
        let answer = answer_in(&text, id).unwrap_or_else(|| panic!("no answer in {text}"));
        assert_eq!(answer["result"]["isError"], false, "{answer}");
        answer["result"]["structuredContent"].clone()
    }

    /// Sends a tool call over its own connection and hangs up after `after`,
    /// whatever came back by then.
    async fn call_and_hang_up(&mut self, name: &str, args: serde_json::Value, after: Duration) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (_, body) = self.tool_call(name, args);
        let body = body.to_string();
        let addr = self.base.trim_start_matches("http://").to_owned();
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
             Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n\
             Mcp-Session-Id: {}\r\nMcp-Protocol-Version: 2025-11-25\r\n\
             Content-Length: {}\r\n\r\n{body}",
            self.token,
            self.session,
            body.len()
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        let mut seen = Vec::new();
        let _ = tokio::time::timeout(after, async {
            let mut buf = [0u8; 4096];
            while let Ok(n) = conn.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
            }
        })
        .await;
        let seen = String::from_utf8_lossy(&seen);
        assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
        assert!(
            !seen.contains("report_id"),
            "answered before the hang-up: {seen}"
        );
        drop(conn);
    }
}

/// The run's reports as the API keeps them (newest first).
async fn reports(k: &KernelProcess, run: &str) -> Vec<serde_json::Value> {
    let listing = k
        .client
        .get(&format!("/v1/runs/{run}/reports"))
        .await
        .unwrap();
    listing["reports"].as_array().unwrap().clone()
}

/// Issue 22, defect 1: a report answered into a wait the client abandoned
/// (its connection closed mid-wait) never reached it; it is served again,
/// under the same report_id, and acknowledged only once a later call shows
/// the client has it.
#[tokio::test]
async fn a_report_answered_into_an_abandoned_http_wait_is_served_again() {
    let k = KernelProcess::start(&kernel_binary().unwrap(), "mcp-abandon", &[])
        .await
        .unwrap();
    let run = format!("mcp-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let created = k
        .client
        .post("/v1/runs", &serde_json::json!({"run_id": run}))
        .await
        .unwrap();
    let token = created["token"].as_str().unwrap().to_owned();
    let mut s = RawSession::open(k.client.base(), &token).await;
    let started = s
        .call(
            "run_command",
            serde_json::json!({"command": ["sh", "-c", "sleep 5; echo LOST-ME"], "background": true}),
        )
        .await;
    let op = started["operation_id"].as_str().unwrap().to_owned();
    // the client gives up on its wait after 2 s and closes the connection
    s.call_and_hang_up(
        "wait_background_report",
        serde_json::json!({"wait_sec": 60}),
        Duration::from_secs(2),
    )
    .await;
    k.wait_terminal(&op, Duration::from_secs(60)).await.unwrap();
    // the abandoned wait drained the op into a report: it exists, unacked
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let stored = loop {
        let list = reports(&k, &run).await;
        if let Some(r) = list
            .iter()
            .find(|r| r["text"].as_str().unwrap().contains("LOST-ME"))
        {
            break r.clone();
        }
        assert!(std::time::Instant::now() < deadline, "no report: {list:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let id = stored["report_id"].as_str().unwrap().to_owned();
    let now = reports(&k, &run).await;
    let still = now.iter().find(|r| r["report_id"] == id.as_str()).unwrap();
    assert!(
        still["acked_at"].is_null(),
        "acked before the client saw it: {still}"
    );
    // the next wait gets the very report, not acknowledged by asking
    let again = s
        .call("wait_background_report", serde_json::json!({"wait_sec": 0}))
        .await;
    assert_eq!(again["report_id"], id.as_str(), "{again}");
    assert!(
        again["text"].as_str().unwrap().contains("LOST-ME"),
        "{again}"
    );
    let now = reports(&k, &run).await;
    let still = now.iter().find(|r| r["report_id"] == id.as_str()).unwrap();
    assert!(still["acked_at"].is_null(), "{still}");
    // a later call shows the client has it (its answer was written to it)
    s.call("operation_state", serde_json::json!({"operation_id": op}))
        .await;
    let now = reports(&k, &run).await;
    let acked = now.iter().find(|r| r["report_id"] == id.as_str()).unwrap();
    assert!(acked["acked_at"].is_string(), "{acked}");
    let (status, next) = k
        .client
        .request(
            reqwest::Method::GET,
            &format!("/v1/runs/{run}/report?wait=0"),
            None,
            &[],
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(next["report_id"].is_null(), "{next}");
}

/// `opkernel mcp` makes one `Idempotency-Key` per `run_command` call and
/// sends it again with that key while the kernel does not answer (issue
/// 36 item 18): a kernel SIGKILLed in the middle of a host's call costs a
/// wait, and the command runs once (before, the host got an error, and a
/// retry could run it twice when the first commit had landed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_start_across_a_kernel_restart_runs_once() {
    use std::io::{BufRead, BufReader, Write};
    let python = python();
    assert!(python.exists(), "{} is missing", python.display());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let env = [("OPKERNEL_TEST_LISTEN", listen.as_str())];
    let mut k = KernelProcess::start(&kernel_binary().unwrap(), "mcp-retry", &env)
        .await
        .unwrap();
    let run = opkernel_tests::unique_run("mcp-retry");
    let created = k
        .client
        .post("/v1/runs", &serde_json::json!({"run_id": run}))
        .await
        .unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mcp/retry_start.py");
    let mut child = Command::new(python)
        .arg(script)
        .env("OPKERNEL_URL", k.client.base())
        .env("OPKERNEL_BIN", kernel_binary().unwrap())
        .env("RUN", &run)
        .env("RUN_TOKEN", created["token"].as_str().unwrap())
        .env("PYTHONWARNINGS", "ignore")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::task::block_in_place(|| lines.next().unwrap().unwrap());
    assert_eq!(ready, "ready");
    k.sigkill();
    writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    k.spawn().await.unwrap();
    let answer = tokio::task::block_in_place(|| lines.next().unwrap().unwrap());
    let _ = child.wait();
    let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["error"], false, "{v}");
    assert_eq!(v["result"]["exit_code"], 0, "{v}");
    let side = k
        .home
        .join("scratch")
        .join(sandbox::profile::scratch_key(&run))
        .join("side");
    assert_eq!(std::fs::read_to_string(side).unwrap(), "once\n", "ran once");
}
