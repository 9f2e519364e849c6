#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Workspaces against the real engine (SPEC §26): an image per run, the
//! files API (streamed both ways, Range, listings, tar archives, planted
//! links that never lead out), snapshots and forks.

mod workspace_helpers;

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::unique_run;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use workspace_helpers::{call, create, json_call, kernel, run};

/// A `PUT` declaring `length` bytes and sending none: the answer's head.
async fn declared_only(k: &KernelProcess, path: &str, length: u64) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = k.client.base().trim_start_matches("http://").to_owned();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "PUT {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\ncontent-length: {length}\r\n\r\n",
        k.client.token()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn each_run_gets_its_image_and_children_only_narrow() {
    let k = kernel("images", &[]).await;
    let v = k.client.get("/v1/images").await.unwrap();
    let names: Vec<&str> = v["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default", "deb"], "{v}");
    assert!(
        v["images"][1]["digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"),
        "{v}"
    );
    let (deb, base) = (unique_run("deb"), unique_run("base"));
    let (status, made) = create(
        &k,
        None,
        json!({"run_id": deb, "image": "deb", "envelope": {"images": ["deb"]}}),
    )
    .await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["image"], "deb");
    create(&k, None, json!({"run_id": base})).await;
    assert_eq!(
        run(&k, &deb, None, &["python3", "-c", "print(6*7)"]).await,
        (0, "42\n".to_owned())
    );
    assert_ne!(
        run(&k, &base, None, &["python3", "-c", "print(6*7)"])
            .await
            .0,
        0
    );
    // a name the operator does not list is refused, naming the listed ones
    let (status, v) = create(
        &k,
        None,
        json!({"run_id": unique_run("x"), "image": "node"}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("default, deb"),
        "{v}"
    );
    // a child inherits its parent's image; another one its envelope lacks is refused
    let token = made["token"].as_str().unwrap();
    let (status, child) = create(&k, Some(token), json!({"run_id": "c"})).await;
    assert_eq!(
        (status, child["image"].clone()),
        (StatusCode::OK, json!("deb")),
        "{child}"
    );
    let (status, v) = create(&k, Some(token), json!({"run_id": "d", "image": "default"})).await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], "envelope_exceeded", "{v}");
}

#[tokio::test]
async fn files_stream_both_ways_and_planted_links_never_lead_out() {
    let k = kernel("files", &[("OPKERNEL_FILE_MAX_BYTES", "64MiB")]).await;
    let r = unique_run("files");
    create(&k, None, json!({"run_id": r})).await;
    // 40 MiB of binary, up and down, the same bytes
    let data: Vec<u8> = (0..40u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let path = format!("/v1/runs/{r}/files/scratch/in/blob.bin");
    let (status, v) = call(
        &k,
        Method::PUT,
        &format!("{path}?mode=600"),
        None,
        data.clone(),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&v));
    let (status, back) = call(&k, Method::GET, &path, None, Vec::new()).await;
    assert_eq!(status, 200);
    assert_eq!(Sha256::digest(&back), Sha256::digest(&data));
    // the command sees it, as its own, with the mode asked for
    let (code, out) = run(
        &k,
        &r,
        None,
        &["stat", "-c", "%u %a %s", "/scratch/in/blob.bin"],
    )
    .await;
    assert_eq!((code, out.trim()), (0, "1000 600 41943040"));
    // a range
    let url = format!("{}{path}", k.client.base());
    let part = reqwest::Client::new()
        .get(url)
        .bearer_auth(k.client.token())
        .header("Range", "bytes=10-19")
        .send()
        .await
        .unwrap();
    assert_eq!(part.status(), 206);
    assert_eq!(part.bytes().await.unwrap().to_vec(), data[10..20].to_vec());
    // past the limit: 413, and nothing is left of it
    let head = declared_only(&k, &format!("/v1/runs/{r}/files/scratch/big"), 65 << 20).await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    let big = format!("/v1/runs/{r}/files/scratch/big");
    assert_eq!(call(&k, Method::GET, &big, None, Vec::new()).await.0, 404);
    // links a command plants lead nowhere outside its view, nor into .ops
    let plant = "ln -s /etc/shadow /scratch/shadow; ln -s /scratch/.ops /scratch/ops; \
                 ln -s ../../../../../../../etc/hostname /scratch/climb; ln -s .ops/inbox /scratch/inbox";
    assert_eq!(run(&k, &r, None, &["sh", "-c", plant]).await.0, 0);
    for (p, want) in [
        ("scratch/ops/", 403),
        ("scratch/.ops/", 403),
        ("scratch/inbox/", 403),
    ] {
        let (status, body) = call(
            &k,
            Method::GET,
            &format!("/v1/runs/{r}/files/{p}"),
            None,
            Vec::new(),
        )
        .await;
        assert_eq!(
            status.as_u16(),
            want,
            "{p}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    // another run's scratch on the host: a path that means nothing in the view
    let host = format!("ln -s {} /scratch/host", k.home.join("scratch").display());
    assert_eq!(run(&k, &r, None, &["sh", "-c", &host]).await.0, 0);
    let (status, _) = call(
        &k,
        Method::GET,
        &format!("/v1/runs/{r}/files/scratch/host/"),
        None,
        Vec::new(),
    )
    .await;
    // nothing there in the view (gVisor refuses its own /tmp, where a
    // test kernel's home is, by name)
    assert!(matches!(status.as_u16(), 403 | 404), "{status}");
    // the image's /etc/shadow (none in busybox) is never the host's
    let (status, body) = call(
        &k,
        Method::GET,
        &format!("/v1/runs/{r}/files/scratch/shadow"),
        None,
        Vec::new(),
    )
    .await;
    assert!(matches!(status.as_u16(), 403 | 404), "{status}");
    assert!(!String::from_utf8_lossy(&body).contains("root:"));
    let (status, _) = call(
        &k,
        Method::PUT,
        &format!("/v1/runs/{r}/files/scratch/ops/x"),
        None,
        b"x".to_vec(),
    )
    .await;
    assert_eq!(status, 403);
    // the listing leaves .ops out
    let (_, listing) = json_call(
        &k,
        Method::GET,
        &format!("/v1/runs/{r}/files/scratch/"),
        None,
        Value::Null,
    )
    .await;
    let names: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"in") && names.contains(&"ops") && !names.contains(&".ops"),
        "{listing}"
    );
    // another run's token reaches only its own run's files
    let (_, other) = create(&k, None, json!({"run_id": unique_run("other")})).await;
    let (status, _) = call(&k, Method::GET, &path, other["token"].as_str(), Vec::new()).await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn archives_round_trip_links_modes_and_empty_dirs() {
    let k = kernel("archive", &[]).await;
    let r = unique_run("archive");
    create(&k, None, json!({"run_id": r})).await;
    let make = "mkdir -p /scratch/t/empty /scratch/t/sub && echo hi > /scratch/t/sub/a && chmod 751 /scratch/t/sub/a \
                && ln -s sub/a /scratch/t/link && ln -s /etc/passwd /scratch/t/abs";
    assert_eq!(run(&k, &r, None, &["sh", "-c", make]).await.0, 0);
    let (status, tar) = call(
        &k,
        Method::GET,
        &format!("/v1/runs/{r}/archive/scratch/t"),
        None,
        Vec::new(),
    )
    .await;
    assert_eq!(status, 200);
    let (status, v) = call(
        &k,
        Method::PUT,
        &format!("/v1/runs/{r}/archive/scratch/u"),
        None,
        tar,
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&v));
    let describe = "cd /scratch/$0 && find . | sort | while read f; do stat -c '%n %A %s' \"$f\"; \
                    [ -L \"$f\" ] && readlink \"$f\"; done; true";
    let t = run(&k, &r, None, &["sh", "-c", describe, "t"]).await;
    let u = run(&k, &r, None, &["sh", "-c", describe, "u"]).await;
    assert_eq!(t.0, 0);
    assert_eq!(t, u);
    assert!(
        t.1.contains("./empty drwx") && t.1.contains("-rwxr-x--x"),
        "{}",
        t.1
    );
}

#[tokio::test]
async fn forks_and_snapshots_copy_the_workspace_never_ops() {
    let k = kernel("fork", &[]).await;
    let r = unique_run("src");
    let (_, made) = create(
        &k,
        None,
        json!({"run_id": r, "envelope": {"disk_bytes": 500_000}}),
    )
    .await;
    let token = made["token"].as_str().unwrap();
    assert_eq!(
        run(&k, &r, None, &["sh", "-c", "echo one > /scratch/f"])
            .await
            .0,
        0
    );
    // a command still running in the source
    let body = json!({"command": ["sh", "-c", "while true; do date >> /scratch/log; sleep 0.1; done"], "background": true});
    let bg = k
        .client
        .post(&format!("/v1/runs/{r}/tools/run_command"), &body)
        .await
        .unwrap();
    let bg = bg["operation_id"].as_str().unwrap().to_owned();
    let (status, snap) = json_call(
        &k,
        Method::POST,
        &format!("/v1/runs/{r}/snapshots"),
        Some(token),
        json!({"name": "v1"}),
    )
    .await;
    assert_eq!(status, 200, "{snap}");
    assert_eq!(
        run(&k, &r, None, &["sh", "-c", "echo two > /scratch/f"])
            .await
            .0,
        0
    );
    // a child forked from its parent (frozen meanwhile), two forks of the snapshot
    let (status, c) = create(
        &k,
        Some(token),
        json!({"run_id": "c", "fork_from": r, "consistent": true}),
    )
    .await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(
        run(&k, &format!("{r}.c"), None, &["cat", "/scratch/f"]).await,
        (0, "two\n".to_owned())
    );
    for name in ["s1", "s2"] {
        let (status, v) = create(
            &k,
            None,
            json!({"run_id": format!("{r}-{name}"), "fork_from": format!("{r}@v1")}),
        )
        .await;
        assert_eq!(
            (status, v["forked_from"].clone()),
            (StatusCode::OK, json!(format!("{r}@v1"))),
            "{v}"
        );
        let id = format!("{r}-{name}");
        assert_eq!(
            run(&k, &id, None, &["cat", "/scratch/f"]).await,
            (0, "one\n".to_owned())
        );
        // the fork has no .ops of its source's: no op files came along
        let (code, out) = run(&k, &id, None, &["ls", "/scratch/.ops"]).await;
        assert!(code == 0 && !out.contains(&bg), "{out}");
    }
    // a second snapshot past disk_bytes is refused
    let big = "head -c 600000 /dev/zero > /scratch/big";
    assert_eq!(run(&k, &r, None, &["sh", "-c", big]).await.0, 0);
    let (status, v) = json_call(
        &k,
        Method::POST,
        &format!("/v1/runs/{r}/snapshots"),
        Some(token),
        json!({"name": "v2"}),
    )
    .await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], "disk_exceeded");
    let (_, list) = json_call(
        &k,
        Method::GET,
        &format!("/v1/runs/{r}/snapshots"),
        Some(token),
        Value::Null,
    )
    .await;
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 1, "{list}");
    thaws_only_what_a_fork_froze(k, &r).await;
}

/// A kernel that stopped during a consistent fork's copy left the source
/// frozen, with its mark: the next start thaws it, and only it (a
/// container the operator paused by hand stays paused).
async fn thaws_only_what_a_fork_froze(mut k: KernelProcess, r: &str) {
    let frozen = k.home.join("frozen");
    let marks = std::fs::read_dir(&frozen).map_or(0, |d| d.count());
    assert_eq!(marks, 0, "a finished fork leaves no freeze mark");
    // each run's container (its own, or the pool container it adopted)
    let list = k.client.get("/v1/containers").await.unwrap();
    let id_of = |run: &str| {
        let all = list["containers"].as_array().unwrap();
        let mine = all
            .iter()
            .find(|c| c["run_id"] == run && c["state"] == "running");
        mine.map(|c| c["container_id"].as_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (source, by_hand) = (id_of(r), id_of(&format!("{r}.c")));
    assert!(!source.is_empty() && !by_hand.is_empty());
    std::fs::create_dir_all(&frozen).unwrap();
    std::fs::write(frozen.join(&source), b"").unwrap();
    for id in [&source, &by_hand] {
        let paused = std::process::Command::new("docker")
            .args(["pause", id])
            .status();
        assert!(paused.unwrap().success());
    }
    k.restart().await.unwrap();
    let state = |id: &str| {
        let out = std::process::Command::new("docker")
            .args(["inspect", "-f", "{{.State.Status}}", id])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(state(&source), "running", "the fork's freeze was thawed");
    assert_eq!(state(&by_hand), "paused", "the operator's pause stays");
    assert!(
        !frozen.join(&source).exists(),
        "the mark went with the thaw"
    );
    let _ = std::process::Command::new("docker")
        .args(["unpause", &by_hand])
        .status();
}

fn cli(k: &KernelProcess, args: &[&str]) -> std::process::Output {
    std::process::Command::new(kernel_binary().unwrap())
        .args(args)
        .env("OPKERNEL_URL", k.client.base())
        .env("OPKERNEL_HOME", &k.home)
        .env_remove("OPKERNEL_TOKEN")
        .output()
        .unwrap()
}

/// `opkernel cp` both ways with a directory (a link and a mode in it) and a
/// file; `opkernel ls` lists what arrived.
#[tokio::test]
async fn cp_and_ls_move_files_and_directories_both_ways() {
    use std::os::unix::fs::PermissionsExt;
    let k = kernel("cp", &[]).await;
    let r = unique_run("cp");
    create(&k, None, json!({"run_id": r})).await;
    let here = k.home.join("local");
    std::fs::create_dir_all(here.join("proj/src")).unwrap();
    std::fs::write(here.join("proj/src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::set_permissions(
        here.join("proj/src/main.rs"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink("src/main.rs", here.join("proj/entry")).unwrap();
    std::fs::write(here.join("note.txt"), "a note").unwrap();
    let up = cli(
        &k,
        &[
            "cp",
            here.join("proj").to_str().unwrap(),
            &format!("{r}:/scratch/"),
        ],
    );
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let up = cli(
        &k,
        &[
            "cp",
            here.join("note.txt").to_str().unwrap(),
            &format!("{r}:/scratch/n.txt"),
        ],
    );
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let (code, out) = run(&k, &r, None, &["sh", "-c", "stat -c '%a %u' /scratch/proj/src/main.rs; readlink /scratch/proj/entry; cat /scratch/n.txt"]).await;
    assert_eq!((code, out.as_str()), (0, "755 1000\nsrc/main.rs\na note"));
    let ls = cli(&k, &["ls", &format!("{r}:/scratch/proj")]);
    let listing = String::from_utf8_lossy(&ls.stdout);
    assert!(
        listing.contains("entry") && listing.contains("src"),
        "{listing}"
    );
    let back = k.home.join("back");
    std::fs::create_dir_all(&back).unwrap();
    let down = cli(
        &k,
        &["cp", &format!("{r}:/scratch/proj"), back.to_str().unwrap()],
    );
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(back.join("proj/src/main.rs")).unwrap(),
        "fn main() {}\n"
    );
    assert_eq!(
        std::fs::read_link(back.join("proj/entry")).unwrap(),
        std::path::PathBuf::from("src/main.rs")
    );
    let down = cli(
        &k,
        &["cp", &format!("{r}:/scratch/n.txt"), back.to_str().unwrap()],
    );
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(back.join("n.txt")).unwrap(),
        "a note"
    );
}
