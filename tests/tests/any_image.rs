#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Any image, full guarantees (SPEC §12): a real workload in a real Debian
//! image, what the dropped command can and cannot reach, and an image with
//! no shell at all.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::{unique_run, Image};
use reqwest::Method;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

async fn kernel(tag: &str, image: &str) -> KernelProcess {
    KernelProcess::start(&kernel_binary().unwrap(), tag, &[("OPKERNEL_IMAGE", image)])
        .await
        .unwrap()
}

async fn run_fg(k: &KernelProcess, run: &str, command: &[&str]) -> Value {
    k.client
        .post(
            &format!("/v1/runs/{run}/tools/run_command"),
            &json!({ "command": command }),
        )
        .await
        .unwrap()
}

async fn kill(k: &KernelProcess, run: &str, op: &str) {
    let (status, body) = k
        .client
        .request(
            Method::POST,
            &format!("/v1/runs/{run}/tools/kill_operation"),
            Some(&json!({ "operation_id": op })),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
}

fn ended(v: &Value) -> (Option<&str>, Option<i64>, Option<bool>) {
    (
        v["status"].as_str(),
        v["exit_code"].as_i64(),
        v["killed"].as_bool(),
    )
}

const TEST_MODULE: &str = r#"
import os, sys, time, unittest

class Quick(unittest.TestCase):
    def test_arithmetic(self):
        self.assertEqual(sum(range(10)), 45)

    def test_home_and_user(self):
        self.assertEqual(os.environ["HOME"], "/scratch")
        self.assertEqual(os.getuid(), 1000)
        self.assertEqual(os.getgroups(), [])

class Slow(unittest.TestCase):
    def test_slow(self):
        print("slow test started", flush=True)
        time.sleep(300)

class Failing(unittest.TestCase):
    def test_wrong(self):
        self.assertEqual(1, 2)
"#;

/// `python3 -m unittest` over a module written to the scratch dir: it
/// completes with its real code and output, fails with 1, and a kill in the
/// middle of a slow test ends it killed with 143.
#[tokio::test]
async fn python_unittest_runs_completes_fails_and_is_killed_in_debian() {
    let k = kernel("pyunit", &Image::Debian.name()).await;
    let run = unique_run("pyunit");
    let write = format!(
        "open('/scratch/test_agent.py', 'w').write({})",
        serde_json::to_string(TEST_MODULE).unwrap()
    );
    let out = run_fg(&k, &run, &["python3", "-c", &write]).await;
    assert_eq!(ended(&out).1, Some(0), "{out}");

    let unittest = |target: &'static str| vec!["python3", "-m", "unittest", "-v", target];
    let quick = k
        .start_bg(&run, &unittest("test_agent.Quick"), 120)
        .await
        .unwrap();
    let failing = k
        .start_bg(&run, &unittest("test_agent.Failing"), 120)
        .await
        .unwrap();
    let slow = k
        .start_bg(&run, &unittest("test_agent.Slow"), 600)
        .await
        .unwrap();

    let q = k.wait_terminal(&quick, T).await.unwrap();
    assert_eq!(ended(&q), (Some("completed"), Some(0), Some(false)), "{q}");
    let tail = q["output_tail"].as_str().unwrap();
    assert!(
        tail.contains("Ran 2 tests") && tail.contains("\nOK\n"),
        "{tail}"
    );
    assert!(q["cpu_ms"].as_u64().unwrap() > 0, "{q}");
    assert!(q["max_rss_kb"].as_u64().unwrap() > 1000, "{q}");

    let f = k.wait_terminal(&failing, T).await.unwrap();
    assert_eq!(ended(&f), (Some("completed"), Some(1), Some(false)), "{f}");
    assert!(
        f["output_tail"]
            .as_str()
            .unwrap()
            .contains("FAILED (failures=1)"),
        "{f}"
    );

    let log = k
        .home
        .join("scratch")
        .join(sandbox::profile::scratch_key(&run))
        .join(".ops")
        .join(format!("{slow}.log"));
    opkernel_tests::wait_for("the slow test to start", T, || {
        let log = log.clone();
        async move {
            std::fs::read_to_string(&log)
                .ok()
                .filter(|t| t.contains("slow test started"))
        }
    })
    .await;
    kill(&k, &run, &slow).await;
    let s = k.wait_terminal(&slow, T).await.unwrap();
    assert_eq!(ended(&s), (Some("completed"), Some(143), Some(true)), "{s}");
}

/// The command runs as 1000 with `HOME=/scratch` and no groups; it can
/// neither write `.ops` (its own code included, or the launcher's inbox)
/// nor signal its shim or the resident launcher, and a forged code never
/// replaces the real one.
#[tokio::test]
async fn the_command_cannot_write_its_op_files_nor_signal_the_shim() {
    let k = kernel("reach", &Image::Debian.name()).await;
    let run = unique_run("reach");
    let who = run_fg(&k, &run, &["sh", "-c", "id -u; id -g; id -G; echo $HOME"]).await;
    assert_eq!(who["output"], "1000\n1000\n1000\n/scratch\n", "{who}");

    let ops = "/scratch/.ops/$__OPKERNEL_OP";
    let reach = format!(
        "touch /scratch/.ops/x 2>/dev/null && echo ops-written; \
         {{ echo 0 > {ops}.code; }} 2>/dev/null && echo code-forged; \
         {{ echo 0 > {ops}.code.tmp; }} 2>/dev/null && echo tmp-forged; \
         ln -s /etc/passwd {ops}.log2 2>/dev/null && echo linked; \
         mv /scratch/.ops /scratch/moved 2>/dev/null && echo ops-moved; \
         shim=$(cut -d' ' -f1 {ops}.pid); \
         kill -TERM \"$shim\" 2>/dev/null && echo shim-signalled; \
         kill -KILL \"$shim\" 2>/dev/null && echo shim-killed; \
         python3 -c \"import os; os.kill($shim, 9)\" 2>/dev/null && echo shim-killed-py; \
         launcher=$(cut -d' ' -f1 /scratch/.ops/launcher.pid); \
         kill -KILL \"$launcher\" 2>/dev/null && echo launcher-killed; \
         {{ echo x > /scratch/.ops/inbox/x.req; }} 2>/dev/null && echo inbox-written; \
         echo shim=$shim; exit 3"
    );
    let op = k.start_bg(&run, &["sh", "-c", &reach], 60).await.unwrap();
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(ended(&s), (Some("completed"), Some(3), Some(false)), "{s}");
    let tail = s["output_tail"].as_str().unwrap();
    assert!(tail.starts_with("shim="), "nothing was reached: {tail}");
    let shim_pid: u32 = tail.trim().trim_start_matches("shim=").parse().unwrap();
    assert!(shim_pid > 1, "{tail}");
}

/// `FROM scratch` plus one static binary: no shell, no passwd, no libc in
/// the image. The op runs, reports its code and output, and is killed.
#[tokio::test]
async fn a_command_runs_in_an_image_with_no_shell_at_all() {
    let image = no_shell_image();
    let k = kernel("noshell", &image).await;
    let run = unique_run("noshell");
    let out = run_fg(&k, &run, &["/hello", "a b", "c"]).await;
    assert_eq!(
        ended(&out),
        (Some("completed"), Some(7), Some(false)),
        "{out}"
    );
    assert_eq!(
        out["output"],
        "uid=1000 gid=1000 groups=0 home=/scratch args=a b|c\nto stderr\n"
    );
    let op = k.start_bg(&run, &["/hello", "sleep"], 60).await.unwrap();
    let container = k.container_of(&op).await.unwrap();
    k.wait_state(&op, T, |s| s["status"] == "running")
        .await
        .unwrap();
    let shell = Command::new("docker")
        .args(["exec", &container, "sh", "-c", "true"])
        .output()
        .unwrap();
    assert!(!shell.status.success(), "the image has no shell");
    kill(&k, &run, &op).await;
    let s = k.wait_terminal(&op, T).await.unwrap();
    assert_eq!(ended(&s), (Some("completed"), Some(143), Some(true)), "{s}");
    // stdin and a terminal need nothing from the image either (SPEC §25)
    for (io, enter) in [(json!({"stdin": true}), "\n"), (json!({"tty": true}), "\r")] {
        let mut body = json!({"command": ["/hello", "cat"], "background": true});
        body.as_object_mut()
            .unwrap()
            .extend(io.as_object().unwrap().clone());
        let op = k
            .client
            .post(&format!("/v1/runs/{run}/tools/run_command"), &body)
            .await
            .unwrap()["operation_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let path = format!("/v1/runs/{run}/tools/write_stdin");
        let line = json!({"operation_id": op, "text": format!("abc{enter}"), "yield_ms": 5000});
        let v = k.client.post(&path, &line).await.unwrap();
        assert!(v["output"].as_str().unwrap().contains("abc"), "{io}: {v}");
        let eof = json!({"operation_id": op, "eof": true, "yield_ms": 5000});
        let v = k.client.post(&path, &eof).await.unwrap();
        assert_eq!(v["exit_code"], 0, "{io}: {v}");
        assert!(v["output"].as_str().unwrap().contains("eof"), "{io}: {v}");
    }
}

const HELLO_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "sleep") == 0) {
        for (;;) pause();
    }
    if (argc > 1 && strcmp(argv[1], "cat") == 0) {
        char buf[4096];
        ssize_t n;
        while ((n = read(0, buf, sizeof buf)) > 0) write(1, buf, n);
        printf("eof\n");
        return 0;
    }
    printf("uid=%d gid=%d groups=%d home=%s args=", (int)getuid(), (int)getgid(),
           getgroups(0, NULL), getenv("HOME"));
    for (int i = 1; i < argc; i++) printf("%s%s", i > 1 ? "|" : "", argv[i]);
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "to stderr\n");
    return 7;
}
"#;

/// Builds `opkernel-test-noshell:latest`: an empty image holding one
/// statically linked C program at `/hello`.
fn no_shell_image() -> String {
    let dir = std::env::temp_dir().join(format!("opkernel-noshell-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hello.c"), HELLO_C).unwrap();
    run(Command::new("gcc")
        .args(["-static", "-O2", "-o"])
        .arg(dir.join("hello"))
        .arg(dir.join("hello.c")));
    let image = "opkernel-test-noshell:latest".to_owned();
    run(Command::new("sh").arg("-c").arg(format!(
        "tar -C '{}' -c hello | docker import - {image}",
        dir.display()
    )));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!Path::new(&dir).exists());
    image
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
