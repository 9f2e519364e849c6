//! Watching a running op until it is terminal: file events, the container
//! monitor's alarms, kill and timeout sequences, and the liveness verdicts.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox::{OpFileError, PidRecord, Signal};

use super::{mono_deadline, KillProgress, ObserverAttempt, ObserverError, Step};
use crate::kernel::Kernel;
use crate::lifecycle::{KillReason, Outcome};
use crate::probes::{ProbeFailure, Watched};

/// Removes an op from its container monitor when the attempt ends, however it ends.
struct MonitorGuard {
    kernel: Arc<Kernel>,
    container_id: String,
    op_id: String,
}

impl Drop for MonitorGuard {
    fn drop(&mut self) {
        self.kernel
            .monitors
            .unwatch(&self.container_id, &self.op_id);
    }
}

impl ObserverAttempt {
    /// Watches a running op until it is terminal.
    pub(super) async fn attach(&mut self) -> Step {
        let k = self.kernel.clone();
        let ops = k.sandbox.ops_dir(&self.op.scratch_key);
        k.watcher.watch(ops.path());
        let Some(container_id) = self.op.container_id.clone() else {
            return self
                .settle(Outcome::Lost {
                    reason: "no container was recorded for the op".into(),
                })
                .await;
        };
        if !self.confirm_container(&container_id).await? {
            return Ok(());
        }
        // both budgets count from the recorded start; measured monotonically
        let budget_start = self.op.budget_start_ms();
        self.deadline = mono_deadline(budget_start, Duration::from_secs(self.op.timeout_sec));
        self.evidence_deadline = mono_deadline(budget_start, k.config.start_evidence_window);
        let mut next_probe = k.next_tick();
        let wake = self.wake.clone();
        // the code file is read on the first pass, after every file event and
        // while killing; plain ticks leave it to the probe (a finished
        // wrapper shows up dead, and settling lost reads the code first)
        let mut read_code = true;
        let mut monitored: Option<MonitorGuard> = None;
        loop {
            let notified = wake.notified();
            if k.take_fault(&self.op.id) {
                return Err(ObserverError::Injected);
            }
            // a recorded result beats everything else
            let code = if read_code || self.kill.is_some() {
                ops.read_code(&self.op.id)
            } else {
                Err(OpFileError::Missing(String::new()))
            };
            match code {
                Ok(code) => {
                    if self.finish_with_code(code, &container_id).await? {
                        return Ok(());
                    }
                }
                Err(OpFileError::Missing(_)) => {}
                Err(bad) => {
                    // a forged or broken code file: only a dead process makes it final
                    if !self.wrapper_alive(&container_id).await? {
                        return self
                            .settle(Outcome::Lost {
                                reason: format!("exit code unusable: {bad}"),
                            })
                            .await;
                    }
                }
            }
            if self.op.pid.is_none() {
                if let Ok(rec) = ops.read_pid(&self.op.id) {
                    k.store.record_pid(&self.op.id, &rec).await?;
                    self.op.pid = Some(rec);
                }
            }
            self.reload_kill_request().await?;
            if self.kill.is_none() && Instant::now() >= self.deadline {
                // the first recorded reason wins: an earlier kill request stays a kill
                self.op = k
                    .store
                    .request_kill(&self.op.id, KillReason::Timeout)
                    .await?
                    .ok_or_else(|| ObserverError::Vanished(self.op.id.clone()))?;
                self.adopt_kill_request();
            }
            if self.kill.is_some() {
                if let Some(done) = self.advance_kill(&container_id).await? {
                    return done;
                }
            }
            // once the wrapper's identity is known the container monitor
            // watches it; until then this observer ticks itself
            if monitored.is_none() {
                if let Some(rec) = self.op.pid.clone() {
                    k.monitors.watch(
                        &k,
                        &container_id,
                        &self.op.id,
                        Watched {
                            rec,
                            wake: self.wake.clone(),
                            alarm: self.alarm.clone(),
                        },
                    );
                    monitored = Some(MonitorGuard {
                        kernel: k.clone(),
                        container_id: container_id.clone(),
                        op_id: self.op.id.clone(),
                    });
                }
            }
            let tick_due = monitored.is_none() && Instant::now() >= next_probe;
            if self.alarm.swap(false, Ordering::SeqCst) || tick_due {
                next_probe = k.next_tick();
                if let Some(done) = self.check_liveness(&container_id).await? {
                    return done;
                }
            }
            let mut wait = if monitored.is_some() {
                Duration::from_secs(3600)
            } else {
                next_probe.saturating_duration_since(Instant::now())
            };
            let recheck = std::mem::take(&mut self.code_ignored);
            if self.kill.is_some() || recheck {
                wait = wait.min(Duration::from_millis(100));
            } else {
                let to_deadline = self.deadline.saturating_duration_since(Instant::now());
                wait = wait.min(to_deadline.max(Duration::from_millis(10)));
            }
            read_code = tokio::time::timeout(wait, notified).await.is_ok() || recheck;
            tracing::debug!(op = %self.op.id, read_code, "observer woke");
        }
    }
    /// Checks the op's recorded container still is the run's container.
    async fn confirm_container(&mut self, container_id: &str) -> Result<bool, ObserverError> {
        let k = self.kernel.clone();
        match k.sandbox.inspect(container_id).await {
            Ok(info) => {
                let ok = k.sandbox.owns(&info)
                    && info
                        .labels
                        .get(sandbox::profile::LABEL_MANAGED)
                        .map(String::as_str)
                        == Some("true")
                    && info.labels.get(sandbox::profile::LABEL_RUN_ID) == Some(&self.op.run_id)
                    && info.labels.get(sandbox::profile::LABEL_SCRATCH_KEY)
                        == Some(&self.op.scratch_key);
                if !ok {
                    self.settle(Outcome::Lost {
                        reason: "the recorded container's identity cannot be confirmed".into(),
                    })
                    .await?;
                    return Ok(false);
                }
                if let Some(rec) = &self.op.pid {
                    if !info.hostname.is_empty()
                        && !rec.hostname.is_empty()
                        && rec.hostname != info.hostname
                    {
                        self.settle(Outcome::Lost {
                            reason: "the pid file belongs to another container".into(),
                        })
                        .await?;
                        return Ok(false);
                    }
                }
                k.remember_container(&info);
                Ok(true)
            }
            // gone or unreachable: the attach loop's code check and probes decide
            Err(_) => Ok(true),
        }
    }
    /// Settles the op with the code its wrapper recorded. Returns false when
    /// the code cannot be judged yet. Where commands run as root the `.ops`
    /// dir is within their reach: a code file next to a still-live,
    /// identity-checked wrapper is ignored, and once the wrapper is gone the
    /// code is believed only if the wrapper ended normally, as Docker's own
    /// record of its exec (out of the command's reach) shows.
    async fn finish_with_code(
        &mut self,
        mut code: i32,
        container_id: &str,
    ) -> Result<bool, ObserverError> {
        if self.kernel.config.profile.run_as.is_none() {
            if self.op.pid.is_some() && self.wrapper_alive(container_id).await? {
                tracing::warn!(op = %self.op.id, code, "ignoring an exit code file while the op's wrapper still runs");
                self.code_ignored = true;
                return Ok(false);
            }
            // the wrapper renames its code into place before it exits: read
            // again now that it is gone, so a value read earlier (perhaps a
            // forgery) is never the one kept
            match self
                .kernel
                .sandbox
                .ops_dir(&self.op.scratch_key)
                .read_code(&self.op.id)
            {
                Ok(fresh) => code = fresh,
                Err(_) => return Ok(false),
            }
            match self.wrapper_ended_normally(code).await {
                Ok(true) => {}
                Ok(false) => {
                    self.code_ignored = true;
                    return Ok(false);
                }
                Err(reason) => {
                    self.settle(Outcome::Lost { reason }).await?;
                    return Ok(true);
                }
            }
        }
        self.reload_kill_request().await?;
        let outcome = match self.kill {
            Some(kill) => kill.reason.outcome(code, kill.signalled),
            None => Outcome::Completed {
                exit_code: code,
                killed: false,
            },
        };
        self.settle(outcome).await?;
        Ok(true)
    }
    /// Root mode: whether the wrapper's exec ended with `code` as its own
    /// exit status (the wrapper exits with the code it recorded). `Ok(false)`
    /// while the exec still runs; `Err(reason)` when the code is not to be
    /// believed.
    async fn wrapper_ended_normally(&self, code: i32) -> Result<bool, String> {
        let Some(exec_id) = &self.op.exec_id else {
            return Err(format!(
                "exit code file says {code}, but the wrapper's end cannot be confirmed (no exec recorded); \
                 commands run as root can forge it"
            ));
        };
        match self.kernel.sandbox.exec_status(exec_id).await {
            Ok(None) => Ok(false),
            Ok(Some(status)) if status == i64::from(code) => Ok(true),
            Ok(Some(status)) => Err(format!(
                "the wrapper did not end normally (its exec exited {status}); the exit code file's {code} \
                 is not believed"
            )),
            // the daemon is unreachable: ask again (the liveness grace bounds it)
            Err(e) if e.is_unreachable() => Ok(false),
            Err(e) => Err(format!(
                "exit code file says {code}, but the wrapper's end cannot be confirmed ({e}); commands run \
                 as root can forge it"
            )),
        }
    }
    async fn reload_kill_request(&mut self) -> Step {
        if self.kill.is_some() {
            return Ok(());
        }
        if !self.kill_flag.load(Ordering::SeqCst) && self.op.kill_requested_at.is_none() {
            return Ok(());
        }
        self.reload().await?;
        self.adopt_kill_request();
        Ok(())
    }
    /// Starts the kill sequence if the op row carries a kill request.
    fn adopt_kill_request(&mut self) {
        if self.kill.is_some() {
            return;
        }
        if let (Some(_), Some(reason)) = (self.op.kill_requested_at, self.op.kill_reason) {
            self.kill = Some(KillProgress {
                reason,
                term_at: None,
                kill_at: None,
                // a signal sent before a restart still counts
                signalled: self.op.kill_signalled,
            });
        }
    }
    /// One step of TERM → grace → KILL. Returns `Some` when the op settled.
    async fn advance_kill(&mut self, container_id: &str) -> Result<Option<Step>, ObserverError> {
        let k = self.kernel.clone();
        let Some(mut kill) = self.kill else {
            return Ok(None);
        };
        let Some(rec) = self.op.pid.clone() else {
            // nothing to signal until the wrapper recorded itself
            if Instant::now() > self.evidence_deadline {
                return Ok(Some(
                    self.settle(Outcome::Lost {
                        reason: "killed before the op recorded its process".into(),
                    })
                    .await,
                ));
            }
            return Ok(None);
        };
        let signal = match (kill.term_at, kill.kill_at) {
            (None, _) => Some(Signal::Term),
            (Some(t), None) if t.elapsed() >= k.config.kill_grace => Some(Signal::Kill),
            (Some(_), Some(x)) if x.elapsed() >= k.config.kill_grace => {
                // KILL was sent a grace ago and no code came: is anything left?
                if !self.wrapper_alive(container_id).await? {
                    return Ok(Some(
                        self.settle(Outcome::Lost {
                            reason: "the process vanished without an exit code while being killed"
                                .into(),
                        })
                        .await,
                    ));
                }
                kill.kill_at = None; // send KILL again
                Some(Signal::Kill)
            }
            _ => None,
        };
        if let Some(signal) = signal {
            match self.signal(container_id, &rec, signal).await {
                Ok(hit) if !hit.is_empty() && !kill.signalled => {
                    // durable before it counts, so a restart keeps it
                    k.store.record_signalled(&self.op.id).await?;
                    kill.signalled = true;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(op = %self.op.id, %e, "signal failed; retrying"),
            }
            let now = Instant::now();
            match signal {
                Signal::Term => kill.term_at = Some(now),
                Signal::Kill => kill.kill_at = Some(now),
            }
        }
        self.kill = Some(kill);
        Ok(None)
    }
    async fn signal(
        &self,
        container_id: &str,
        rec: &PidRecord,
        signal: Signal,
    ) -> sandbox::Result<Vec<u32>> {
        let k = &self.kernel;
        let hit = k
            .sandbox
            .signal_op(container_id, &self.op.id, rec, signal)
            .await?;
        k.probes.forget(container_id);
        tracing::info!(op = %self.op.id, signal = signal.name(), pids = ?hit, "signalled op");
        Ok(hit)
    }
    async fn wrapper_alive(&self, container_id: &str) -> Result<bool, ObserverError> {
        let k = &self.kernel;
        let Some(rec) = &self.op.pid else {
            return Ok(true);
        };
        match k
            .probes
            .probe(&k.sandbox, container_id, Duration::ZERO)
            .await
        {
            Ok(procs) => Ok(procs.wrapper(&self.op.id, rec) == Some(true)),
            Err(_) => Ok(true),
        }
    }
    /// Settles the op as lost, unless its exit code is recorded by now: a
    /// recorded result beats every other evidence.
    async fn settle_lost(&mut self, container_id: &str, reason: &str) -> Step {
        let ops = self.kernel.sandbox.ops_dir(&self.op.scratch_key);
        if let Ok(code) = ops.read_code(&self.op.id) {
            if self.finish_with_code(code, container_id).await? {
                return Ok(());
            }
        }
        self.settle(Outcome::Lost {
            reason: reason.to_owned(),
        })
        .await
    }
    /// Safety-net liveness check. Returns `Some` when the op settled.
    async fn check_liveness(&mut self, container_id: &str) -> Result<Option<Step>, ObserverError> {
        let k = self.kernel.clone();
        let probe = k
            .probes
            .probe(&k.sandbox, container_id, k.config.probe_interval)
            .await;
        match probe {
            Ok(procs) => {
                self.unreachable_since = None;
                let Some(rec) = self.op.pid.clone() else {
                    let marked = procs.has_op(&self.op.id)
                        || k.probes
                            .probe(&k.sandbox, container_id, Duration::ZERO)
                            .await
                            .map_or(true, |fresh| fresh.has_op(&self.op.id));
                    if !marked && Instant::now() > self.evidence_deadline {
                        let reason = "the process vanished before recording itself";
                        return Ok(Some(self.settle_lost(container_id, reason).await));
                    }
                    return Ok(None);
                };
                let mut wrapper = procs.wrapper(&self.op.id, &rec);
                if wrapper != Some(true) {
                    // a cached snapshot may predate the wrapper: only a fresh
                    // probe is evidence that it is gone
                    match k
                        .probes
                        .probe(&k.sandbox, container_id, Duration::ZERO)
                        .await
                    {
                        Ok(fresh) => wrapper = fresh.wrapper(&self.op.id, &rec),
                        Err(_) => return Ok(None),
                    }
                }
                if wrapper == Some(true) {
                    return Ok(None);
                }
                // give a just-exiting wrapper a moment to rename its code file
                tokio::time::sleep(Duration::from_millis(50)).await;
                let reason = if wrapper == Some(false) {
                    "the process vanished without an exit code (its pid now belongs to another process)"
                } else {
                    "the process vanished without an exit code"
                };
                Ok(Some(self.settle_lost(container_id, reason).await))
            }
            Err(ProbeFailure::Gone) => {
                k.forget_container(container_id);
                Ok(Some(
                    self.settle_lost(container_id, "the container was removed")
                        .await,
                ))
            }
            Err(ProbeFailure::Stopped) => {
                k.forget_container(container_id);
                Ok(Some(
                    self.settle_lost(container_id, "the container stopped")
                        .await,
                ))
            }
            Err(ProbeFailure::Unreachable(msg)) | Err(ProbeFailure::Other(msg)) => {
                let since = *self.unreachable_since.get_or_insert_with(Instant::now);
                tracing::warn!(op = %self.op.id, %msg, "container unreachable");
                if since.elapsed() >= k.config.grace {
                    let reason = format!("container unreachable for {}s", k.config.grace.as_secs());
                    return Ok(Some(self.settle_lost(container_id, &reason).await));
                }
                Ok(None)
            }
        }
    }
}
