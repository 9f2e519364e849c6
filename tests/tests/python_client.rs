#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Python client (`clients/python`, package `opkernel`, SPEC §29)
//! through its own pytest suite against live kernels: runs and tokens,
//! foreground and background ops, reports acked exactly once, kills,
//! idempotent retries, errors, events and consoles, schedules, approvals,
//! files, interactive ops, the sync and async clients, the example agent
//! loop, TLS with a private CA (a second kernel serving `https://` with
//! certificates this test makes), and the contract test comparing the
//! client's route table with `GET /v1/openapi.json`. The interpreter is the
//! virtualenv `scripts/test.sh` makes (with `httpx` and `pytest` among its
//! pins); the package is found by `PYTHONPATH`.

use std::path::PathBuf;
use std::process::Command;

use opkernel::drills::harness::{kernel_binary, KernelProcess};
use opkernel_tests::{certs, temp_home};

/// Tests the suite holds (`pytest --collect-only -q clients/python/tests`);
/// a run that passes fewer (a file skipped, a test lost) fails here.
const PYTHON_TESTS: usize = 65;

fn python() -> PathBuf {
    match std::env::var_os("OPKERNEL_MCP_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-venv/bin/python"),
    }
}

/// A kernel serving `https://` with a certificate of a CA made here; the
/// CA's PEM.
async fn tls_kernel() -> (KernelProcess, PathBuf) {
    let dir = temp_home("pyclient-tls");
    certs::ca(&dir, "ca").unwrap();
    let sans = ["DNS:localhost", "IP:127.0.0.1"];
    let (cert, key) = certs::server(&dir, "ca", "api", &sans).unwrap();
    let ca = dir.join("ca.pem");
    // the harness's own client waits for the kernel over https
    opkernel::base::tls::trust(&ca).unwrap();
    let env = [
        ("OPKERNEL_TLS_CERT", cert.to_str().unwrap()),
        ("OPKERNEL_TLS_KEY", key.to_str().unwrap()),
    ];
    let k = KernelProcess::start(&kernel_binary().unwrap(), "pyclient-tls", &env)
        .await
        .unwrap();
    assert!(
        k.client.base().starts_with("https://"),
        "{}",
        k.client.base()
    );
    (k, ca)
}

fn operator_token(k: &KernelProcess) -> String {
    std::fs::read_to_string(k.home.join("operator.token"))
        .unwrap()
        .trim()
        .to_owned()
}

#[tokio::test]
async fn the_python_client_passes_its_suite_against_a_live_kernel() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: scripts/test.sh makes the test virtualenv",
        python.display()
    );
    let k = KernelProcess::start(&kernel_binary().unwrap(), "pyclient", &[])
        .await
        .unwrap();
    let (tls, ca) = tls_kernel().await;
    let client = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients/python");
    let env = [
        ("OPKERNEL_URL", k.client.base().to_owned()),
        ("OPKERNEL_OPERATOR_TOKEN", operator_token(&k)),
        ("OPKERNEL_TLS_URL", tls.client.base().to_owned()),
        ("OPKERNEL_TLS_OPERATOR_TOKEN", operator_token(&tls)),
        ("OPKERNEL_TLS_CA", ca.to_str().unwrap().to_owned()),
        (
            "PYTHONPATH",
            client.join("src").to_str().unwrap().to_owned(),
        ),
        ("PYTHONDONTWRITEBYTECODE", "1".to_owned()),
    ];
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
            .current_dir(&client)
            .envs(env)
            .env_remove("OPKERNEL_TOKEN")
            .env_remove("OPKERNEL_CA")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the Python client's tests failed:\n{stdout}\n{stderr}"
    );
    let summary = stdout.lines().last().unwrap_or_default();
    eprintln!("{summary}");
    assert!(
        summary.contains(&format!("{PYTHON_TESTS} passed"))
            && !summary.contains("skipped")
            && !summary.contains("error"),
        "expected {PYTHON_TESTS} passed and nothing else:\n{stdout}"
    );
    k.remove_containers();
    tls.remove_containers();
    drop(tls);
    let _ = std::fs::remove_dir_all(ca.parent().unwrap());
}
