#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The MCP server through the official Python MCP client (PyPI `mcp`, in
//! the virtualenv `scripts/test.sh` makes): both transports, both protocol
//! eras, tools, reports exactly once across dropped sessions, resources,
//! resolution events, tool errors. The client's test file is
//! `tests/mcp/test_mcp.py`.

use std::path::PathBuf;
use std::process::Command;

use opkernel::drills::harness::{kernel_binary, KernelProcess};

fn python() -> PathBuf {
    match std::env::var_os("OPKERNEL_MCP_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-venv/bin/python"),
    }
}

#[tokio::test]
async fn the_official_python_client_drives_both_transports() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: scripts/test.sh makes the MCP client's virtualenv",
        python.display()
    );
    let k = KernelProcess::start(&kernel_binary().unwrap(), "mcp", &[])
        .await
        .unwrap();
    let operator = std::fs::read_to_string(k.home.join("operator.token")).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mcp/test_mcp.py");
    let out = tokio::task::spawn_blocking({
        let (base, bin) = (k.client.base().to_owned(), kernel_binary().unwrap());
        move || {
            Command::new(python)
                .arg(script)
                .env("OPKERNEL_URL", base)
                .env("OPKERNEL_BIN", bin)
                .env("OPKERNEL_OPERATOR_TOKEN", operator.trim())
                .env("PYTHONWARNINGS", "ignore")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // the latency line and the negotiated versions, for the record
    for line in stderr
        .lines()
        .filter(|l| l.starts_with("LATENCY") || l.contains("protocol"))
    {
        eprintln!("{line}");
    }
    assert!(out.status.success(), "python MCP tests failed:\n{stderr}");
    assert!(stderr.contains("Ran 8 tests"), "{stderr}");
}
