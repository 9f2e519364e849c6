//! Questions for a run container's resident launcher, asked through the
//! run's inbox instead of a `docker exec` round trip: the probe listing
//! (liveness) and the process table (the operator's inspect). A launcher
//! that does not answer in time (none, or one that predates a question)
//! gives `Ok(None)`: the caller asks by exec instead.

use std::time::{Duration, Instant};

use opkernel_shim::table::{parse_table, ProcessRow};

use crate::docker::Sandbox;
use crate::error::{Result, SandboxError};
use crate::opfiles::OpsDir;
use crate::profile::SHIM_MOUNT;
use crate::shim::{parse_probe, MarkedProcess};

/// The answer to the question `nonce`, once the launcher wrote it; `None`
/// after `timeout` (the question is withdrawn either way).
async fn wait_answer(ops: &OpsDir, nonce: &str, timeout: Duration) -> Option<String> {
    let answer = poll_answer(ops, nonce, timeout).await;
    ops.cancel_probe(nonce);
    answer
}

/// The launcher's answer to `nonce` once it is there; `None` after `timeout`.
async fn poll_answer(ops: &OpsDir, nonce: &str, timeout: Duration) -> Option<String> {
    let began = Instant::now();
    let mut pause = Duration::from_micros(500);
    loop {
        tokio::time::sleep(pause).await;
        if let Some(text) = ops.take_listing(nonce) {
            return Some(text);
        }
        if began.elapsed() >= timeout {
            return None;
        }
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

impl Sandbox {
    /// A probe answered by the resident launcher of the container with
    /// hostname `host` through the run's inbox (no `docker exec`).
    /// `Ok(None)`: no answer within `timeout` (no live launcher); the
    /// caller probes by exec instead.
    pub async fn probe_by_launcher(
        &self,
        scratch_key: &str,
        host: &str,
        timeout: Duration,
    ) -> Result<Option<Vec<MarkedProcess>>> {
        let ops = self.ops_dir(scratch_key);
        let nonce = ops
            .ask_probe(host)
            .map_err(|e| SandboxError::io(ops.path(), e))?;
        let Some(text) = wait_answer(&ops, &nonce, timeout).await else {
            return Ok(None);
        };
        parse_probe(&text)
            .map(Some)
            .map_err(|detail| SandboxError::Probe {
                container: scratch_key.to_owned(),
                detail,
            })
    }

    /// The process table of every marked process, answered by the
    /// launcher of `host`; `Ok(None)` as for a probe.
    pub async fn process_table_by_launcher(
        &self,
        scratch_key: &str,
        host: &str,
        timeout: Duration,
    ) -> Result<Option<Vec<ProcessRow>>> {
        let ops = self.ops_dir(scratch_key);
        let nonce = ops
            .ask_ps(host)
            .map_err(|e| SandboxError::io(ops.path(), e))?;
        let Some(text) = wait_answer(&ops, &nonce, timeout).await else {
            return Ok(None);
        };
        parse_table(&text)
            .map(Some)
            .map_err(|detail| SandboxError::Probe {
                container: scratch_key.to_owned(),
                detail,
            })
    }

    /// Hands stdin `frames` (rendered, whole) to the launcher of `host`
    /// for op `op_id` (gVisor, SPEC §30); `Ok(None)` when no answer came
    /// in `timeout`. A container without a launcher (`by_exec`: its id) has
    /// the question answered by a `docker exec` of the shim's `relay`,
    /// claimed the same way.
    pub async fn relay_stdin(
        &self,
        scratch_key: &str,
        host: &str,
        op_id: &str,
        frames: &[u8],
        timeout: Duration,
        by_exec: Option<&str>,
    ) -> Result<Option<Relayed>> {
        let ops = self.ops_dir(scratch_key);
        let nonce = ops
            .ask_stdin(host, op_id, frames)
            .map_err(|e| SandboxError::io(ops.path(), e))?;
        if let Some(container) = by_exec {
            let argv = [SHIM_MOUNT, "relay", nonce.as_str(), host].map(str::to_owned);
            let ran =
                tokio::time::timeout(timeout, self.run_helper(container, argv.to_vec())).await;
            // an exec that failed may not have run: untaken, the question
            // is withdrawn and nothing was written (the exec's stream may
            // end before its process does, so an answer is waited for
            // below, as from a launcher)
            if let Ok(Err(e)) = ran {
                if ops.withdraw_stdin(&nonce) {
                    return Err(e);
                }
            }
        }
        let mut answer = poll_answer(&ops, &nonce, timeout).await;
        if answer.is_none() {
            // withdrawn before the launcher took it: nothing was written
            if ops.withdraw_stdin(&nonce) {
                return Ok(None);
            }
            // taken: its frames are being written, never blocking; the
            // answer is waited for as long again
            answer = poll_answer(&ops, &nonce, timeout).await;
        }
        let Some(text) = answer else {
            return Ok(Some(Relayed::Unknown));
        };
        Relayed::parse(&text)
            .map(Some)
            .ok_or_else(|| SandboxError::Probe {
                container: scratch_key.to_owned(),
                detail: format!("stdin relay answered {text:?}"),
            })
    }
}

/// What the launcher did with relayed stdin frames: how many went in, and
/// why it stopped if not all did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relayed {
    /// All of them (this many).
    All(usize),
    /// This many; the FIFO is full now (the rest later).
    Full(usize),
    /// This many; the op's stdin is closed.
    Closed(usize),
    /// The launcher took the frames and did not say what it did in time:
    /// some or all may be in (a retry with the same ids applies none twice).
    Unknown,
}

impl Relayed {
    fn parse(text: &str) -> Option<Relayed> {
        let (word, n) = text.trim().split_once(' ')?;
        let n = n.parse().ok()?;
        match word {
            "ok" => Some(Relayed::All(n)),
            "full" => Some(Relayed::Full(n)),
            "closed" => Some(Relayed::Closed(n)),
            _ => None,
        }
    }
}
