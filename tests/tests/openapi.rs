#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The API's OpenAPI document against a live kernel (SPEC §23): it is a
//! valid OpenAPI 3.1 document (`openapi-spec-validator`), and a
//! property-based fuzzer (`schemathesis`, PyPI, from the test virtualenv)
//! sends bounded generated requests to every operation with the operator
//! token: no 5xx, and every answer's status, content type, headers and
//! body match the document. The streams (SSE) are left out of the fuzz:
//! they never end by design.

use std::path::PathBuf;
use std::process::Command;

use opkernel::drills::harness::{kernel_binary, KernelProcess};

fn python() -> PathBuf {
    let python = match std::env::var_os("OPKERNEL_MCP_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-venv/bin/python"),
    };
    assert!(
        python.exists(),
        "{} is missing: scripts/test.sh makes the test virtualenv",
        python.display()
    );
    python
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn the_document_is_valid_and_the_api_keeps_to_it_under_fuzzing() {
    let k = KernelProcess::start(&kernel_binary().unwrap(), "openapi", &[])
        .await
        .unwrap();
    let url = format!("{}/v1/openapi.json", k.client.base());
    let doc: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let file = k.home.join("openapi.json");
    std::fs::write(&file, doc.to_string()).unwrap();
    let python = python();
    let (ok, text) = run(Command::new(&python)
        .args(["-m", "openapi_spec_validator"])
        .arg(&file));
    assert!(ok, "openapi-spec-validator: {text}");

    let st = python.with_file_name("schemathesis");
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("openapi/schemathesis.toml");
    let base = k.client.base().to_owned();
    let token = k.client.token().to_owned();
    let (ok, text) = tokio::task::spawn_blocking(move || {
        run(Command::new(st)
            .arg("--config-file")
            .arg(config)
            .args(["run", &format!("{base}/v1/openapi.json")])
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .args([
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,\
                 response_schema_conformance,response_headers_conformance",
                "--max-examples",
                "20",
                "--request-timeout",
                "20",
                "--seed",
                "20261202",
                "--exclude-path-regex",
                "/(stream|console)$",
                "--no-color",
            ]))
    })
    .await
    .unwrap();
    let summary: String = text
        .lines()
        .skip_while(|l| !l.contains("SUMMARY"))
        .collect::<Vec<_>>()
        .join("\n");
    eprintln!("{summary}");
    assert!(ok, "schemathesis found failures:\n{text}");
    assert!(text.contains("Tested: 40"), "{summary}");
    k.remove_containers();
}
