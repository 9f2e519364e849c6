#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The interactive client verbs (SPEC §25): `opkernel run --stdin | --tty`
//! attached to the caller's input (keys in, output out, exit code last),
//! `opkernel write`, `opkernel output` and `opkernel kill --signal`.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::{unique_run, Image};
use serde_json::json;

fn cli(k: &KernelProcess, args: &[&str], input: Option<&str>) -> Output {
    let mut child = Command::new(kernel_binary().unwrap())
        .args(args)
        .env("OPKERNEL_URL", k.client.base())
        .env("OPKERNEL_HOME", &k.home)
        .env_remove("OPKERNEL_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    if let Some(text) = input {
        stdin.write_all(text.as_bytes()).unwrap();
    }
    drop(stdin);
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `run --stdin`: the caller's input goes to the command, its end closes
/// the command's stdin, and the command's code is the client's.
#[tokio::test]
async fn run_with_stdin_pipes_the_callers_input_through() {
    let k = Image::Default.kernel("cli-stdin").await.unwrap();
    let run = unique_run("clistdin");
    let script = "while read l; do echo \"[$l]\"; done; exit 6";
    let out = cli(
        &k,
        &["run", "--run", &run, "--stdin", "--", "sh", "-c", script],
        Some("one\ntwo\n"),
    );
    assert_eq!(out.status.code(), Some(6), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "[one]\n[two]\n");
    assert!(
        text(&out.stderr).contains("exit_code=6"),
        "{}",
        text(&out.stderr)
    );
    let refused = cli(&k, &["run", "--stdin", "--", "cat"], None);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("need --run"),
        "{}",
        text(&refused.stderr)
    );
}

/// `run --tty`: a shell on a terminal reads the caller's lines.
#[tokio::test]
async fn run_with_a_tty_attaches_a_shell() {
    let k = Image::Default.kernel("cli-tty").await.unwrap();
    let run = unique_run("clitty");
    let out = cli(
        &k,
        &["run", "--run", &run, "--tty", "--", "sh"],
        Some("tty\necho sum=$((40+2))\nexit 9\n"),
    );
    assert_eq!(out.status.code(), Some(9), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("/dev/pts/"), "{shown}");
    assert!(shown.contains("sum=42"), "{shown}");
}

/// `write`, `output` and `kill --signal` on a running op.
#[tokio::test]
async fn write_output_and_signal_verbs() {
    let k = Image::Default.kernel("cli-verbs").await.unwrap();
    let run = unique_run("cliverbs");
    // a trapped signal interrupts `read`: the loop goes on unless it was
    // EOF (a last line without a newline still counts)
    let script = "trap 'echo got-usr1; r=1' USR1; \
                  while r=; l=; read l || [ -n \"$r$l\" ]; do [ -n \"$l\" ] && echo \"<$l>\"; done";
    let v = k
        .client
        .post(
            &format!("/v1/runs/{run}/tools/run_command"),
            &json!({"command": ["sh", "-c", script], "background": true, "stdin": true}),
        )
        .await
        .unwrap();
    let op = v["operation_id"].as_str().unwrap().to_owned();
    let written = cli(&k, &["write", &op, "hello"], None);
    assert!(written.status.success(), "{}", text(&written.stderr));
    assert_eq!(text(&written.stdout), "<hello>\n");
    let sig = cli(&k, &["kill", &op, "--signal", "usr1"], None);
    assert!(sig.status.success(), "{}", text(&sig.stderr));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bad = cli(&k, &["kill", &op, "--signal", "STOP"], None);
    assert!(!bad.status.success());
    let ended = cli(&k, &["write", &op, "-n", "--eof", "last"], None);
    assert!(ended.status.success(), "{}", text(&ended.stderr));
    let out = cli(&k, &["output", &op, "--follow"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.starts_with("<hello>\n"), "{shown}");
    assert!(shown.contains("got-usr1"), "{shown}");
    assert!(shown.ends_with("<last>\n"), "{shown}");
    let from = cli(&k, &["output", &op, "--offset", "2"], None);
    assert_eq!(text(&from.stdout), shown[2..]);
}
