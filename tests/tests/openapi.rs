#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The API's OpenAPI document against a live kernel (SPEC §23): it is a
//! valid OpenAPI 3.1 document (`openapi-spec-validator`), and a
//! property-based fuzzer (`schemathesis`, PyPI, from the test virtualenv)
//! sends bounded generated requests to every operation with the operator
//! token: no 5xx, and every answer's status, content type, headers and
//! body match the document (the streams too: the events stream ends once
//! idle for `idle_sec`, set to 0 for the fuzz). The frames of both streams
//! of a real op are checked against the frame schemas the document gives.

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
    let home = k.home.clone();
    let (ok, text) = tokio::task::spawn_blocking(move || {
        // in the test's home: its caches (crash reproductions) stay out of
        // the checkout
        run(Command::new(st)
            .current_dir(&home)
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
    assert!(text.contains("Tested: 58"), "{summary}");
    k.remove_containers();
}

/// The SSE frames of one stream, read until it ends, as
/// `{path, event, id, data}` (`event` null when unnamed).
async fn frames(k: &KernelProcess, path: &str, query: &str) -> Vec<serde_json::Value> {
    let text = reqwest::Client::new()
        .get(format!("{}{path}{query}", k.client.base()))
        .bearer_auth(k.client.token())
        .timeout(std::time::Duration::from_secs(60))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut out = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let field = |name: &str| {
            let lines: Vec<&str> = block
                .lines()
                .filter_map(|l| l.strip_prefix(name))
                .map(|v| v.strip_prefix(' ').unwrap_or(v))
                .collect();
            (!lines.is_empty()).then(|| lines.join("\n"))
        };
        // a keep-alive comment is no frame
        if let Some(data) = field("data:") {
            out.push(serde_json::json!({
                "path": path, "event": field("event:"), "id": field("id:"), "data": data,
            }));
        }
    }
    out
}

#[tokio::test]
async fn the_streams_send_the_frames_the_document_describes() {
    let k = KernelProcess::start(&kernel_binary().unwrap(), "openapi-frames", &[])
        .await
        .unwrap();
    let run_id = opkernel_tests::unique_run("frames");
    k.client
        .post("/v1/runs", &serde_json::json!({ "run_id": run_id }))
        .await
        .unwrap();
    let op = k
        .start_bg(
            &run_id,
            &["sh", "-c", "echo one; sleep 0.3; echo two; exit 3"],
            60,
        )
        .await
        .unwrap();
    k.wait_terminal(&op, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let console = "/v1/operations/{id}/console";
    let mut all = frames(&k, &format!("/v1/operations/{op}/console"), "").await;
    let events = frames(
        &k,
        &format!("/v1/runs/{run_id}/events/stream"),
        "?idle_sec=0",
    )
    .await;
    assert!(events.len() >= 2, "{events:?}");
    assert!(all.last().unwrap()["event"] == "done", "{all:?}");
    for f in all.iter_mut() {
        f["path"] = console.into();
    }
    all.extend(events.into_iter().map(|mut f| {
        f["path"] = "/v1/runs/{run}/events/stream".into();
        f
    }));
    let url = format!("{}/v1/openapi.json", k.client.base());
    let doc: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    let dir = k.home.join("frames");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("doc.json"), doc.to_string()).unwrap();
    std::fs::write(
        dir.join("frames.json"),
        serde_json::Value::from(all).to_string(),
    )
    .unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("openapi/check_frames.py");
    let (ok, text) = run(Command::new(python())
        .arg(script)
        .arg(dir.join("doc.json"))
        .arg(dir.join("frames.json")));
    assert!(ok, "frames off the document:\n{text}");
    assert!(text.contains("frames match the document"), "{text}");
    k.remove_containers();
}
