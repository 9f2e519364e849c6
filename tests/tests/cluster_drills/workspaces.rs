//! A run's workspace through any node (SPEC §26): its files, archives,
//! snapshots and forks live on its tree's node; every other node relays.

use reqwest::Method;
use serde_json::{json, Value};

use super::{place_on, release};
use opkernel_tests::cluster::{timed, Cluster};
use opkernel_tests::unique_run;

/// A foreground command's output in `run`, through `via`, and its node.
async fn output(c: &Cluster, via: &str, run: &str, script: &str) -> (String, String) {
    let path = format!("/v1/runs/{run}/tools/run_command");
    let body = json!({"command": ["sh", "-c", script]});
    let v = timed(c.node(via).client.post(&path, &body)).await.unwrap();
    assert_eq!(v["exit_code"], 0, "{v}");
    let out = v["output"].as_str().unwrap_or_default().to_owned();
    (out, v["node"].as_str().unwrap_or_default().to_owned())
}

/// `PUT` of `bytes` as `path` of `run`, through `via`.
async fn put(c: &Cluster, via: &str, run: &str, path: &str, bytes: &'static [u8]) -> Value {
    let client = &c.node(via).client;
    let url = format!("/v1/runs/{run}/files/{path}");
    let answer = client.raw(Method::PUT, &url, Some(bytes.into())).await;
    answer.unwrap().json().await.unwrap()
}

/// Files written and read through n1 and n3 for a run on n2 land on n2;
/// an archive, a snapshot and a fork through other nodes are n2's too; a
/// tree with no op yet is placed by its first file, where its commands
/// then run.
pub async fn through_any_node(c: &Cluster) {
    let on_n2 = place_on(c, "n2", 1).await;
    let run = on_n2[0].run.clone();
    let (n1, n3) = (&c.node("n1").client, &c.node("n3").client);
    let written = put(c, "n1", &run, "scratch/w/a.txt", b"hello from n1").await;
    assert_eq!(written["bytes"], 13, "{written}");
    assert_eq!(
        output(c, "n3", &run, "cat w/a.txt").await.0,
        "hello from n1"
    );
    let read = timed(n3.get_bytes(&format!("/v1/runs/{run}/files/scratch/w/a.txt")))
        .await
        .unwrap();
    assert_eq!(read, b"hello from n1");
    let range = n1
        .request(
            Method::GET,
            &format!("/v1/runs/{run}/files/scratch/w/a.txt"),
            None,
            &[("range", "bytes=0-4")],
        )
        .await
        .unwrap();
    assert_eq!(range.0, 206, "a range through another node: {range:?}");
    let listed = timed(n3.get(&format!("/v1/runs/{run}/files/scratch/w/")))
        .await
        .unwrap();
    assert_eq!(listed["entries"][0]["name"], "a.txt", "{listed}");
    let tar = timed(n1.get_bytes(&format!("/v1/runs/{run}/archive/scratch/w")))
        .await
        .unwrap();
    assert!(
        tar.windows(5).any(|w| w == b"a.txt"),
        "the archive names a.txt"
    );
    let body = json!({"path": "/scratch/w/a.txt"});
    let tool = timed(n1.post(&format!("/v1/runs/{run}/tools/read_file"), &body))
        .await
        .unwrap();
    assert_eq!(tool["content"], "hello from n1", "{tool}");
    snapshot_and_fork(c, &run).await;
    release(c, &on_n2);
    // a tree with no op yet: its first file places it, its commands follow
    let fresh = unique_run("ws");
    timed(n3.post("/v1/runs", &json!({"run_id": fresh})))
        .await
        .unwrap();
    put(c, "n3", &fresh, "scratch/first.txt", b"placed").await;
    let (out, node) = output(c, "n1", &fresh, "cat first.txt").await;
    assert_eq!(
        out, "placed",
        "the first command runs where the first file went"
    );
    let placed = timed(n1.get(&format!("/v1/runs/{fresh}"))).await.unwrap();
    assert_eq!(placed["node"], node.as_str(), "{placed}");
}

/// A snapshot made through n3 and a fork made through n1 of a run on n2:
/// both on n2, the fork's first command too.
async fn snapshot_and_fork(c: &Cluster, run: &str) {
    let (n1, n3) = (&c.node("n1").client, &c.node("n3").client);
    let snap = json!({"name": "s1"});
    let made = timed(n3.post(&format!("/v1/runs/{run}/snapshots"), &snap))
        .await
        .unwrap();
    assert_eq!(made["name"], "s1", "{made}");
    let list = timed(n1.get(&format!("/v1/runs/{run}/snapshots")))
        .await
        .unwrap();
    assert_eq!(list["snapshots"][0]["name"], "s1", "{list}");
    for from in [run.to_owned(), format!("{run}@s1")] {
        let fork = unique_run("fork");
        let body = json!({"run_id": fork, "fork_from": from});
        let created = timed(n1.post("/v1/runs", &body)).await.unwrap();
        assert_eq!(created["forked_from"], from.as_str(), "{created}");
        let (out, node) = output(c, "n3", &fork, "cat w/a.txt").await;
        assert_eq!((out.as_str(), node.as_str()), ("hello from n1", "n2"));
    }
}
