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
use crate::shim::{parse_probe, MarkedProcess};

/// The answer to the question `nonce`, once the launcher wrote it; `None`
/// after `timeout` (the question is withdrawn either way).
async fn wait_answer(ops: &OpsDir, nonce: &str, timeout: Duration) -> Option<String> {
    let began = Instant::now();
    let mut pause = Duration::from_micros(500);
    loop {
        tokio::time::sleep(pause).await;
        if let Some(text) = ops.take_listing(nonce) {
            ops.cancel_probe(nonce);
            return Some(text);
        }
        if began.elapsed() >= timeout {
            ops.cancel_probe(nonce);
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
}
