#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End-to-end guards of the host's privacy against the real engine:
//! private host files, no silent root, root-mode forgeries.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;
use std::time::Duration;

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::KernelProcessExt;
use serde_json::json;

const T: Duration = Duration::from_secs(60);

async fn kernel(tag: &str, env: &[(&str, &str)]) -> KernelProcess {
    KernelProcess::start(&kernel_binary().unwrap(), tag, env)
        .await
        .unwrap()
}

fn unique_run(tag: &str) -> String {
    opkernel_tests::unique_run(tag)
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[tokio::test]
async fn host_files_are_private_and_scratch_goes_with_its_container() {
    let k = kernel("private", &[]).await;
    assert_eq!(mode(&k.home), 0o700, "home");
    // the control plane is the home's file, or (PostgreSQL) not in the home
    if k.on_postgres() {
        assert!(
            !k.home.join("kernel.db").exists(),
            "a kernel.db beside PostgreSQL"
        );
    } else {
        assert_eq!(mode(&k.home.join("kernel.db")), 0o600, "control plane");
    }
    assert_eq!(
        mode(&k.home.join("operator.token")),
        0o600,
        "operator token"
    );
    let run = unique_run("private");
    let op = k
        .start_bg(&run, &["sh", "-c", "id -u; echo $HOME"], 60)
        .await
        .unwrap();
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["output_tail"], "1000\n/scratch\n");
    let scratch_root = k.home.join("scratch");
    assert_eq!(mode(&scratch_root), 0o711);
    assert_eq!(std::fs::metadata(&scratch_root).unwrap().uid(), 0);
    let dir = scratch_root.join(sandbox::profile::scratch_key(&run));
    let meta = std::fs::metadata(&dir).unwrap();
    assert_eq!(
        (meta.uid(), meta.mode() & 0o7777),
        (1000, 0o700),
        "scratch dir"
    );
    let ops = std::fs::metadata(dir.join(".ops")).unwrap();
    assert_eq!(ops.uid(), 0, ".ops stays root's");
    // finishing delivers every result; the reaper then takes container and files
    k.client
        .post(&format!("/v1/runs/{run}/finish"), &json!({}))
        .await
        .unwrap();
    let reaped = k.client.post("/v1/reap", &json!({})).await.unwrap();
    let mine: Vec<_> = reaped["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["run_id"] == run.as_str())
        .collect();
    assert_eq!(mine.len(), 1, "{reaped}");
    assert_eq!(mine[0]["removed"], true, "{reaped}");
    assert!(
        mine[0]["reason"]
            .as_str()
            .unwrap()
            .contains("scratch dir removed"),
        "{reaped}"
    );
    assert!(!dir.exists(), "scratch dir outlived its delivered run");
}

#[tokio::test]
async fn the_drop_to_the_run_user_is_never_turned_off_silently() {
    // another image tag (as a user's own image would be) still drops to the user
    let tag = "opkernel-sandbox:review-foreign";
    let tagged = Command::new("docker")
        .args(["tag", &opkernel_tests::image(), tag])
        .status()
        .unwrap();
    assert!(tagged.success());
    let k = kernel("foreign", &[("OPKERNEL_IMAGE", tag)]).await;
    let run = unique_run("foreign");
    let op = k.start_bg(&run, &["id", "-u"], 60).await.unwrap();
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(s["output_tail"], "1000\n", "{s}");
    drop(k);
    // an image without the user: the kernel refuses to start, and says why
    let home = opkernel_tests::temp_home("nouser");
    let out = Command::new(kernel_binary().unwrap())
        .args(["serve", "--listen", "127.0.0.1:0", "--home"])
        .arg(&home)
        .env("OPKERNEL_RUN_AS", "nosuchuser")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("cannot run commands as \"nosuchuser\"")
            && err.contains("OPKERNEL_RUN_AS=root"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&home);
}

#[tokio::test]
async fn in_root_mode_a_forged_code_is_not_believed() {
    let k = kernel("rootmode", &[("OPKERNEL_RUN_AS", "root")]).await;
    let run = unique_run("rootmode");
    let forge = "echo 0 > /scratch/.ops/$__OPKERNEL_OP.code; kill -9 $PPID; exit 3";
    let op = k.start_bg(&run, &["sh", "-c", forge], 60).await.unwrap();
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(s["status"], "lost", "a forged 0 was believed: {s}");
    assert_eq!(s["effect"], "uncertain");
    assert!(s["exit_code"].is_null());
    // honest commands keep their codes, as root
    let op = k
        .start_bg(&run, &["sh", "-c", "id -u; exit 3"], 60)
        .await
        .unwrap();
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["exit_code"].as_i64()),
        (Some("completed"), Some(3)),
        "{s}"
    );
    assert_eq!(s["output_tail"], "0\n");
}
