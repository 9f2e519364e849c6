//! Egress (SPEC §27): what the kernel's proxy costs a connection (a small
//! HTTP request through it, beside the same request made directly on an
//! open network) and one large download through it, beside the same
//! download made directly. Both sides run `curl` in a run container; the
//! server is the tests' own outside container.

use std::path::Path;

use opkernel::drills::harness::KernelProcess;
use opkernel_tests::outside::Outside;
use serde_json::{json, Value};

use crate::{pct, row, BENCH_ENV};

const DEBIAN: &str = "opkernel-sandbox:debian";

pub struct Egress {
    /// One small request through the proxy (curl's `time_total`): ms.
    pub proxied: Vec<f64>,
    /// The same, directly on an open network: ms.
    pub direct: Vec<f64>,
    /// The download's size: MiB.
    pub download_mib: u64,
    /// Through the proxy, directly: seconds.
    pub download_proxied_sec: f64,
    pub download_direct_sec: f64,
    /// Requests or downloads that did not answer 200 with every byte.
    pub bad: usize,
}

/// A foreground script's output (it must exit 0).
async fn sh(k: &KernelProcess, run: &str, script: &str) -> anyhow::Result<String> {
    let body = json!({"command": ["bash", "-c", script], "timeout_sec": 600});
    let v = k
        .client
        .post(&format!("/v1/runs/{run}/tools/run_command"), &body)
        .await?;
    anyhow::ensure!(v["exit_code"] == 0, "{script}: {v}");
    Ok(v["output"].as_str().unwrap_or_default().to_owned())
}

/// `n` small requests to `url`: each one's time in ms, and how many did
/// not answer 200.
async fn requests(
    k: &KernelProcess,
    run: &str,
    url: &str,
    n: usize,
) -> anyhow::Result<(Vec<f64>, usize)> {
    let script = format!(
        "for i in $(seq {n}); do curl -s -o /dev/null -w '%{{http_code}} %{{time_total}}\\n' {url}; done"
    );
    let said = sh(k, run, &script).await?;
    let (mut times, mut bad) = (Vec::new(), 0);
    for line in said.lines() {
        match line.split_once(' ') {
            Some(("200", t)) => times.push(t.parse::<f64>()? * 1000.0),
            _ => bad += 1,
        }
    }
    Ok((times, bad + n.saturating_sub(said.lines().count())))
}

/// One download of `bytes` from `base`: seconds, and whether it was whole.
async fn download(
    k: &KernelProcess,
    run: &str,
    base: &str,
    bytes: u64,
) -> anyhow::Result<(f64, bool)> {
    let script = format!(
        "curl -s -o /dev/null -w '%{{http_code}} %{{size_download}} %{{time_total}}' {base}/bytes/{bytes}"
    );
    let said = sh(k, run, &script).await?;
    let parts: Vec<&str> = said.split_whitespace().collect();
    let whole = parts.first() == Some(&"200") && parts.get(1) == Some(&bytes.to_string().as_str());
    let secs = parts
        .get(2)
        .and_then(|t| t.parse().ok())
        .unwrap_or(f64::NAN);
    Ok((secs, whole))
}

/// Measures on a kernel whose open network is the outside's own.
pub async fn measure(bin: &Path, quick: bool) -> anyhow::Result<Egress> {
    let outside = Outside::start(DEBIAN)?;
    let hosts = outside.hosts();
    let mut env = BENCH_ENV.to_vec();
    env.extend([
        ("OPKERNEL_IMAGE", DEBIAN),
        ("OPKERNEL_EGRESS_HOSTS", hosts.as_str()),
        ("OPKERNEL_NETWORK", outside.network.as_str()),
    ]);
    let k = KernelProcess::start(bin, "bench-egress", &env).await?;
    let proxied = "bench-egress-proxied";
    let body =
        json!({"run_id": proxied, "envelope": {"network": {"allow": ["outside.test:8080"]}}});
    k.client.post("/v1/runs", &body).await?;
    let direct = "bench-egress-direct";
    let n = if quick { 50 } else { 200 };
    // one request each first: the containers made, the proxy started
    requests(&k, proxied, "http://outside.test:8080/", 1).await?;
    let direct_url = format!("http://{}:8080", outside.ip);
    requests(&k, direct, &direct_url, 1).await?;
    let (p, bad_p) = requests(&k, proxied, "http://outside.test:8080/", n).await?;
    let (d, bad_d) = requests(&k, direct, &direct_url, n).await?;
    let mib = if quick { 64 } else { 256 };
    let (dp, whole_p) = download(&k, proxied, "http://outside.test:8080", mib << 20).await?;
    let (dd, whole_d) = download(&k, direct, &direct_url, mib << 20).await?;
    Ok(Egress {
        proxied: p,
        direct: d,
        download_mib: mib,
        download_proxied_sec: dp,
        download_direct_sec: dd,
        bad: bad_p + bad_d + usize::from(!whole_p) + usize::from(!whole_d),
    })
}

impl Egress {
    pub fn figures(&self) -> Value {
        json!({
            "egress_request_proxied_p50_ms": pct(&self.proxied, 50.0),
            "egress_request_proxied_p90_ms": pct(&self.proxied, 90.0),
            "egress_request_direct_p50_ms": pct(&self.direct, 50.0),
            "egress_proxy_cost_p50_ms": pct(&self.proxied, 50.0) - pct(&self.direct, 50.0),
            "egress_download_mib": self.download_mib,
            "egress_download_proxied_sec": self.download_proxied_sec,
            "egress_download_direct_sec": self.download_direct_sec,
            "egress_failed_requests": self.bad,
        })
    }

    pub fn print(&self) {
        row("request via egress proxy", &self.proxied);
        row("request direct (open net)", &self.direct);
        let mbps = |s: f64| self.download_mib as f64 / s;
        println!(
            "egress: proxy cost per connection p50 {:+.2} ms; {} MiB download through the proxy {:.2}s ({:.0} MiB/s), direct {:.2}s ({:.0} MiB/s); failed {}",
            pct(&self.proxied, 50.0) - pct(&self.direct, 50.0),
            self.download_mib,
            self.download_proxied_sec,
            mbps(self.download_proxied_sec),
            self.download_direct_sec,
            mbps(self.download_direct_sec),
            self.bad
        );
    }
}
