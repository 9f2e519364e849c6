#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The trust boundary end to end: run-scoped tokens on every endpoint,
//! hardened containers as `docker inspect` shows them, the command's reach,
//! bad input answered with clear 4xx errors and no damage, hostile op files.

use std::process::Command;
use std::time::Duration;

use opkernel::drills::harness::{docker_exec, kernel_binary, KernelProcess};
use opkernel::surfaces::cli::client::Client;
use opkernel_tests::{unique_run, KernelProcessExt};
use reqwest::Method;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const T: Duration = Duration::from_secs(60);

async fn kernel(tag: &str, env: &[(&str, &str)]) -> KernelProcess {
    KernelProcess::start(&kernel_binary().unwrap(), tag, env)
        .await
        .unwrap()
}

async fn run_client(k: &KernelProcess, run: &str) -> Client {
    let v = k
        .client
        .post("/v1/runs", &json!({"run_id": run}))
        .await
        .unwrap();
    let token = v["token"].as_str().unwrap();
    assert_eq!(token.len(), 64, "256-bit token");
    Client::new(k.client.base().to_owned(), token.to_owned())
}

#[tokio::test]
async fn run_tokens_act_on_their_own_run_only() {
    // everything the kernel logs, at every level, must stay free of tokens
    let k = kernel("tokens", &[("OPKERNEL_LOG", "trace")]).await;
    let (a, b) = (unique_run("a"), unique_run("b"));
    let ca = run_client(&k, &a).await;
    let cb = run_client(&k, &b).await;
    let path = format!("/v1/runs/{b}/tools/run_command");
    let (s, body) = cb
        .request(
            Method::POST,
            &path,
            Some(&json!({"command": ["sleep", "30"], "background": true})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(s, 200, "{body}");
    let b_op = body["operation_id"].as_str().unwrap().to_owned();
    let (s, _) = ca
        .request(
            Method::POST,
            &format!("/v1/runs/{a}/tools/run_command"),
            Some(&json!({"command": ["true"], "background": true})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(s, 200, "a run token works on its own run");

    let cross: Vec<(Method, String, Option<Value>)> = vec![
        (
            Method::POST,
            format!("/v1/runs/{b}/tools/run_command"),
            Some(json!({"command": ["true"]})),
        ),
        (
            Method::POST,
            format!("/v1/runs/{b}/tools/kill_operation"),
            Some(json!({"operation_id": b_op})),
        ),
        (Method::GET, format!("/v1/runs/{b}/report"), None),
        (
            Method::POST,
            format!("/v1/runs/{b}/report/{}/ack", uuid::Uuid::new_v4()),
            None,
        ),
        (
            Method::POST,
            format!("/v1/runs/{b}/notes"),
            Some(json!({"text": "hi"})),
        ),
        (Method::POST, format!("/v1/runs/{b}/finish"), None),
        (Method::GET, format!("/v1/ops?run={b}"), None),
    ];
    for (method, path, body) in cross {
        let (s, resp) = ca
            .request(method.clone(), &path, body.as_ref(), &[])
            .await
            .unwrap();
        assert_eq!(s, 403, "{method} {path}: {resp}");
        assert_eq!(resp["error"]["code"], "forbidden");
    }
    // another run's op is not found, whether or not it exists
    for path in [
        format!("/v1/operations/{b_op}"),
        format!("/v1/operations/{b_op}/log"),
        format!("/v1/operations/{b_op}/console"),
    ] {
        let (s, resp) = ca.request(Method::GET, &path, None, &[]).await.unwrap();
        assert_eq!(s, 404, "{path}: {resp}");
        let (s2, _) = ca
            .request(
                Method::GET,
                &path.replace(&b_op, &uuid::Uuid::new_v4().to_string()),
                None,
                &[],
            )
            .await
            .unwrap();
        assert_eq!(s2, 404);
    }
    // a's token cannot kill b's op through a's own path either
    let (s, _) = ca
        .request(
            Method::POST,
            &format!("/v1/runs/{a}/tools/kill_operation"),
            Some(&json!({"operation_id": b_op})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(s, 404);
    // with a run token, POST /v1/runs makes a child of the token's run
    // (never of another run: the parent comes from the token)
    let child = format!("{a}.a-child");
    let (s, resp) = ca
        .request(
            Method::POST,
            "/v1/runs",
            Some(&json!({"run_id": child})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(s, 200, "{resp}");
    assert_eq!(resp["parent_run_id"], json!(a));
    let child_token = resp["token"].as_str().unwrap().to_owned();
    // operator-only endpoints
    for (method, path, body) in [
        (Method::GET, "/v1/containers", json!({})),
        (Method::POST, "/v1/reap?dry_run=true", json!({})),
        (
            Method::POST,
            "/v1/tools/run_command",
            json!({"command": ["true"]}),
        ),
    ] {
        let (s, _) = ca.request(method, path, Some(&body), &[]).await.unwrap();
        assert_eq!(s, 403, "{path}");
    }
    // no token, a wrong token
    for token in ["", "not-a-token", &"f".repeat(64)] {
        let c = Client::new(k.client.base().to_owned(), token.to_owned());
        let (s, resp) = c
            .request(Method::GET, &format!("/v1/operations/{b_op}"), None, &[])
            .await
            .unwrap();
        assert_eq!(s, 401, "{token}: {resp}");
    }
    let (s, _) = cb
        .request(Method::GET, &format!("/v1/operations/{b_op}"), None, &[])
        .await
        .unwrap();
    assert_eq!(s, 200);
    // the run comes from the path + token, and a run token only lists its run
    let listed = ca.get("/v1/ops").await.unwrap();
    assert!(listed["operations"]
        .as_array()
        .unwrap()
        .iter()
        .all(|o| o["run_id"] == a.as_str()));
    // every token this test sent (each was used on many requests, refused
    // ones included) is absent from the log and from the control plane's
    // files (tokens are stored hashed), read after the last request
    let log = k.log();
    assert!(log.contains("opkernel listening on"), "no log read: {log}");
    let db: Vec<u8> = ["kernel.db", "kernel.db-wal"]
        .iter()
        .flat_map(|f| std::fs::read(k.home.join(f)).unwrap_or_default())
        .collect();
    assert!(
        k.on_postgres() || !db.is_empty(),
        "no control-plane file was read"
    );
    for (whose, token) in [
        ("operator", k.client.token()),
        ("run a", ca.token()),
        ("run b", cb.token()),
        ("a's child", child_token.as_str()),
    ] {
        assert_eq!(token.len(), 64, "{whose}");
        assert!(!log.contains(token), "the {whose} token reached the log");
        assert!(
            !db.windows(token.len()).any(|w| w == token.as_bytes()),
            "the {whose} token is stored in clear"
        );
        // on PostgreSQL the same fact through the store: no row of any
        // table holds it (the files above do not exist there)
        if k.on_postgres() {
            assert_eq!(
                opkernel_tests::pg_rows_holding(&k, token),
                0,
                "the {whose} token is stored in clear"
            );
        }
    }
    // and the look finds what is stored: b's op id is in its rows
    if k.on_postgres() {
        assert!(opkernel_tests::pg_rows_holding(&k, &b_op) > 0);
    }
}

fn inspect(container: &str) -> Value {
    let out = Command::new("docker")
        .args(["inspect", container])
        .output()
        .unwrap();
    serde_json::from_slice::<Value>(&out.stdout).unwrap()[0].clone()
}

#[tokio::test]
async fn run_containers_are_hardened_and_the_command_is_unprivileged() {
    let k = kernel("harden", &[]).await;
    let run = unique_run("harden");
    let op = k.start_bg(&run, &["sleep", "30"], 60).await.unwrap();
    let container = k.container_of(&op).await.unwrap();
    let c = inspect(&container);
    let host = &c["HostConfig"];
    assert_eq!(host["CapDrop"], json!(["ALL"]));
    let mut added: Vec<String> = host["CapAdd"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().trim_start_matches("CAP_").to_owned())
        .collect();
    added.sort();
    assert_eq!(
        added,
        ["DAC_READ_SEARCH", "KILL", "SETGID", "SETUID", "SYS_PTRACE"]
    );
    assert_eq!(host["SecurityOpt"], json!(["no-new-privileges"]));
    assert_eq!(host["ReadonlyRootfs"], true);
    assert_eq!(host["Privileged"], false);
    assert_eq!(host["NetworkMode"], "none");
    assert_eq!(host["PidsLimit"], 1024);
    assert_eq!(host["Memory"], 2i64 << 30);
    assert_eq!(host["NanoCpus"], 2_000_000_000i64);
    assert_eq!(host["Init"], true);
    assert!(host["Tmpfs"]["/tmp"]
        .as_str()
        .unwrap()
        .contains("mode=1777"));
    let binds: Vec<&str> = host["Binds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_str().unwrap())
        .collect();
    let scratch = k.home.join("scratch").display().to_string();
    let bin = k.home.join("bin").display().to_string();
    assert_eq!(binds.len(), 3);
    assert!(
        binds[..2].iter().all(|b| b.starts_with(&scratch)),
        "{binds:?}"
    );
    // the shim: the kernel's own copy, read-only
    assert!(
        binds[2].starts_with(&bin) && binds[2].ends_with(":/.opkernel/shim:ro"),
        "{binds:?}"
    );
    assert!(!c.to_string().contains("docker.sock"));

    // what the command itself can and cannot do
    let probe = "id -u; touch /scratch/ok && echo scratch-rw; touch /tmp/ok && echo tmp-rw; \
                 touch /etc/x 2>/dev/null || echo root-ro; touch /scratch/.ops/x 2>/dev/null || echo ops-denied; \
                 mv /scratch/.ops /scratch/o 2>/dev/null || echo ops-pinned; kill -0 1 2>/dev/null || echo no-signal-pid1; \
                 grep -c . /proc/net/dev; grep CapEff /proc/self/status";
    let out = k
        .client
        .post(
            &format!("/v1/runs/{run}/tools/run_command"),
            &json!({"command": ["sh", "-c", probe]}),
        )
        .await
        .unwrap();
    let text = out["output"].as_str().unwrap();
    for want in [
        "1000\n",
        "scratch-rw",
        "tmp-rw",
        "root-ro",
        "ops-denied",
        "ops-pinned",
        "no-signal-pid1",
        "CapEff:\t0000000000000000",
    ] {
        assert!(text.contains(want), "missing {want:?} in {text}");
    }
    // only the loopback interface: 2 header lines + lo
    assert!(text.contains("\n3\n"), "network interfaces: {text}");
}

#[tokio::test]
async fn bad_input_gets_clear_errors_and_loses_nothing() {
    let k = kernel("badinput", &[("OPKERNEL_MAX_OPS_PER_RUN", "2")]).await;
    let run = unique_run("bad");
    let good = k
        .start_bg(&run, &["sh", "-c", "echo kept"], 60)
        .await
        .unwrap();
    k.wait_terminal(&good, T).await.unwrap();
    let path = format!("/v1/runs/{run}/tools/run_command");
    let http = reqwest::Client::new();
    let token = std::fs::read_to_string(k.home.join("operator.token")).unwrap();
    let raw = |body: Vec<u8>| {
        http.post(format!("{}{path}", k.client.base()))
            .bearer_auth(token.trim())
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{not json".to_vec(), 400, "invalid JSON"),
        (
            br#"{"command": ["true"], "shell": true}"#.to_vec(),
            400,
            "unknown field",
        ),
        (br#"{"command": "true"}"#.to_vec(), 400, "invalid type"),
        (br#"{"command": []}"#.to_vec(), 400, "non-empty"),
        (br#"{"command": ["a\u0000b"]}"#.to_vec(), 400, "NUL"),
        (
            br#"{"command": ["true"], "timeout_sec": -5}"#.to_vec(),
            400,
            "invalid",
        ),
        (
            json!({"command": ["x".repeat(300_000)]})
                .to_string()
                .into_bytes(),
            400,
            "limit is",
        ),
        (vec![b' '; 2 << 20], 413, "limit"),
    ];
    for (body, status, needle) in cases {
        let resp = raw(body).await.unwrap();
        assert_eq!(resp.status().as_u16(), status);
        let v: Value = resp.json().await.unwrap();
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{msg} lacks {needle}");
    }
    for (p, status) in [
        ("/v1/runs/a..b/report".to_owned(), 400),
        (format!("/v1/runs/{}/report", "x".repeat(65)), 400),
        ("/v1/runs/a%2Fb/report".to_owned(), 400),
        ("/v1/operations/not-a-uuid".to_owned(), 400),
        ("/v1/operations/../../etc/passwd".to_owned(), 404),
        (format!("/v1/runs/{run}/report?wait=999999"), 400),
        (format!("/v1/runs/{run}/report?wait=abc"), 400),
    ] {
        let (s, v) = k.client.request(Method::GET, &p, None, &[]).await.unwrap();
        assert_eq!(s, status, "{p}: {v}");
        assert!(v["error"]["message"].is_string(), "{p}: {v}");
    }
    // over the per-run limit: 429 naming the limit
    k.start_bg(&run, &["sleep", "30"], 60).await.unwrap();
    k.start_bg(&run, &["sleep", "30"], 60).await.unwrap();
    let (s, v) = k
        .client
        .request(
            Method::POST,
            &path,
            Some(&json!({"command": ["true"], "background": true})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(s, 429, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("limit 2"));
    // a flood of bad requests leaves everything intact
    for i in 0..300 {
        let body = match i % 3 {
            0 => b"{".to_vec(),
            1 => br#"{"command": []}"#.to_vec(),
            _ => vec![0xff, 0xfe, 0x00],
        };
        assert_eq!(raw(body).await.unwrap().status().as_u16(), 400);
    }
    let s = k.state(&good).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["output_tail"].as_str()),
        (Some("completed"), Some("kept\n"))
    );
    let report = k
        .client
        .get(&format!("/v1/runs/{run}/report"))
        .await
        .unwrap();
    assert_eq!(report["resolved"][0]["operation_id"], good.as_str());
    if k.on_postgres() {
        // every table of the control plane reads through
        assert!(opkernel_tests::pg_rows(&k) > 0);
    } else {
        // opened read-only: a missing file is an error, never a new empty
        // database that passes the check
        let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
        let conn = rusqlite::Connection::open_with_flags(k.home.join("kernel.db"), flags).unwrap();
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
    }
}

#[tokio::test]
async fn hostile_op_files_never_make_the_kernel_misreport() {
    // commands run as root here, so .ops is within their reach
    let k = kernel("hostile", &[("OPKERNEL_RUN_AS", "root")]).await;
    let run = unique_run("hostile");
    let victim = k
        .start_bg(&run, &["sh", "-c", "sleep 3; echo real; exit 4"], 60)
        .await
        .unwrap();
    let container = k.container_of(&victim).await.unwrap();
    // another op of the run forges the victim's code and garbles its pid file
    // (a symlinked log is the next case's)
    let forge = format!(
        "printf '0\\n' > /scratch/.ops/{victim}.code.tmp && mv /scratch/.ops/{victim}.code.tmp /scratch/.ops/{victim}.code; \
         head -c 100000 /dev/zero | tr '\\0' 1 > /scratch/.ops/{victim}.pid"
    );
    let f = k.start_bg(&run, &["sh", "-c", &forge], 60).await.unwrap();
    k.wait_terminal(&f, T).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let s = k.state(&victim).await.unwrap();
    assert_eq!(
        s["status"], "running",
        "a forged code next to a live wrapper is ignored: {s}"
    );
    let s = k.wait_terminal(&victim, T).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["exit_code"].as_i64()),
        (Some("completed"), Some(4)),
        "{s}"
    );
    assert_eq!(s["output_tail"], "real\n");
    // the op's real log path is swapped for a symlink to a world-readable
    // host file (the kernel reads the log path as root): never followed,
    // not for the op's view, its log, its console or its digest. The
    // command waits for the swap, so the kernel's every read comes after it.
    let target = "/etc/passwd";
    let host_text = std::fs::read_to_string(target).unwrap();
    assert!(host_text.contains("root:"), "{target} is not what we think");
    let sneaky = k
        .start_bg(
            &run,
            &[
                "sh",
                "-c",
                "until [ -L /scratch/.ops/$__OPKERNEL_OP.log ]; do sleep 0.05; done; echo x",
            ],
            60,
        )
        .await
        .unwrap();
    k.container_of(&sneaky).await.unwrap();
    docker_exec(&container, &format!("ln -sf {target} /scratch/.ops/{sneaky}.log.tmp && mv -f /scratch/.ops/{sneaky}.log.tmp /scratch/.ops/{sneaky}.log")).unwrap();
    let log_path = k
        .home
        .join("scratch")
        .join(sandbox::profile::scratch_key(&run))
        .join(format!(".ops/{sneaky}.log"));
    assert_eq!(
        std::fs::read_link(&log_path).unwrap(),
        std::path::Path::new(target),
        "the swap did not take"
    );
    let s = k.wait_terminal(&sneaky, T).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["exit_code"].as_i64()),
        (Some("completed"), Some(0)),
        "{s}"
    );
    let bytes = k
        .client
        .get_bytes(&format!("/v1/operations/{sneaky}/log"))
        .await
        .unwrap();
    assert!(
        bytes.is_empty(),
        "symlinked log followed: {}",
        String::from_utf8_lossy(&bytes)
    );
    let mut console = String::new();
    tokio::time::timeout(
        T,
        k.client.sse(
            &format!("/v1/operations/{sneaky}/console"),
            |event, data| {
                console.push_str(&format!("{event}: {data}\n"));
                event != "done"
            },
        ),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(
        !console.contains("root:"),
        "symlinked log streamed: {console}"
    );
    assert!(s["output_tail"].is_null(), "{s}");
    assert!(!s.to_string().contains("root:"), "{s}");
    assert_ne!(
        s["log_sha256"].as_str(),
        Some(hex::encode(Sha256::digest(host_text.as_bytes())).as_str()),
        "the digest is the host file's: {s}"
    );
    assert!(s["output_tail"].is_null());
}

#[tokio::test]
async fn another_kernel_homes_containers_are_never_used_or_reaped() {
    let a = kernel("home-a", &[]).await;
    let b = kernel("home-b", &[("OPKERNEL_REAP_TTL", "0s")]).await;
    let run = unique_run("shared");
    let op = a.start_bg(&run, &["true"], 60).await.unwrap();
    let container = a.wait_terminal(&op, T).await.unwrap()["container_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // the same run id on another home: a clear refusal, nothing runs in a's container
    let other = b
        .start_bg(&run, &["sh", "-c", "echo intruder > /scratch/x"], 60)
        .await
        .unwrap();
    let s = b.wait_terminal(&other, T).await.unwrap();
    assert_eq!(s["status"], "failed", "{s}");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("another kernel home"),
        "{s}"
    );
    assert!(!a
        .home
        .join("scratch")
        .join(sandbox::profile::scratch_key(&run))
        .join("x")
        .exists());
    // b's reaper keeps a's container, even with a zero ttl, and says why
    let reaped = b
        .client
        .post("/v1/reap?dry_run=false", &json!({}))
        .await
        .unwrap();
    let mine = reaped["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["container_id"] == container.as_str())
        .unwrap();
    assert_eq!(mine["action"], "keep", "{mine}");
    assert!(
        mine["reason"]
            .as_str()
            .unwrap()
            .contains("another kernel home"),
        "{mine}"
    );
    assert!(Command::new("docker")
        .args(["inspect", &container])
        .output()
        .unwrap()
        .status
        .success());
}
