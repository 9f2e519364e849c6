#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Egress allow-lists (SPEC §27) against the real engine, never leaving
//! the machine: an outside HTTP and HTTPS server of the test's own on a
//! network of its own, named through `OPKERNEL_EGRESS_HOSTS`. An allowed
//! name is reached by `curl` both ways; a denied one is refused with its
//! event; a direct connection, a UDP packet, a DNS query and the host's
//! other ports reach nothing; a child narrows; a live run narrows and the
//! operator widens; the policy holds across a kernel SIGKILL.

use std::time::Duration;

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::outside::Outside;
use opkernel_tests::{unique_run, wait_for};
use reqwest::Method;
use serde_json::{json, Value};

const DEBIAN: &str = "opkernel-sandbox:debian";

async fn kernel(outside: &Outside) -> KernelProcess {
    let hosts = outside.hosts();
    let env = [
        ("OPKERNEL_IMAGE", DEBIAN),
        ("OPKERNEL_EGRESS_HOSTS", hosts.as_str()),
    ];
    KernelProcess::start(&kernel_binary().unwrap(), "egress", &env)
        .await
        .unwrap()
}

async fn call(
    k: &KernelProcess,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Value,
) -> (u16, Value) {
    let url = format!("{}{path}", k.client.base());
    let answer = reqwest::Client::new()
        .request(method, url)
        .bearer_auth(token.unwrap_or(k.client.token()))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

/// A foreground shell script in `run`: its exit code and output.
async fn sh(k: &KernelProcess, run: &str, token: Option<&str>, script: &str) -> (i64, String) {
    let body = json!({"command": ["sh", "-c", script], "timeout_sec": 60});
    let path = format!("/v1/runs/{run}/tools/run_command");
    let (status, v) = call(k, Method::POST, &path, token, body).await;
    assert_eq!(status, 200, "{v}");
    let out = v["output"].as_str().unwrap_or_default().to_owned();
    (v["exit_code"].as_i64().unwrap_or(-1), out)
}

/// `curl` of `url` through the proxy: its HTTP code (`000`: none).
async fn curl_code(k: &KernelProcess, run: &str, token: Option<&str>, url: &str) -> String {
    let ca = if url.starts_with("https") {
        "--cacert /scratch/ca.pem"
    } else {
        ""
    };
    let script = format!("curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 {ca} {url}");
    sh(k, run, token, &script).await.1
}

async fn events_of(k: &KernelProcess, run: &str, kind: &str) -> Vec<Value> {
    let page = k
        .client
        .get(&format!("/v1/runs/{run}/events?limit=500"))
        .await
        .unwrap();
    let all = page["events"].as_array().cloned().unwrap_or_default();
    all.into_iter().filter(|e| e["kind"] == kind).collect()
}

/// A top-level run with `allow`, the test CA in its scratch dir; its token.
async fn listed_run(k: &KernelProcess, outside: &Outside, run: &str, allow: &[&str]) -> String {
    let body = json!({"run_id": run, "envelope": {"network": {"allow": allow}}});
    let (status, made) = call(k, Method::POST, "/v1/runs", None, body).await;
    assert_eq!(status, 200, "{made}");
    let path = format!("/v1/runs/{run}/files/scratch/ca.pem");
    let body = reqwest::Body::from(outside.ca_pem.clone());
    k.client.raw(Method::PUT, &path, Some(body)).await.unwrap();
    made["token"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn an_allow_list_reaches_its_hosts_through_the_proxy_and_nothing_else() {
    let outside = Outside::start(DEBIAN).unwrap();
    let mut k = kernel(&outside).await;
    let run = unique_run("egress");
    let token = listed_run(&k, &outside, &run, &["outside.test", "localhost"]).await;
    let (code, out) = sh(
        &k,
        &run,
        None,
        "curl -sS --max-time 10 http://outside.test:8080/x",
    )
    .await;
    assert_eq!(
        (code, out.as_str()),
        (0, "outside:outside.test:8080/x\n"),
        "plain HTTP"
    );
    let https = "curl -sS --max-time 10 --cacert /scratch/ca.pem https://outside.test:8443/y";
    let (code, out) = sh(&k, &run, None, https).await;
    assert_eq!(
        (code, out.as_str()),
        (0, "outside:outside.test:8443/y\n"),
        "HTTPS by CONNECT"
    );
    // every command has the proxy in its environment
    let (_, env) = sh(&k, &run, None, "env | grep -i _proxy= | sort | cut -d= -f1").await;
    assert_eq!(
        env,
        "HTTPS_PROXY\nHTTP_PROXY\nNO_PROXY\nhttp_proxy\nhttps_proxy\nno_proxy\n"
    );
    denied_names_are_refused_with_their_event(&k, &run).await;
    nothing_else_leaves(&k, &outside, &run).await;
    narrowing(&k, &run, &token).await;
    connections_are_bounded(&k, &run).await;
    // the policy survives a SIGKILL: the same proxy address, the same list
    k.restart().await.unwrap();
    assert_eq!(
        curl_code(&k, &run, None, "https://outside.test:8443/").await,
        "200"
    );
    assert_eq!(
        curl_code(&k, &run, None, "http://outside.test:8080/").await,
        "403"
    );
    let used = wait_for("net usage recorded", Duration::from_secs(20), || async {
        let v = k.client.get(&format!("/v1/runs/{run}")).await.ok()?;
        (v["used"]["net_connections"].as_u64()? >= 2).then_some(v)
    })
    .await;
    assert!(used["used"]["net_bytes_in"].as_u64().unwrap() > 0, "{used}");
}

async fn denied_names_are_refused_with_their_event(k: &KernelProcess, run: &str) {
    let (_, said) = sh(
        k,
        run,
        None,
        "curl -sS --max-time 10 http://other.test:8080/",
    )
    .await;
    assert!(
        said.contains("opkernel egress policy of run") && said.contains("other.test:8080"),
        "{said}"
    );
    assert_eq!(
        curl_code(k, run, None, "http://other.test:8080/").await,
        "403"
    );
    let (code, said) = sh(
        k,
        run,
        None,
        "curl -sS --max-time 10 https://other.test:8443/ 2>&1",
    )
    .await;
    assert!(code != 0 && said.contains("403"), "CONNECT refused: {said}");
    let denied = events_of(k, run, "net.denied").await;
    let hosts: Vec<(Value, Value)> = denied
        .iter()
        .map(|e| (e["data"]["host"].clone(), e["data"]["port"].clone()))
        .collect();
    // one event per host and minute, however many refusals
    assert_eq!(
        hosts.iter().filter(|h| h.0 == "other.test").count(),
        1,
        "{denied:?}"
    );
    assert_eq!(hosts[0], (json!("other.test"), json!(8080)), "{denied:?}");
    let metrics = String::from_utf8(k.client.get_bytes("/metrics").await.unwrap()).unwrap();
    assert!(
        metrics.contains("opkernel_egress_connections_total{outcome=\"denied\"} 3"),
        "{metrics}"
    );
    // a listed name that resolves to the host itself is refused too
    let (code, said) = sh(
        k,
        run,
        None,
        "curl -sS --noproxy '' --max-time 10 http://localhost:8080/",
    )
    .await;
    assert!(
        code == 0 && said.contains("resolves to 127.0.0.1, not a public address"),
        "{said}"
    );
}

/// Direct TCP to the outside's address, UDP to it, DNS, and a port of the
/// host's address on the egress network other than the proxy's: nothing.
async fn nothing_else_leaves(k: &KernelProcess, outside: &Outside, run: &str) {
    let direct = format!(
        "curl -sS --noproxy '*' --max-time 3 http://{}:8080/ 2>&1",
        outside.ip
    );
    let (code, said) = sh(k, run, None, &direct).await;
    assert_ne!(code, 0, "a direct connection left: {said}");
    let udp = format!(
        "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('{}', 9999))\" 2>&1; true",
        outside.ip
    );
    sh(k, run, None, &udp).await;
    let dns = "python3 -c \"import socket; socket.getaddrinfo('deb.debian.org', 80)\" 2>&1";
    let (code, said) = sh(k, run, None, dns).await;
    assert_ne!(code, 0, "a DNS name resolved in the container: {said}");
    // a listener of the test's own on every host address
    let host = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let port = host.local_addr().unwrap().port();
    let proxy = sh(k, run, None, "echo $HTTP_PROXY").await.1;
    let gateway = proxy
        .trim()
        .trim_start_matches("http://")
        .split(':')
        .next()
        .unwrap()
        .to_owned();
    let probe = format!("curl -sS --noproxy '*' --max-time 3 http://{gateway}:{port}/ 2>&1");
    let (code, said) = sh(k, run, None, &probe).await;
    assert!(
        code != 0 && host.accept().is_err(),
        "the host's port {port} was reached: {said}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        outside.udp_senders(),
        Vec::<String>::new(),
        "a UDP packet left"
    );
}

/// One container holds at most 256 connections to the proxy at once: the
/// rest are closed at once; once it lets go, it connects again.
async fn connections_are_bounded(k: &KernelProcess, run: &str) {
    let script = r#"python3 -c '
import os, socket, time
host, port = os.environ["HTTP_PROXY"][7:].split(":")
socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(300)]
time.sleep(1)
closed = 0
for s in socks:
    s.settimeout(0.2)
    try:
        closed += s.recv(1) == b""
    except socket.timeout:
        pass
    except OSError:
        closed += 1
print(closed)
'"#;
    let (code, said) = sh(k, run, None, script).await;
    let closed: usize = said.trim().parse().unwrap_or(0);
    assert!(code == 0 && (44..=50).contains(&closed), "{said}");
    let again = wait_for(
        "the proxy answers again",
        Duration::from_secs(20),
        || async {
            (curl_code(k, run, None, "https://outside.test:8443/").await == "200").then_some(())
        },
    )
    .await;
    let _: () = again;
}

/// A child narrows at creation; the run narrows itself (its child with
/// it), never widens; the operator widens; the next connection follows.
async fn narrowing(k: &KernelProcess, run: &str, token: &str) {
    let wider =
        json!({"run_id": "w", "envelope": {"network": {"allow": ["outside.test", "other.test"]}}});
    let (status, v) = call(k, Method::POST, "/v1/runs", Some(token), wider).await;
    assert_eq!(
        (status, v["error"]["code"].clone()),
        (403, json!("envelope_exceeded")),
        "{v}"
    );
    let bad = json!({"run_id": "b", "envelope": {"network": {"allow": ["ok.test", "bad host"]}}});
    let (status, v) = call(k, Method::POST, "/v1/runs", Some(token), bad).await;
    assert!(
        status == 400 && v["error"]["message"].as_str().unwrap().contains("bad host"),
        "{v}"
    );
    let narrow = json!({"run_id": "c", "envelope": {"network": {"allow": ["outside.test:8080"]}}});
    let (status, child) = call(k, Method::POST, "/v1/runs", Some(token), narrow).await;
    assert_eq!(status, 200, "{child}");
    let (child_run, child_token) = (
        format!("{run}.c"),
        child["token"].as_str().unwrap().to_owned(),
    );
    assert_eq!(
        curl_code(
            k,
            &child_run,
            Some(&child_token),
            "http://outside.test:8080/"
        )
        .await,
        "200"
    );
    assert_eq!(
        curl_code(
            k,
            &child_run,
            Some(&child_token),
            "http://outside.test:8443/"
        )
        .await,
        "403"
    );
    // the run narrows itself to HTTPS: its next plain request, and its child's, are refused
    let path = format!("/v1/runs/{run}/network");
    let (status, v) = call(
        k,
        Method::POST,
        &path,
        Some(token),
        json!({"allow": ["outside.test:8443"]}),
    )
    .await;
    assert_eq!(
        (status, v["narrowed"].clone()),
        (200, json!([child_run])),
        "{v}"
    );
    assert_eq!(
        curl_code(k, run, None, "http://outside.test:8080/").await,
        "403"
    );
    assert_eq!(
        curl_code(k, run, None, "https://outside.test:8443/").await,
        "200"
    );
    assert_eq!(
        curl_code(
            k,
            &child_run,
            Some(&child_token),
            "http://outside.test:8080/"
        )
        .await,
        "403"
    );
    let (status, v) = call(
        k,
        Method::POST,
        &path,
        Some(token),
        json!({"allow": ["outside.test"]}),
    )
    .await;
    assert_eq!(
        (status, v["error"]["code"].clone()),
        (403, json!("envelope_exceeded")),
        "{v}"
    );
    // the operator may widen; its change is in the run's trace
    let (status, v) = call(
        k,
        Method::POST,
        &path,
        None,
        json!({"allow": ["outside.test"]}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        curl_code(k, run, None, "http://outside.test:8080/").await,
        "200"
    );
    let changes = events_of(k, run, "net.policy").await;
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert_eq!(changes[1]["data"]["by"], "operator");
    // the operator widens a child only within its parent's list
    let child_path = format!("/v1/runs/{child_run}/network");
    let (status, v) = call(
        k,
        Method::POST,
        &child_path,
        None,
        json!({"allow": ["other.test"]}),
    )
    .await;
    assert_eq!(
        (status, v["error"]["code"].clone()),
        (403, json!("envelope_exceeded")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("its parent"),
        "{v}"
    );
    let (status, _) = call(
        k,
        Method::POST,
        &child_path,
        None,
        json!({"allow": ["outside.test"]}),
    )
    .await;
    assert_eq!(status, 200);
    // back to HTTPS only, for the restart's check: the child's any-port
    // entry is cut to the port, not dropped
    let (status, v) = call(
        k,
        Method::POST,
        &path,
        None,
        json!({"allow": ["outside.test:8443"]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v["narrowed"], json!([child_run]), "{v}");
    let child = k
        .client
        .get(&format!("/v1/runs/{child_run}"))
        .await
        .unwrap();
    assert_eq!(
        child["envelope"]["network"],
        json!({"allow": ["outside.test:8443"]}),
        "{child}"
    );
}

#[tokio::test]
async fn only_an_allow_list_changes_and_bad_entries_name_themselves() {
    let outside = Outside::start(DEBIAN).unwrap();
    let k = kernel(&outside).await;
    let run = unique_run("closed");
    let (status, _) = call(&k, Method::POST, "/v1/runs", None, json!({"run_id": run})).await;
    assert_eq!(status, 200);
    let path = format!("/v1/runs/{run}/network");
    let (status, v) = call(
        &k,
        Method::POST,
        &path,
        None,
        json!({"allow": ["outside.test"]}),
    )
    .await;
    assert_eq!(
        (status, v["error"]["code"].clone()),
        (409, json!("not_allow_list")),
        "{v}"
    );
    let bad = json!({"run_id": unique_run("bad"), "envelope": {"network": {"allow": ["*.org"]}}});
    let (status, v) = call(&k, Method::POST, "/v1/runs", None, bad).await;
    assert!(
        status == 400 && v["error"]["message"].as_str().unwrap().contains("*.org"),
        "{v}"
    );
    // a run without an allow list has no proxy and no network at all
    let (code, _) = sh(
        &k,
        &run,
        None,
        "curl -sS --max-time 3 http://outside.test:8080/",
    )
    .await;
    assert_ne!(code, 0);
    the_proxy_comes_back_after_its_network_was_removed(&k, &outside).await;
}

/// An operator removes the egress network (its containers first): the
/// kernel notices within its 10 s check, and the next allow-list run gets
/// a new network and proxy.
async fn the_proxy_comes_back_after_its_network_was_removed(k: &KernelProcess, outside: &Outside) {
    let first = unique_run("gone");
    listed_run(k, outside, &first, &["outside.test"]).await;
    let url = "http://outside.test:8080/";
    assert_eq!(curl_code(k, &first, None, url).await, "200");
    k.remove_containers();
    let name = opkernel::runtime::egress::network_name(&k.home);
    let removed = std::process::Command::new("docker")
        .args(["network", "rm", &name])
        .output()
        .unwrap();
    assert!(removed.status.success(), "{removed:?}");
    tokio::time::sleep(Duration::from_secs(12)).await;
    let second = unique_run("back");
    listed_run(k, outside, &second, &["outside.test"]).await;
    assert_eq!(curl_code(k, &second, None, url).await, "200");
}
