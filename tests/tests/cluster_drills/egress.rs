//! Egress allow lists in a cluster (SPEC §27): each node's own proxy
//! serves its own containers, with the policy read from the shared
//! control plane, so a change made through any node applies on the run's
//! node at its next connection.

use std::time::Duration;

use serde_json::json;

use opkernel_tests::cluster::{timed, Cluster};
use opkernel_tests::{unique_run, wait_for};

/// The drills' "outside": an HTTP server of the test's own on the host
/// (the nodes reach it at their network's gateway) answering every path
/// with `outside:` and the `Host` and path it was asked for.
pub async fn outside() -> u16 {
    async fn any(headers: axum::http::HeaderMap, uri: axum::http::Uri) -> String {
        let host = headers
            .get("host")
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        format!("outside:{host}{}\n", uri.path())
    }
    let app = axum::Router::new().fallback(any);
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// `OPKERNEL_EGRESS_HOSTS` for the nodes: both test names at the host.
pub fn hosts(subnet: &str) -> String {
    format!("outside.test={subnet}.1;other.test={subnet}.1")
}

/// A plain HTTP GET of `url` in `run` through `via`, sent to the proxy
/// its environment names (by bash's `/dev/tcp`: the default image's
/// static busybox `wget` cannot resolve even a proxy's address): the
/// status line and the body's last line, and the op's node.
async fn fetch(c: &Cluster, via: &str, run: &str, url: &str) -> (String, String) {
    let path = format!("/v1/runs/{run}/tools/run_command");
    let script = format!(
        r#"p=${{HTTP_PROXY#http://}}; exec 3<>"/dev/tcp/${{p%:*}}/${{p##*:}}" || exit 9
printf 'GET {url} HTTP/1.1\r\nHost: x\r\n\r\n' >&3
reply=$(timeout 10 cat <&3); printf '%s\n' "$reply" | head -n 1 | tr -d '\r'; printf '%s\n' "$reply" | tail -n 1"#
    );
    let body = json!({"command": ["bash", "-c", script], "timeout_sec": 60});
    let v = timed(c.node(via).client.post(&path, &body)).await.unwrap();
    let out = v["output"].as_str().unwrap_or_default().to_owned();
    (out, v["node"].as_str().unwrap_or_default().to_owned())
}

/// A run with an allow list, through n1: its allowed host answers through
/// its node's proxy, another is refused with its event (read through
/// another node), and a list cut through another node applies at once.
pub async fn through_its_node(c: &Cluster, port: u16) {
    let run = unique_run("eg");
    let allow = format!("outside.test:{port}");
    let body = json!({"run_id": run, "envelope": {"network": {"allow": [allow]}}});
    timed(c.node("n1").client.post("/v1/runs", &body))
        .await
        .unwrap();
    let url = format!("http://outside.test:{port}/x");
    let (said, node) = fetch(c, "n1", &run, &url).await;
    assert_eq!(
        said,
        format!("HTTP/1.1 200 OK\noutside:outside.test:{port}/x\n"),
        "on {node}"
    );
    let other = c
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .find(|n| *n != node)
        .unwrap();
    let (said, _) = fetch(c, &other, &run, &format!("http://other.test:{port}/")).await;
    assert!(said.starts_with("HTTP/1.1 403"), "{said}");
    let events = format!("/v1/runs/{run}/events?limit=500");
    wait_for(
        "net.denied through another node",
        Duration::from_secs(20),
        || async {
            let page = c.node(&other).client.get(&events).await.ok()?;
            let all = page["events"].as_array()?.clone();
            all.iter()
                .any(|e| e["kind"] == "net.denied" && e["data"]["host"] == "other.test")
                .then_some(())
        },
    )
    .await;
    // the operator empties the list through another node: refused at once
    let path = format!("/v1/runs/{run}/network");
    let cut = timed(c.node(&other).client.post(&path, &json!({"allow": []})))
        .await
        .unwrap();
    assert_eq!(cut["allow"], json!([]), "{cut}");
    let (said, again) = fetch(c, "n1", &run, &url).await;
    assert!(
        said.starts_with("HTTP/1.1 403"),
        "after the cut, on {again}: {said}"
    );
    assert_eq!(again, node, "the run stays on its node");
}
