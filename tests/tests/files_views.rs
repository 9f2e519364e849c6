#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The files API on either runtime (SPEC §26, §30): under runc through the
//! container's own root, under gVisor through its root file system and
//! mounts on the host. The same calls, the same answers, apart from what
//! gVisor keeps inside its sandbox (its `/tmp`), which is refused by name
//! rather than answered from a stale copy.

mod workspace_helpers;

use opkernel_tests::{runtime, unique_run};
use reqwest::Method;
use serde_json::{json, Value};
use workspace_helpers::{call, create, json_call, kernel, run};

fn names(listing: &Value) -> Vec<String> {
    listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_files_api_sees_what_the_command_sees_on_either_runtime() {
    let k = kernel("files-views", &[]).await;
    let r = unique_run("views");
    create(&k, None, json!({"run_id": r})).await;
    let files = |p: &str| format!("/v1/runs/{r}/files/{p}");
    // what a command writes, the API reads at once
    let made = "echo inside > /scratch/made && echo temp > /tmp/t && mkdir -p /scratch/d/e";
    assert_eq!(run(&k, &r, None, &["sh", "-c", made]).await.0, 0);
    let (status, body) = call(&k, Method::GET, &files("scratch/made"), None, Vec::new()).await;
    assert_eq!((status.as_u16(), body.as_slice()), (200, &b"inside\n"[..]));
    // what the API writes, the command sees at once, as its own
    let (status, _) = call(
        &k,
        Method::PUT,
        &files("scratch/d/e/up"),
        None,
        b"up".to_vec(),
    )
    .await;
    assert_eq!(status, 200);
    let (code, out) = run(
        &k,
        &r,
        None,
        &[
            "sh",
            "-c",
            "cat /scratch/d/e/up; stat -c %u /scratch/d/e/up",
        ],
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "up1000\n"));
    // and a removal too (gVisor's caches revalidate the mount)
    let (status, _) = call(&k, Method::DELETE, &files("scratch/made"), None, Vec::new()).await;
    assert_eq!(status, 204);
    let (code, _) = run(&k, &r, None, &["test", "-e", "/scratch/made"]).await;
    assert_eq!(code, 1);
    // the image's files are read from its root file system
    let (status, body) = call(&k, Method::GET, &files("etc/passwd"), None, Vec::new()).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("root:"));
    let (status, listing) = json_call(&k, Method::GET, &files("etc/"), None, Value::Null).await;
    assert_eq!(status, 200, "{listing}");
    assert!(names(&listing).contains(&"passwd".to_owned()), "{listing}");
    let (_, listing) = json_call(&k, Method::GET, &files("scratch/d/"), None, Value::Null).await;
    assert_eq!(names(&listing), ["e"]);
    // the root file system is read-only on both (runc's mount, gVisor's
    // view): a 403 that says so, and nothing written
    let (status, body) = call(&k, Method::PUT, &files("etc/new"), None, b"x".to_vec()).await;
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&body));
    assert_eq!(run(&k, &r, None, &["test", "-e", "/etc/new"]).await.0, 1);
    // the tmpfs: runc reaches it; gVisor keeps it inside the sandbox, so
    // it is refused by name (never answered from the host's stale copy)
    let (status, body) = call(&k, Method::GET, &files("tmp/t"), None, Vec::new()).await;
    let text = String::from_utf8_lossy(&body).into_owned();
    if runtime().is_runc() {
        assert_eq!((status.as_u16(), text.as_str()), (200, "temp\n"));
    } else {
        assert_eq!(status, 403, "{text}");
        assert!(
            text.contains("path_refused") && text.contains("/scratch"),
            "{text}"
        );
        let (status, _) = call(&k, Method::PUT, &files("tmp/x"), None, b"x".to_vec()).await;
        assert_eq!(status, 403);
    }
    // an archive of the root holds the mount's files
    let (status, tar) = call(
        &k,
        Method::GET,
        &format!("/v1/runs/{r}/archive/scratch"),
        None,
        Vec::new(),
    )
    .await;
    assert_eq!(status, 200);
    let entries: Vec<String> = tar::Archive::new(tar.as_slice())
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    assert!(entries.contains(&"d/e/up".to_owned()), "{entries:?}");
}
