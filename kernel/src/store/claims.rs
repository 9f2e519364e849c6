//! The observer's writes to an op row: the claim that guards the only
//! exec, the start's evidence (container, pid, running), the exec record,
//! kill requests and the kill's durable intent and signals, and attempts.
//! Each is one statement or one short transaction, compare-and-set where
//! two writers can meet.

use super::hints::HintKind;
use super::ops::{get, AttemptStart, Op};
use super::{now_ms, Store, StoreResult};
use crate::lifecycle::{observed_sql, KillReason};
use crate::vals;

impl Store {
    /// The claim that guards the only exec of an op: succeeds once, for a
    /// `starting` op that was never claimed and has no kill request (a kill
    /// that arrives before the exec wins: the op never runs). The caller
    /// that wins is the only one allowed to create the exec.
    ///
    /// On a cluster node, `fence` (the node and its epoch) also holds the
    /// claim to the node's own ops while its lease is live at that epoch,
    /// judged inside the statement on the database's clock (SPEC §20).
    pub async fn claim_exec(
        &self,
        id: &str,
        kernel_id: &str,
        container_id: &str,
        (handover, fence): (bool, Option<(String, i64)>),
    ) -> StoreResult<bool> {
        let (id, kernel_id, container_id) =
            (id.to_owned(), kernel_id.to_owned(), container_id.to_owned());
        self.write(move |tx| {
            let now = now_ms();
            let fenced = match &fence {
                Some(_) => super::nodes::claim_fence(tx),
                None => String::new(),
            };
            let sql = format!(
                "UPDATE ops SET exec_claimed_at = ?2, kernel_id = ?3, container_id = ?4, \
                 attempt = CASE WHEN attempt > 1 THEN attempt ELSE 1 END, heartbeat_at = ?2, \
                 handed_over_at = ?5 \
                 WHERE id = ?1 AND status = 'starting' AND exec_claimed_at IS NULL \
                 AND kill_requested_at IS NULL{fenced}"
            );
            let mut params =
                vals![&id, now, &kernel_id, &container_id, handover.then_some(now)].to_vec();
            if let Some((node, epoch)) = &fence {
                params.extend(vals![node, *epoch].iter().cloned());
            }
            Ok(tx.execute(&sql, &params)? == 1)
        })
        .await
    }

    /// Records the container an op is launched in, after its launch found
    /// the registry's container gone and made it afresh.
    pub async fn set_container(&self, id: &str, container_id: &str) -> StoreResult<()> {
        let (id, container_id) = (id.to_owned(), container_id.to_owned());
        self.write(move |tx| {
            tx.execute(
                "UPDATE ops SET container_id = ?2 WHERE id = ?1",
                vals![&id, &container_id],
            )?;
            Ok(())
        })
        .await
    }

    /// `starting` → `running`, recording when the command started.
    pub async fn mark_running(&self, id: &str, started_at: i64) -> StoreResult<bool> {
        self.mark_running_with_pid(id, started_at, None).await
    }

    /// `starting` → `running`, with the wrapper's identity when its pid file
    /// is what showed the start (one write instead of two). False when the
    /// op was not `starting` (then nothing changed).
    pub async fn mark_running_with_pid(
        &self,
        id: &str,
        started_at: i64,
        pid: Option<sandbox::PidRecord>,
    ) -> StoreResult<bool> {
        let id = id.to_owned();
        self.write(move |tx| {
            let n = match &pid {
                None => tx.execute(
                    "UPDATE ops SET status = 'running', started_at = COALESCE(started_at, ?2) \
                     WHERE id = ?1 AND status = 'starting'",
                    vals![&id, started_at],
                )?,
                Some(rec) => tx.execute(
                    "UPDATE ops SET status = 'running', started_at = COALESCE(started_at, ?2), \
                     pid = ?3, proc_start_ticks = ?4, hostname = ?5 \
                     WHERE id = ?1 AND status = 'starting'",
                    vals![
                        &id,
                        started_at,
                        rec.pid,
                        rec.start_ticks as i64,
                        &rec.hostname
                    ],
                )?,
            };
            Ok(n == 1)
        })
        .await
    }

    /// Clears the count of failed observer attempts (an attempt stayed healthy).
    pub async fn reset_failed_attempts(&self, id: &str) -> StoreResult<()> {
        let id = id.to_owned();
        self.write(move |tx| {
            tx.execute(
                "UPDATE ops SET failed_attempts = 0 WHERE id = ?1 AND failed_attempts > 0",
                vals![&id],
            )?;
            Ok(())
        })
        .await
    }

    /// Records the Docker exec that runs the op's wrapper.
    ///
    /// False when the op is no longer `starting` (settled meanwhile, as a
    /// sweep of this node's lapsed lease does): then it is not started.
    pub async fn record_exec(&self, id: &str, exec_id: &str) -> StoreResult<bool> {
        let (id, exec_id) = (id.to_owned(), exec_id.to_owned());
        self.write(move |tx| {
            let n = tx.execute(
                "UPDATE ops SET exec_id = ?2 WHERE id = ?1 AND status = 'starting'",
                vals![&id, &exec_id],
            )?;
            Ok(n == 1)
        })
        .await
    }

    /// Records that a kill or timeout signal is about to be sent.
    pub async fn record_kill_intent(&self, id: &str) -> StoreResult<()> {
        let id = id.to_owned();
        self.write(move |tx| {
            tx.execute(
                "UPDATE ops SET kill_intent = 1 WHERE id = ?1 AND kill_intent = 0",
                vals![&id],
            )?;
            Ok(())
        })
        .await
    }

    /// Records that a kill or timeout signal reached the op's processes.
    pub async fn record_signalled(&self, id: &str) -> StoreResult<()> {
        let id = id.to_owned();
        self.write(move |tx| {
            tx.execute(
                "UPDATE ops SET kill_signalled = 1 WHERE id = ?1 AND kill_signalled = 0",
                vals![&id],
            )?;
            Ok(())
        })
        .await
    }

    /// Records the wrapper's identity (pid, start ticks, hostname) from its
    /// `.pid` file: what every later probe and signal is checked against.
    pub async fn record_pid(&self, id: &str, rec: &sandbox::PidRecord) -> StoreResult<()> {
        let (id, rec) = (id.to_owned(), rec.clone());
        self.write(move |tx| {
            tx.execute(
                "UPDATE ops SET pid = ?2, proc_start_ticks = ?3, hostname = ?4 WHERE id = ?1",
                vals![&id, rec.pid, rec.start_ticks as i64, &rec.hostname],
            )?;
            Ok(())
        })
        .await
    }

    /// Records a kill request (durably, so it survives a restart). The first
    /// reason is kept. Returns the op as it is now.
    pub async fn request_kill(&self, id: &str, reason: KillReason) -> StoreResult<Option<Op>> {
        let id = id.to_owned();
        self.write(move |tx| {
            let n = tx.execute(
                &format!(
                    "UPDATE ops SET kill_requested_at = ?2, kill_reason = ?3 \
                     WHERE id = ?1 AND kill_requested_at IS NULL AND status IN ({})",
                    observed_sql()
                ),
                vals![&id, now_ms(), reason.as_str()],
            )?;
            let op = get(tx, &id)?;
            if let Some(op) = op.as_ref().filter(|_| n == 1) {
                super::hints::notify_in(tx, op.node.as_deref(), HintKind::Kill, &id)?;
            }
            Ok(op)
        })
        .await
    }

    /// Starts the next observer attempt: bumps `attempt`, counts failed
    /// attempts in a row (an isolated failure starts the count again) and
    /// records the observing kernel. Returns the op, or `None` if it is
    /// already terminal.
    pub async fn begin_attempt(
        &self,
        id: &str,
        kernel_id: &str,
        start: AttemptStart,
    ) -> StoreResult<Option<Op>> {
        let (id, kernel_id) = (id.to_owned(), kernel_id.to_owned());
        let failed = match start {
            AttemptStart::Clean => "failed_attempts",
            AttemptStart::AfterFailureInARow => "failed_attempts + 1",
            AttemptStart::AfterIsolatedFailure => "1",
        };
        self.write(move |tx| {
            tx.execute(
                &format!(
                    "UPDATE ops SET attempt = attempt + 1, failed_attempts = {failed}, \
                     kernel_id = ?2, heartbeat_at = ?3 WHERE id = ?1 AND status IN ({})",
                    observed_sql()
                ),
                vals![&id, &kernel_id, now_ms()],
            )?;
            Ok(get(tx, &id)?.filter(|op| op.status.is_observed()))
        })
        .await
    }
}
