//! One run token trying to exhaust the kernel: 20 concurrent readers of a
//! 64 MiB log and 200 SSE console clients, while another run starts
//! commands. Measures the kernel's peak RSS and the other run's start reply
//! before and during the load.

use std::time::{Duration, Instant};

use futures::StreamExt;
use opkernel::drills::harness::KernelProcess;

use crate::{ms, pct};

pub struct Abuse {
    pub log_bytes_each: u64,
    pub readers: usize,
    pub sse_clients: usize,
    /// Readers that could not read the whole log, and console clients that
    /// could not connect or whose stream broke: each one counted (a reader
    /// that failed loads nothing, and the figures would flatter the kernel).
    pub reader_failures: usize,
    pub sse_failures: usize,
    pub start_p50_before_ms: f64,
    pub start_p50_during_ms: f64,
    pub peak_rss_mb: f64,
}

async fn start_replies(k: &KernelProcess, run: &str, n: usize) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        k.start_bg(run, &["true"], 60).await?;
        out.push(ms(t.elapsed()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(out)
}

pub async fn measure(k: &KernelProcess) -> anyhow::Result<Abuse> {
    let token = std::fs::read_to_string(k.home.join("operator.token"))?
        .trim()
        .to_owned();
    let http = reqwest::Client::new();
    let base = k.client.base().to_owned();
    let big = k
        .start_bg(
            "bench-abuse",
            &[
                "sh",
                "-c",
                "dd if=/dev/zero bs=1048576 count=64 2>/dev/null",
            ],
            600,
        )
        .await?;
    let big_end = k.wait_terminal(&big, Duration::from_secs(120)).await?;
    let log_size = big_end["log_size"]
        .as_u64()
        .filter(|&n| n > 0)
        .ok_or_else(|| anyhow::anyhow!("the big op recorded no log size: {big_end}"))?;
    let chatty = k
        .start_bg(
            "bench-abuse",
            &[
                "sh",
                "-c",
                "for i in $(seq 1 300); do echo tick $i; sleep 0.1; done",
            ],
            600,
        )
        .await?;
    k.start_bg("bench-other", &["true"], 60).await?;
    let before = start_replies(k, "bench-other", 20).await?;

    // each console client: whether it connected and its stream never broke
    let mut consoles = Vec::new();
    for _ in 0..200 {
        let (http, url, token) = (
            http.clone(),
            format!("{base}/v1/operations/{chatty}/console"),
            token.clone(),
        );
        consoles.push(tokio::spawn(async move {
            let Ok(resp) = http.get(url).bearer_auth(token).send().await else {
                return false;
            };
            if !resp.status().is_success() {
                return false;
            }
            let mut body = resp.bytes_stream();
            let until = Instant::now() + Duration::from_secs(20);
            while Instant::now() < until {
                match tokio::time::timeout(Duration::from_secs(1), body.next()).await {
                    Ok(Some(Ok(_))) | Err(_) => {}
                    Ok(Some(Err(_))) => return false,
                    Ok(None) => break,
                }
            }
            true
        }));
    }
    // each log reader: the bytes it read (the whole log, or it failed)
    let mut readers = Vec::new();
    for _ in 0..20 {
        let (http, url, token) = (
            http.clone(),
            format!("{base}/v1/operations/{big}/log"),
            token.clone(),
        );
        readers.push(tokio::spawn(async move {
            let resp = http.get(url).bearer_auth(token).send().await.ok()?;
            if !resp.status().is_success() {
                return None;
            }
            let mut n = 0u64;
            let mut body = resp.bytes_stream();
            while let Some(chunk) = body.next().await {
                n += chunk.ok()?.len() as u64;
                // a slow reader: the kernel must not buffer for it
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Some(n)
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = start_replies(k, "bench-other", 20).await?;
    let mut log_bytes_each = u64::MAX;
    let mut reader_failures = 0;
    for t in readers {
        match t.await? {
            Some(n) if n == log_size => log_bytes_each = log_bytes_each.min(n),
            _ => reader_failures += 1,
        }
    }
    let mut sse_failures = 0;
    for t in consoles {
        sse_failures += usize::from(!t.await?);
    }
    let pid = k
        .pid()
        .ok_or_else(|| anyhow::anyhow!("kernel not running"))?;
    Ok(Abuse {
        log_bytes_each: if log_bytes_each == u64::MAX {
            0
        } else {
            log_bytes_each
        },
        readers: 20,
        sse_clients: 200,
        reader_failures,
        sse_failures,
        start_p50_before_ms: pct(&before, 50.0),
        start_p50_during_ms: pct(&during, 50.0),
        peak_rss_mb: crate::scale::peak_rss_mb(pid)?,
    })
}
