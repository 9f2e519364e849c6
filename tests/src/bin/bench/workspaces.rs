//! Workspaces (SPEC §26): a large file up and down through the files API
//! beside `docker cp` both ways, the kernel's memory meanwhile (streamed:
//! it must not grow with the file), and forks of a 200 MiB workspace with
//! the first command in each fork.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use futures::StreamExt;
use opkernel::drills::harness::KernelProcess;
use reqwest::Method;
use serde_json::json;

use crate::{ms, scale, BENCH_ENV};

pub struct Workspaces {
    /// The file moved each way: MiB.
    pub file_mib: u64,
    /// `PUT /v1/runs/{run}/files/…` of the file: seconds.
    pub upload_sec: f64,
    /// `GET` of it back: seconds.
    pub download_sec: f64,
    /// `docker cp` of the same file into the container: seconds.
    pub docker_cp_in_sec: f64,
    /// `docker cp` out of it: seconds.
    pub docker_cp_out_sec: f64,
    /// Kernel peak RSS over its RSS before the transfers: MB.
    pub rss_growth_mb: f64,
    /// Transfers whose bytes did not come back the same (0 or 1).
    pub corrupt: usize,
    /// The forked workspace: MiB.
    pub fork_mib: u64,
    /// `POST /v1/runs` with `fork_from` until it answers: ms.
    pub fork: Vec<f64>,
    /// The first command (`true`) in each fork until it answers: ms.
    pub fork_first_command: Vec<f64>,
}

/// A digest of a byte stream (FNV-1a over 8-byte words), enough to tell
/// whether bytes came back as they went.
#[derive(Default)]
struct Digest {
    hash: u64,
    tail: Vec<u8>,
    len: u64,
}

impl Digest {
    fn update(&mut self, bytes: &[u8]) {
        self.len += bytes.len() as u64;
        self.tail.extend_from_slice(bytes);
        let whole = self.tail.len() / 8 * 8;
        for word in self.tail[..whole].chunks_exact(8) {
            let w = u64::from_le_bytes(word.try_into().unwrap_or_default());
            self.hash = (self.hash ^ w).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.tail.drain(..whole);
    }

    fn finish(mut self) -> (u64, u64) {
        let rest = std::mem::take(&mut self.tail);
        for b in rest {
            self.hash = (self.hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        (self.hash, self.len)
    }
}

/// Writes `mib` MiB of xorshift bytes to `path`; their digest.
fn make_file(path: &Path, mib: u64) -> anyhow::Result<(u64, u64)> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let (mut x, mut digest) = (0x9e37_79b9_7f4a_7c15_u64, Digest::default());
    let mut block = vec![0u8; 1 << 20];
    for _ in 0..mib {
        for word in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes());
        }
        digest.update(&block);
        out.write_all(&block)?;
    }
    out.flush()?;
    Ok(digest.finish())
}

/// The file's bytes as a streamed request body.
fn file_body(path: &Path) -> anyhow::Result<reqwest::Body> {
    let file = std::fs::File::open(path)?;
    let chunks = futures::stream::unfold(file, |mut file| async move {
        use std::io::Read;
        let mut buf = vec![0u8; 1 << 20];
        match file.read(&mut buf) {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(buf), file))
            }
            Err(e) => Some((Err(e), file)),
        }
    });
    Ok(reqwest::Body::wrap_stream(chunks))
}

async fn fg(k: &KernelProcess, run: &str, script: &str) -> anyhow::Result<serde_json::Value> {
    let body = json!({"command": ["sh", "-c", script], "timeout_sec": 600});
    let v = k
        .client
        .post(&format!("/v1/runs/{run}/tools/run_command"), &body)
        .await?;
    anyhow::ensure!(v["exit_code"] == 0, "{script}: {v}");
    Ok(v)
}

fn docker(args: &[&str]) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let out = Command::new("docker").args(args).output()?;
    anyhow::ensure!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(t0.elapsed().as_secs_f64())
}

pub async fn measure(bin: &Path, quick: bool) -> anyhow::Result<Workspaces> {
    let k = KernelProcess::start(bin, "bench-files", BENCH_ENV).await?;
    let run = "bench-files";
    let first = fg(&k, run, "true").await?;
    let container = first["container_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let file_mib = if quick { 256 } else { 1024 };
    let local = k.home.join("bench-file");
    let (hash, len) = make_file(&local, file_mib)?;
    let pid = k
        .pid()
        .ok_or_else(|| anyhow::anyhow!("the kernel has no pid"))?;
    let before = scale::status_kb(pid, "VmRSS")? as f64 / 1024.0;
    let path = format!("/v1/runs/{run}/files/scratch/big.bin");
    let t0 = Instant::now();
    k.client
        .raw(Method::PUT, &path, Some(file_body(&local)?))
        .await?;
    let upload_sec = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let mut back = Digest::default();
    let mut body = k.client.raw(Method::GET, &path, None).await?.bytes_stream();
    while let Some(chunk) = body.next().await {
        back.update(&chunk?);
    }
    let download_sec = t0.elapsed().as_secs_f64();
    let rss_growth_mb = scale::peak_rss_mb(pid)? - before;
    let corrupt = usize::from(back.finish() != (hash, len));
    let local_s = local.display().to_string();
    let docker_cp_in_sec = docker(&["cp", &local_s, &format!("{container}:/scratch/cp.bin")])?;
    let out = k.home.join("bench-file-out");
    let out_s = out.display().to_string();
    let docker_cp_out_sec = docker(&["cp", &format!("{container}:/scratch/cp.bin"), &out_s])?;
    for f in [&local, &out] {
        let _ = std::fs::remove_file(f);
    }
    fg(&k, run, "rm -f big.bin cp.bin").await?;
    let (fork, fork_first_command) = forks(&k, if quick { 3 } else { 10 }).await?;
    Ok(Workspaces {
        file_mib,
        upload_sec,
        download_sec,
        docker_cp_in_sec,
        docker_cp_out_sec,
        rss_growth_mb,
        corrupt,
        fork_mib: FORK_MIB,
        fork,
        fork_first_command,
    })
}

/// The forked workspace's size.
const FORK_MIB: u64 = 200;

/// `samples` forks of a run holding [`FORK_MIB`] MiB, and the first
/// command in each.
async fn forks(k: &KernelProcess, samples: usize) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let source = "bench-fork-source";
    let fill = format!("dd if=/dev/urandom of=data bs=1048576 count={FORK_MIB} 2>/dev/null");
    fg(k, source, &fill).await?;
    let (mut fork, mut first) = (Vec::new(), Vec::new());
    for i in 0..samples {
        let run = format!("bench-fork-{i}");
        let t0 = Instant::now();
        let body = json!({"run_id": run, "fork_from": source});
        k.client.post("/v1/runs", &body).await?;
        fork.push(ms(t0.elapsed()));
        let t0 = Instant::now();
        fg(k, &run, "true").await?;
        first.push(ms(t0.elapsed()));
        // the copy goes with its run's container and scratch
        k.client
            .post(&format!("/v1/runs/{run}/cancel"), &json!({}))
            .await?;
    }
    Ok((fork, first))
}

impl Workspaces {
    /// Its figures, as the JSON line prints them.
    pub fn figures(&self) -> serde_json::Value {
        let p50 = |v: &[f64]| crate::pct(v, 50.0);
        json!({
            "files_mib": self.file_mib,
            "files_upload_sec": self.upload_sec,
            "files_download_sec": self.download_sec,
            "files_docker_cp_in_sec": self.docker_cp_in_sec,
            "files_docker_cp_out_sec": self.docker_cp_out_sec,
            "files_kernel_rss_growth_mb": self.rss_growth_mb,
            "files_corrupt": self.corrupt,
            "fork_mib": self.fork_mib,
            "fork_p50_ms": p50(&self.fork),
            "fork_first_command_p50_ms": p50(&self.fork_first_command),
        })
    }

    /// Its readable lines.
    pub fn print(&self) {
        let rate = |secs: f64| self.file_mib as f64 / secs;
        println!(
            "files: {} MiB up {:.2}s ({:.0} MiB/s; docker cp in {:.2}s), down {:.2}s ({:.0} MiB/s; docker cp out {:.2}s); kernel peak RSS grew {:.1} MB; corrupt {}",
            self.file_mib,
            self.upload_sec,
            rate(self.upload_sec),
            self.docker_cp_in_sec,
            self.download_sec,
            rate(self.download_sec),
            self.docker_cp_out_sec,
            self.rss_growth_mb,
            self.corrupt
        );
        crate::row(&format!("fork of {} MiB", self.fork_mib), &self.fork);
        crate::row("1st cmd in a fork", &self.fork_first_command);
    }
}
