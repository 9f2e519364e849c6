//! Interactive ops (SPEC §25): write → echoed output through the API
//! against a `cat` with stdin, beside `docker exec -i` doing the same (a
//! kept session, and one exec per write), and what `yield_ms` costs.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

use opkernel::drills::harness::KernelProcess;
use serde_json::{json, Value};

use crate::ms;

pub struct Interactive {
    /// `write_stdin` (yield 0) until the line is back: in its answer, or
    /// in a `read_output` from the offset that answer ended at: ms.
    pub echo: Vec<f64>,
    /// A line written to a kept `docker exec -i <c> cat` until it is back.
    pub exec_session: Vec<f64>,
    /// `docker exec -i <c> cat` per line, until it is back.
    pub exec_once: Vec<f64>,
    /// A foreground `true`: answer time with `yield_ms` minus without (p50s).
    pub yield_overhead_ms: f64,
    /// A foreground `sleep 2` with `yield_ms: 100`: the answer after 100 ms.
    pub yielded_after: Vec<f64>,
    /// Echoes that did not come back.
    pub missing: usize,
}

async fn call(k: &KernelProcess, run: &str, tool: &str, body: Value) -> anyhow::Result<Value> {
    k.client
        .post(&format!("/v1/runs/{run}/tools/{tool}"), &body)
        .await
}

pub async fn measure(k: &KernelProcess, samples: usize) -> anyhow::Result<Interactive> {
    let run = "bench-interactive";
    let body = json!({"command": ["cat"], "background": true, "stdin": true, "timeout_sec": 3600});
    let op = call(k, run, "run_command", body).await?["operation_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let container = k
        .wait_state(&op, std::time::Duration::from_secs(30), |s| {
            s["status"] == "running"
        })
        .await?["container_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut out = Interactive {
        echo: vec![],
        exec_session: vec![],
        exec_once: vec![],
        yield_overhead_ms: 0.0,
        yielded_after: vec![],
        missing: 0,
    };
    for i in 0..samples {
        let line = format!("ping-{i}\n");
        let t0 = Instant::now();
        let w = json!({"operation_id": op, "text": line, "yield_ms": 0});
        let written = call(k, run, "write_stdin", w).await?;
        // the echo is in the write's own answer when it came that fast,
        // else read from where that answer ended
        let mut got = written["output"].as_str().unwrap_or_default().to_owned();
        if !got.contains(line.trim()) {
            let from = written["next_offset"].as_u64().unwrap_or(0);
            let r = json!({"operation_id": op, "offset": from, "wait_ms": 2000});
            got = call(k, run, "read_output", r).await?["output"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
        }
        if got.contains(line.trim()) {
            out.echo.push(ms(t0.elapsed()));
        } else {
            out.missing += 1;
        }
    }
    out.exec_session = exec_session(&container, samples)?;
    out.exec_once = exec_once(&container, samples.min(30))?;
    let eof = json!({"operation_id": op, "eof": true, "yield_ms": 0});
    call(k, run, "write_stdin", eof).await?;
    yields(k, run, samples.min(30), &mut out).await?;
    Ok(out)
}

/// One `docker exec -i <c> cat` kept open: a line in, until it is back.
fn exec_session(container: &str, samples: usize) -> anyhow::Result<Vec<f64>> {
    let mut child = Command::new("docker")
        .args(["exec", "-i", container, "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdin"))?;
    let mut lines = BufReader::new(
        child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?,
    );
    let mut times = Vec::new();
    let mut back = String::new();
    for i in 0..samples {
        let t0 = Instant::now();
        writeln!(stdin, "ping-{i}")?;
        stdin.flush()?;
        back.clear();
        lines.read_line(&mut back)?;
        times.push(ms(t0.elapsed()));
    }
    drop(stdin);
    child.wait()?;
    Ok(times)
}

/// `docker exec -i <c> cat` once per line.
fn exec_once(container: &str, samples: usize) -> anyhow::Result<Vec<f64>> {
    let mut times = Vec::new();
    for i in 0..samples {
        let t0 = Instant::now();
        let mut child = Command::new("docker")
            .args(["exec", "-i", container, "cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdin"))?;
        writeln!(stdin, "ping-{i}")?;
        drop(stdin);
        child.wait_with_output()?;
        times.push(ms(t0.elapsed()));
    }
    Ok(times)
}

/// What `yield_ms` adds to a foreground call that ends in time, and when
/// one that does not answers.
async fn yields(
    k: &KernelProcess,
    run: &str,
    samples: usize,
    out: &mut Interactive,
) -> anyhow::Result<()> {
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        for (yielding, times) in [(false, &mut without), (true, &mut with)] {
            let mut body = json!({"command": ["true"]});
            if yielding {
                body["yield_ms"] = json!(5000);
            }
            let t0 = Instant::now();
            call(k, run, "run_command", body).await?;
            times.push(ms(t0.elapsed()));
        }
    }
    out.yield_overhead_ms = crate::pct(&with, 50.0) - crate::pct(&without, 50.0);
    for _ in 0..samples.min(10) {
        let body = json!({"command": ["sleep", "2"], "yield_ms": 100});
        let t0 = Instant::now();
        let v = call(k, run, "run_command", body).await?;
        if v["running"] == true {
            out.yielded_after.push(ms(t0.elapsed()));
        }
    }
    Ok(())
}
