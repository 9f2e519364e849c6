#![allow(clippy::unwrap_used, clippy::expect_used)]
//! TLS where users deploy it (SPEC §29), with a CA and certificates the
//! test makes itself (openssl): the API served over `https://` to the
//! CLI, `opkernel mcp` and other clients trusting `OPKERNEL_CA` (and to
//! nobody else), its certificate re-read on SIGHUP while work goes on;
//! webhook posts to an `https://` receiver (one with a certificate from
//! another CA refused and retried until it presents the right one);
//! PostgreSQL in `verify-full` (a wrong host name refused).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opkernel::base::tls::ServerTls;
use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::{certs, temp_home, unique_run};
use serde_json::{json, Value};

/// A directory with a CA `ca`, another CA `other`, and certificates
/// signed by them.
fn pki(tag: &str) -> PathBuf {
    let dir = temp_home(tag);
    certs::ca(&dir, "ca").unwrap();
    certs::ca(&dir, "other").unwrap();
    dir
}

fn fingerprint(pem: &Path) -> String {
    certs::run(
        Command::new("openssl")
            .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
            .arg(pem),
    )
    .unwrap()
}

/// The fingerprint of the certificate a fresh connection to `addr` sees.
fn served_fingerprint(addr: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect {addr} -servername localhost </dev/null 2>/dev/null \
             | openssl x509 -noout -fingerprint -sha256"
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `opkernel <args>` against `url` with `token`, trusting `ca` or not.
fn cli(url: &str, token: &str, ca: Option<&Path>, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(kernel_binary().unwrap());
    cmd.args(args)
        .env("OPKERNEL_URL", url)
        .env("OPKERNEL_TOKEN", token)
        .env_remove("OPKERNEL_CA");
    if let Some(ca) = ca {
        cmd.env("OPKERNEL_CA", ca);
    }
    cmd.output().unwrap()
}

/// `opkernel mcp --run RUN` over an https daemon: initialize, then a
/// foreground `run_command`; the tool's text.
fn mcp_echo(url: &str, token: &str, ca: &Path, run: &str) -> String {
    let mut child = Command::new(kernel_binary().unwrap())
        .args(["mcp", "--run", run])
        .env("OPKERNEL_URL", url)
        .env("OPKERNEL_TOKEN", token)
        .env("OPKERNEL_CA", ca)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = |v: Value| writeln!(stdin, "{v}").unwrap();
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "tls-test", "version": "1"}}}),
    );
    let init: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert!(init["result"]["serverInfo"].is_object(), "{init}");
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "run_command", "arguments": {"command": ["echo", "over-tls"]}}}),
    );
    let answer = loop {
        let v: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        if v["id"] == 2 {
            break v;
        }
    };
    // closing its stdin ends the server
    drop(stdin);
    let _ = child.wait();
    answer["result"].to_string()
}

#[tokio::test]
async fn the_api_over_tls_serves_trusting_clients_and_reloads_on_sighup() {
    let dir = pki("tls-api");
    let sans = ["DNS:localhost", "IP:127.0.0.1"];
    let (cert, key) = certs::server(&dir, "ca", "api", &sans).unwrap();
    let ca = dir.join("ca.pem");
    opkernel::base::tls::trust(&ca).unwrap();
    let env = [
        ("OPKERNEL_TLS_CERT", cert.to_str().unwrap()),
        ("OPKERNEL_TLS_KEY", key.to_str().unwrap()),
    ];
    let mut k = KernelProcess::start(&kernel_binary().unwrap(), "tls", &env)
        .await
        .unwrap();
    let base = k.client.base().to_owned();
    assert!(base.starts_with("https://"), "{base}");
    let addr = base.trim_start_matches("https://").to_owned();

    // a client trusting the CA runs a command
    let run = unique_run("tls");
    let created = k
        .client
        .post("/v1/runs", &json!({"run_id": run}))
        .await
        .unwrap();
    let run_token = created["token"].as_str().unwrap().to_owned();
    let path = format!("/v1/runs/{run}/tools/run_command");
    let body = json!({"command": ["echo", "hello"]});
    let fg = k.client.post(&path, &body).await.unwrap();
    assert_eq!(
        (fg["exit_code"].as_i64(), fg["status"].as_str()),
        (Some(0), Some("completed")),
        "{fg}"
    );

    // one that does not trust it is refused, and plain http gets nothing
    let stranger = reqwest::Client::builder().use_rustls_tls().build().unwrap();
    let refused = stranger.get(format!("{base}/v1/health")).send().await;
    assert!(refused.is_err(), "{refused:?}");
    let plain = reqwest::Client::new()
        .get(format!("http://{addr}/v1/health"))
        .send()
        .await;
    assert!(!plain.is_ok_and(|r| r.status().is_success()));

    // the CLI with OPKERNEL_CA, and without it (a clear refusal)
    let token = k.client.token().to_owned();
    let ok = cli(
        &base,
        &token,
        Some(&ca),
        &["run", "--run", &run, "--", "echo", "cli-over-tls"],
    );
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success() && out.contains("cli-over-tls"),
        "{out} {:?}",
        ok
    );
    let no = cli(&base, &token, None, &["runs"]);
    let err = String::from_utf8_lossy(&no.stderr).to_lowercase();
    assert!(!no.status.success() && err.contains("certificate"), "{err}");

    // opkernel mcp over https
    let text = tokio::task::spawn_blocking({
        let (base, ca, run) = (base.clone(), ca.clone(), run.clone());
        move || mcp_echo(&base, &run_token, &ca, &run)
    })
    .await
    .unwrap();
    assert!(text.contains("over-tls"), "{text}");

    // SIGHUP with a new certificate: new connections see it, an op started
    // before goes on and its result arrives
    let op = k
        .start_bg(&run, &["sh", "-c", "sleep 2; echo after-reload"], 60)
        .await
        .unwrap();
    assert_eq!(served_fingerprint(&addr), fingerprint(&cert));
    let (next, next_key) = certs::server(&dir, "ca", "api2", &sans).unwrap();
    std::fs::copy(&next, &cert).unwrap();
    std::fs::copy(&next_key, &key).unwrap();
    hangup(&k);
    wait_until("the new certificate served", || {
        served_fingerprint(&addr) == fingerprint(&next)
    })
    .await;
    let done = k.wait_terminal(&op, Duration::from_secs(60)).await.unwrap();
    assert_eq!(done["exit_code"], 0, "{done}");
    // a certificate that does not load leaves the last good one in force
    std::fs::write(&cert, "not a certificate").unwrap();
    hangup(&k);
    wait_until("the refusal logged", || {
        k.log().contains("the old one stays")
    })
    .await;
    assert_eq!(served_fingerprint(&addr), fingerprint(&next));
    assert_eq!(k.client.get("/v1/health").await.unwrap()["ok"], true);
    k.remove_containers();
    k.sigkill();
}

fn hangup(k: &KernelProcess) {
    let pid = k.pid().unwrap();
    certs::run(Command::new("kill").args(["-HUP", &pid.to_string()])).unwrap();
}

async fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An https receiver serving `tls`; every post's JSON body is kept.
async fn receiver(tls: Arc<ServerTls>, inbox: Arc<Mutex<Vec<Value>>>) -> String {
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let inbox = inbox.clone();
            async move {
                let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                inbox.lock().unwrap().push(v);
                axum::http::StatusCode::OK
            }
        }),
    );
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = tcp.local_addr().unwrap().port();
    let listener = opkernel::app::tls::TlsListener::new(tcp, tls).unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("https://localhost:{port}/hook")
}

#[tokio::test]
async fn webhook_posts_reach_an_https_receiver_and_a_wrong_certificate_is_retried() {
    let dir = pki("tls-hook");
    let (good, good_key) = certs::server(&dir, "ca", "hook", &["DNS:localhost"]).unwrap();
    let (bad, bad_key) = certs::server(&dir, "other", "stranger", &["DNS:localhost"]).unwrap();
    // the receiver starts with a certificate from a CA the kernel does
    // not trust
    let served = (dir.join("served.pem"), dir.join("served.key"));
    std::fs::copy(&bad, &served.0).unwrap();
    std::fs::copy(&bad_key, &served.1).unwrap();
    let tls = Arc::new(ServerTls::load(&served.0, &served.1).unwrap());
    let inbox = Arc::new(Mutex::new(Vec::new()));
    let url = receiver(tls.clone(), inbox.clone()).await;
    let ca = dir.join("ca.pem");
    let env = [
        ("OPKERNEL_WEBHOOK_URL", url.as_str()),
        ("OPKERNEL_WEBHOOK_SECRET", "a-webhook-secret-for-tests"),
        ("OPKERNEL_WEBHOOK_CA", ca.to_str().unwrap()),
    ];
    let k = KernelProcess::start(&kernel_binary().unwrap(), "tlshook", &env)
        .await
        .unwrap();
    // a SIGHUP to a kernel without TLS is logged, never a stop
    hangup(&k);
    wait_until("the SIGHUP logged", || {
        k.log().contains("no TLS certificate to read again")
    })
    .await;
    let run = unique_run("tlshook");
    let op = k.start_bg(&run, &["true"], 60).await.unwrap();
    k.wait_terminal(&op, Duration::from_secs(60)).await.unwrap();
    // refused (the chain does not verify) and tried again, nothing lost
    wait_until("a refused post tried again", || {
        k.log().matches("webhook post not taken").count() >= 2
    })
    .await;
    assert!(k.log().contains("UnknownIssuer"), "{}", k.log());
    assert!(inbox.lock().unwrap().is_empty());
    let metrics = String::from_utf8(k.client.get_bytes("/metrics").await.unwrap()).unwrap();
    assert!(
        !metrics.contains("opkernel_webhook_posts_pending 0"),
        "{metrics}"
    );
    // the receiver presents the right certificate: the post arrives
    std::fs::copy(&good, &served.0).unwrap();
    std::fs::copy(&good_key, &served.1).unwrap();
    tls.reload().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !inbox
        .lock()
        .unwrap()
        .iter()
        .any(|v| v["run_id"] == run.as_str() && v["type"] == "tool.completed")
    {
        assert!(
            Instant::now() < deadline,
            "no post after the fix: {:?}",
            inbox.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    k.remove_containers();
}

/// The test server's URL with `host`, in `mode`, checked against `root`.
fn store_url(db: &str, host: &str, mode: &str, root: &Path) -> String {
    format!(
        "{}?sslmode={mode}&sslrootcert={}",
        db.replace("127.0.0.1", host),
        root.display()
    )
}

#[tokio::test]
async fn the_store_over_tls_checks_the_chain_and_the_host_name() {
    let server = std::env::var("OPKERNEL_TEST_PG")
        .expect("OPKERNEL_TEST_PG: scripts/test.sh starts scripts/pg.sh (TLS on) and sets it");
    let pg_sh = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/pg.sh");
    let ca = PathBuf::from(certs::run(Command::new(pg_sh).arg("ca")).unwrap());
    let other = pki("tls-pg").join("other.pem");
    let db = opkernel::store::db::pgpool::create_test_database(&server)
        .await
        .unwrap();
    let bin = kernel_binary().unwrap();
    // verify-full: the certificate names localhost
    let url = store_url(&db, "localhost", "verify-full", &ca);
    let k = KernelProcess::start(&bin, "tlspg", &[("OPKERNEL_STORE", &url)])
        .await
        .unwrap();
    let run = unique_run("tlspg");
    let op = k
        .start_bg(&run, &["echo", "stored-over-tls"], 60)
        .await
        .unwrap();
    let done = k.wait_terminal(&op, Duration::from_secs(60)).await.unwrap();
    assert_eq!(done["exit_code"], 0, "{done}");
    // the server sees the kernel's sessions encrypted
    let name = db.rsplit('/').next().unwrap().to_owned();
    let (client, conn) = deadpool_postgres::tokio_postgres::connect(
        &server,
        deadpool_postgres::tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_ssl s \
             JOIN pg_stat_activity a USING (pid) WHERE a.datname = $1",
            &[&name],
        )
        .await
        .unwrap();
    let (encrypted, all): (i64, i64) = (row.get(0), row.get(1));
    assert!(
        encrypted > 0 && encrypted == all,
        "{encrypted} of {all} sessions encrypted"
    );
    k.remove_containers();
    drop(k);
    // the same in verify-full by address: the certificate does not name
    // it, and the start is refused with the reason
    for (host, mode, root, why) in [
        ("127.0.0.1", "verify-full", &ca, "not valid for name"),
        ("localhost", "verify-ca", &other, "UnknownIssuer"),
    ] {
        let url = store_url(&db, host, mode, root);
        let refused = KernelProcess::start(&bin, "tlspg", &[("OPKERNEL_STORE", &url)]).await;
        let e = format!("{:#}", refused.err().expect("a refused certificate"));
        assert!(e.contains(why), "{host} {mode}: {e}");
    }
    // a Unix socket has no host name to check (and is never encrypted)
    let sock = ca.parent().unwrap().parent().unwrap().join("sock");
    let port = server
        .rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let sock = sock.display().to_string().replace('/', "%2F");
    for query in ["", "?sslmode=disable"] {
        let unix = format!("postgres://opkernel@{sock}:{port}/opkernel{query}");
        opkernel::store::db::pgpool::create_test_database(&unix)
            .await
            .unwrap_or_else(|e| panic!("{unix}: {e}"));
    }
    // verify-ca checks the chain only: the address is fine
    let url = store_url(&db, "127.0.0.1", "verify-ca", &ca);
    let k = KernelProcess::start(&bin, "tlspg", &[("OPKERNEL_STORE", &url)])
        .await
        .unwrap();
    assert_eq!(k.client.get("/v1/health").await.unwrap()["ok"], true);
}
