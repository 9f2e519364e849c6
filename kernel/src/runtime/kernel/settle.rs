//! Settlement of an op on the kernel's side: the compare-and-set terminal
//! write with the final log's digest, tail and usage, then the handover
//! files' removal and the run's wake-up.

use crate::lifecycle::Outcome;
use crate::report_text::cut_tail;
use crate::store::{Op, Settlement};

use super::Kernel;

impl Kernel {
    /// The compare-and-set terminal write, with the final log's digest and
    /// tail. Wakes report waiters when it won.
    pub async fn settle(
        &self,
        op: &Op,
        outcome: Outcome,
    ) -> Result<bool, crate::store::StoreError> {
        let ops = self.backend.ops_dir(&op.scratch_key);
        let id = op.id.clone();
        // an op settled while its request may wait in a launcher's inbox
        // (lost by evidence, three failed attempts, a foreign container):
        // take the request back first, so nothing runs after the verdict
        if op.handed_over_at.is_some() && op.exec_id.is_none() && op.started_at.is_none() {
            if let Err(e) = ops.withdraw(&op.id) {
                tracing::warn!(op = %op.id, %e, "cannot take the request back before settling");
            }
        }
        let has_log = !matches!(outcome, Outcome::Failed { .. });
        // usage comes with a code from the code file, never without one
        let has_code = matches!(
            outcome,
            Outcome::Completed { .. }
                | Outcome::TimedOut {
                    exit_code: Some(_),
                    ..
                }
        );
        let (tail, digest, recorded) = tokio::task::spawn_blocking(move || {
            if !has_log {
                return (None, None, (None, 0, None));
            }
            let tail_max = crate::report_text::TAIL_BYTES as u64 * 2;
            let summary = ops.log_digest(&id, tail_max);
            let recorded = match has_code.then(|| ops.read_code_written(&id)) {
                Some(Ok((result, written))) => (result.usage(), result.leftovers(), written),
                _ => (None, 0, None),
            };
            match summary {
                Ok((digest, tail)) => (Some(cut_tail(&tail)), Some(digest), recorded),
                // a log unreadable to its end may still show its end
                Err(_) => {
                    let tail = ops.log_tail(&id, tail_max).ok();
                    (tail.map(|(bytes, _)| cut_tail(&bytes)), None, recorded)
                }
            }
        })
        .await
        .unwrap_or((None, None, (None, 0, None)));
        let (usage, leftovers, ended_at) = recorded;
        // an op without a recorded end ran at most until its deadline and
        // the kill sequence after it (a longer outage is not its use)
        let charge_cap_ms = (op.timeout_sec.saturating_mul(1000)
            + 2 * self.config.ops.kill_grace.as_millis() as u64) as i64;
        let won = self
            .store
            .settle(
                &op.id,
                Settlement {
                    outcome: outcome.clone(),
                    output_tail: tail,
                    log: digest,
                    usage,
                    leftovers,
                    ended_at,
                    charge_cap_ms: Some(charge_cap_ms),
                },
            )
            .await?;
        // terminal now (by this write or an earlier one): the handover
        // files have done their job and leave the inbox (SPEC §21)
        if let Err(e) = self.backend.ops_dir(&op.scratch_key).clear_handover(&op.id) {
            tracing::warn!(op = %op.id, %e, "handover files not removed; the sweep retries");
        }
        if won {
            tracing::info!(op = %op.id, run = %op.run_id, ?outcome, "op settled");
            self.bump_run(&op.run_id);
        }
        Ok(won)
    }
}
