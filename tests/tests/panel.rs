#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The live panel in a real headless Chromium (Debian's `chromium`),
//! driven over the DevTools protocol by `tests/panel/test_panel.py`: sign
//! in, a running op with output arriving, the op leaving on completion, an
//! approval from the panel, a run token that sees its own run only, a
//! phone-sized layout, first paint against a kernel with 1,000 ops, at
//! most 24 live cards with the rest counted, errors shown in the page (an
//! approval the API refuses; a failed refresh, cleared by the next one),
//! and the script as ES modules under the strict policy, with schedules'
//! states and timings, and nothing thrown by the page in any test.
//! Screenshots of each state go to `target/panel-screenshots/`.

use std::path::PathBuf;
use std::process::Command;

use opkernel::drills::harness::{kernel_binary, KernelProcess};

#[tokio::test]
async fn the_panel_in_a_real_browser() {
    let python = match std::env::var_os("OPKERNEL_MCP_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-venv/bin/python"),
    };
    assert!(
        python.exists(),
        "{} is missing: scripts/test.sh makes the test virtualenv",
        python.display()
    );
    let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/panel-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let k = KernelProcess::start(&kernel_binary().unwrap(), "panel", &[])
        .await
        .unwrap();
    let operator = std::fs::read_to_string(k.home.join("operator.token")).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("panel/test_panel.py");
    let script_path = script.clone();
    let out = tokio::task::spawn_blocking({
        let base = k.client.base().to_owned();
        move || {
            Command::new(python)
                .arg(script)
                .env("OPKERNEL_URL", base)
                .env("OPKERNEL_OPERATOR_TOKEN", operator.trim())
                .env("OPKERNEL_PANEL_SHOTS", &shots)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for line in stdout.lines().filter(|l| l.starts_with("PANEL")) {
        eprintln!("{line}");
    }
    assert!(
        out.status.success(),
        "panel tests failed:\n{stdout}\n{stderr}"
    );
    // every test of the script ran (a skipped or unloaded one is a failure)
    let tests = std::fs::read_to_string(&script_path)
        .unwrap()
        .matches("\n    def test_")
        .count();
    assert!(
        stderr.contains(&format!("Ran {tests} tests")),
        "{tests} tests expected: {stderr}"
    );
}
