//! The executor of the decision core: gathers each step's evidence, asks
//! [`decide::next`], carries out the action, until the op is settled.

use std::sync::Arc;
use std::time::Instant;

use sandbox::{OpFileError, OpResult, OpsDir, PidRecord, Signal};

use super::decide::{
    self, Action, Clock, CodeFile, ContainerFacts, Evidence, Handover, Kill, LaunchEnd, Probe,
    ProbeView, ShimProcess, Start, State, Timing,
};
use super::{ObserverAttempt, ObserverError, Step};
use crate::lifecycle::{KillReason, Outcome, Status};
use crate::runtime::inbox::{Wake, Wakes};
use crate::runtime::kernel::Kernel;
use crate::runtime::probes::{ProbeFailure, Watched};

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

fn read_code(ops: &OpsDir, op_id: &str) -> CodeFile {
    match ops.read_code(op_id) {
        Ok(OpResult::Exited(record)) => CodeFile::Recorded(record.code),
        Ok(OpResult::NotStarted(reason)) => CodeFile::NotStarted(reason),
        Err(OpFileError::Missing(_)) => CodeFile::Missing,
        Err(bad) => CodeFile::Unusable(bad.to_string()),
    }
}

impl ObserverAttempt {
    /// Watches a claimed op until it is terminal.
    /// Every step but the wait is boxed: the attempt's task, which each
    /// live op holds while it waits, keeps only the loop's own state (a
    /// step's future lives on the heap for the step's length).
    pub(super) async fn watch(&mut self) -> Step {
        let k = self.kernel.clone();
        let ops = k.backend.ops_dir(&self.op.scratch_key);
        k.watcher.watch(ops.path());
        let Some(mut container_id) = self.op.container_id.clone() else {
            return Box::pin(self.settle(Outcome::Lost {
                reason: "no container was recorded for the op".into(),
            }))
            .await;
        };
        // an attempt that did not launch the op attaches to a container
        // someone else recorded: check it is still the op's
        if !self.launched {
            if let Some(outcome) = Box::pin(self.confirm_container(&container_id)).await {
                return Box::pin(self.settle(outcome)).await;
            }
        }
        let clock = self.clock();
        let mut s = self.initial_state(&clock);
        let mut monitored: Option<MonitorGuard> = None;
        let mut e = Box::pin(self.gather(&mut s, &ops, self.inbox.take())).await?;
        loop {
            if monitored.is_none() {
                monitored = self.monitor(&s, &container_id);
            }
            let action = decide::next(&s, &e);
            tracing::trace!(op = %self.op.id, ?action, "observer step");
            match action {
                Action::Settle(outcome) => return Box::pin(self.settle(outcome)).await,
                Action::ConfirmStart => {
                    let pid_file = e.pid_file.clone().filter(|_| s.pid.is_none());
                    if !Box::pin(self.confirm_start(&mut s, &clock, pid_file)).await? {
                        return Ok(());
                    }
                }
                Action::RecordPid(rec) => Box::pin(self.record_pid(&mut s, rec)).await?,
                Action::RequestTimeout => Box::pin(self.request_timeout(&mut s)).await?,
                Action::Signal { signal, rec } => {
                    Box::pin(self.signal(&mut s, &container_id, &rec, signal)).await?;
                    // the step's probe predates the signal
                    e.probe = None;
                }
                Action::Probe { fresh } => {
                    Box::pin(self.probe_step(&mut s, &mut e, &ops, &container_id, fresh)).await
                }
                Action::AskLaunchEnd => {
                    e.launch_end = Some(Box::pin(self.launch_end()).await);
                    e.code = read_code(&ops, &self.op.id);
                }
                Action::Withdraw => {
                    s.handover = self.withdraw(&ops);
                    // a claim that beat the withdrawal shows in the files
                    e.code = read_code(&ops, &self.op.id);
                    e.pid_file = ops.read_pid(&self.op.id).ok();
                }
                Action::LaunchByExec => {
                    if !Box::pin(self.launch_by_exec(&mut s, &clock)).await? {
                        return Ok(());
                    }
                    // the exec may have gone to a fresh container (the
                    // recorded one had vanished): probe and signal that one
                    if let Some(now) = self.op.container_id.clone() {
                        if now != container_id {
                            k.probes.forget(&container_id);
                            monitored = None;
                            container_id = now;
                        }
                    }
                    e = Box::pin(self.gather(&mut s, &ops, self.inbox.take())).await?;
                }
                Action::Wait(limit) => {
                    // measured from the step's clock reading, not from now
                    let wakes = self.inbox.wait(limit.saturating_sub(e.now.elapsed())).await;
                    e = Box::pin(self.gather(&mut s, &ops, wakes)).await?;
                }
            }
        }
    }

    /// Records the pid file's identity as the op's.
    async fn record_pid(&mut self, s: &mut State, rec: sandbox::PidRecord) -> Step {
        self.kernel.store.record_pid(&self.op.id, &rec).await?;
        self.op.pid = Some(rec.clone());
        s.pid = Some(rec);
        Ok(())
    }

    /// The supervision's one clock reading (taken by its first watch, after
    /// any launch recorded its times), carried to now.
    fn clock(&self) -> Clock {
        self.anchor
            .get_or_init(|| Clock {
                wall_ms: crate::store::now_ms(),
                mono: Instant::now(),
            })
            .at(Instant::now())
    }

    /// A probe, then a fresh read of the files: what they say was written
    /// while the probe ran, so it counts before the probe's verdict.
    async fn probe_step(
        &self,
        s: &mut State,
        e: &mut Evidence,
        ops: &OpsDir,
        container_id: &str,
        fresh: bool,
    ) {
        let probe = self.probe(container_id, fresh, s.pid.as_ref()).await;
        s.observe(&probe, e.now);
        e.probe = Some(probe);
        e.code = read_code(ops, &self.op.id);
        if s.pid.is_none() {
            e.pid_file = ops.read_pid(&self.op.id).ok();
        }
    }

    /// The attempt's starting state, from the row and the attempt's one
    /// clock reading.
    fn initial_state(&self, clock: &Clock) -> State {
        let k = &self.kernel;
        let start = match self.op.status {
            Status::Starting => Start::Unconfirmed,
            _ => Start::Confirmed,
        };
        let timing = Timing {
            kill_grace: k.config.ops.kill_grace,
            grace: k.config.ops.grace,
            start_evidence: k.config.ops.start_evidence_window,
        };
        let claimed = self.op.exec_claimed_at.unwrap_or(self.op.created_at);
        // a request filed for the launcher, and no exec made since
        let handover = match (start, self.op.handed_over_at, &self.op.exec_id) {
            // never later than a full claim window from now, whatever the
            // wall clock did while the kernel was down
            (Start::Unconfirmed, Some(at), None) => Some(Handover::Pending {
                claim_by: clock.instant(at).min(clock.mono) + k.config.ops.launcher_claim,
            }),
            _ => None,
        };
        State {
            start,
            handover,
            pid: self.op.pid.clone(),
            kill: self.recorded_kill(),
            root_mode: k.config.profile.runs_as_root(),
            timeout_at: self.timeout_at(clock),
            evidence_by: decide::evidence_deadline(clock, claimed, timing.evidence_window(start)),
            next_tick: k.next_tick(),
            unreachable_since: None,
            timing,
        }
    }

    /// The op's timeout, counted from its recorded start.
    fn timeout_at(&self, clock: &Clock) -> Instant {
        let budget_ms = self.op.timeout_sec.saturating_mul(1000) as i64;
        clock.instant(self.op.budget_start_ms().saturating_add(budget_ms))
    }

    /// The kill request the row carries, as this attempt takes it up.
    fn recorded_kill(&self) -> Option<Kill> {
        self.op.kill_requested_at?;
        Some(
            Kill::adopt(self.op.kill_reason?, self.op.kill_signalled)
                .with_intent(self.op.kill_intent),
        )
    }

    /// The cheap facts of a step. A drill's fault fails the attempt here; a
    /// kill wake makes the attempt take up the recorded request.
    async fn gather(
        &mut self,
        s: &mut State,
        ops: &OpsDir,
        wakes: Wakes,
    ) -> Result<Evidence, ObserverError> {
        if wakes.has(Wake::Abandon) {
            return Err(ObserverError::Abandoned);
        }
        if wakes.has(Wake::Fault) {
            return Err(ObserverError::Injected);
        }
        if wakes.has(Wake::Panic) {
            // a drill's real panic: the attempt's task unwinds, as a bug's would
            panic!("drill: observer panic for op {}", self.op.id);
        }
        if wakes.has(Wake::Kill) && s.kill.is_none() {
            self.reload().await?;
            s.kill = self.recorded_kill();
        }
        let now = Instant::now();
        let mut e = Evidence::new(now, wakes, read_code(ops, &self.op.id));
        if s.pid.is_none() {
            e.pid_file = ops.read_pid(&self.op.id).ok();
            e.tick = now >= s.next_tick;
            if e.tick {
                s.next_tick = self.kernel.next_tick();
            }
        }
        Ok(e)
    }

    /// Hands the op to its container's monitor once its wrapper's identity
    /// is known; until then the attempt ticks itself.
    fn monitor(&self, s: &State, container_id: &str) -> Option<MonitorGuard> {
        let rec = s.pid.clone()?;
        let k = &self.kernel;
        k.monitors.watch(
            container_id,
            &self.op.id,
            Watched {
                rec,
                inbox: self.inbox.clone(),
            },
        );
        Some(MonitorGuard {
            kernel: k.clone(),
            container_id: container_id.to_owned(),
            op_id: self.op.id.clone(),
        })
    }

    /// Checks the op's recorded container still is the run's container;
    /// `Some(outcome)` when it is not. Gone or unreachable: the probes decide.
    async fn confirm_container(&self, container_id: &str) -> Option<Outcome> {
        let k = &self.kernel;
        let info = k.backend.inspect(container_id).await.ok()?;
        let label = |name: &str| info.labels.get(name).map(String::as_str);
        let facts = ContainerFacts {
            identity_matches: k.backend.owns(&info)
                && label(sandbox::profile::LABEL_MANAGED) == Some("true")
                && (label(sandbox::profile::LABEL_RUN_ID) == Some(self.op.run_id.as_str())
                    && label(sandbox::profile::LABEL_SCRATCH_KEY)
                        == Some(self.op.scratch_key.as_str())
                    || k.pool.bound_run(&info.id).as_deref() == Some(self.op.run_id.as_str())),
            hostname: info.hostname.clone(),
        };
        let verdict = decide::judge_container(&facts, self.op.pid.as_ref());
        if verdict.is_none() {
            k.remember_container(&info);
        }
        verdict
    }

    /// Evidence showed the unconfirmed start happened: the row becomes
    /// `running`, started at its claim. False when the op is terminal.
    /// A pid file that showed the start is recorded in the same write.
    async fn confirm_start(
        &mut self,
        s: &mut State,
        clock: &Clock,
        pid_file: Option<PidRecord>,
    ) -> Result<bool, ObserverError> {
        let claimed = self.op.exec_claimed_at.unwrap_or(self.op.created_at);
        let won = self
            .kernel
            .store
            .mark_running_with_pid(&self.op.id, claimed, pid_file.clone())
            .await?;
        if won {
            let waited_ms = crate::store::now_ms() - self.op.requested_at_ms();
            self.kernel.store.metrics().op_running(waited_ms);
            self.op.status = Status::Running;
            self.op.started_at.get_or_insert(claimed);
            if let Some(rec) = pid_file {
                self.op.pid = Some(rec.clone());
                s.pid = Some(rec);
            }
        } else {
            self.reload().await?;
            if self.op.status.is_terminal() {
                return Ok(false);
            }
        }
        s.start = Start::Confirmed;
        s.handover = None;
        s.timeout_at = self.timeout_at(clock);
        Ok(true)
    }

    /// Asks for the op's request back from the launcher's inbox. An I/O
    /// error leaves who holds it unknown: the start-evidence rule decides.
    /// (Two renames in the run's inbox: done inline, like the reads of the
    /// op's files.)
    fn withdraw(&self, ops: &OpsDir) -> Option<Handover> {
        match ops.withdraw(&self.op.id) {
            Ok(handback) => {
                tracing::info!(op = %self.op.id, ?handback, "asked the launcher's inbox for the request back");
                Some(Handover::after_withdraw(handback))
            }
            Err(e) => {
                tracing::warn!(op = %self.op.id, %e, "cannot withdraw the request; the evidence decides");
                None
            }
        }
    }

    /// Starts by `docker exec` an op whose request came back unclaimed
    /// (nothing ran). False when the op was settled meanwhile.
    async fn launch_by_exec(
        &mut self,
        s: &mut State,
        clock: &Clock,
    ) -> Result<bool, ObserverError> {
        let k = self.kernel.clone();
        let Some((identity, profile)) = self.run_target().await? else {
            return Ok(false);
        };
        let Some(container_id) = self.op.container_id.clone() else {
            return Err(ObserverError::Vanished(self.op.id.clone()));
        };
        let _gate = k.launch_gate(&self.op.run_id).await;
        if !self
            .launch_claimed(&identity, &profile, container_id)
            .await?
        {
            return Ok(false);
        }
        self.reload().await?;
        s.handover = None;
        if self.op.status == Status::Running {
            s.start = Start::Confirmed;
            s.timeout_at = self.timeout_at(clock);
        }
        Ok(!self.op.status.is_terminal())
    }

    /// Records a timeout kill request; the first recorded reason wins.
    async fn request_timeout(&mut self, s: &mut State) -> Step {
        self.op = self
            .kernel
            .store
            .request_kill(&self.op.id, KillReason::Timeout)
            .await?
            .ok_or_else(|| ObserverError::Vanished(self.op.id.clone()))?;
        s.kill = self.recorded_kill();
        if s.kill.is_none() {
            // the row must carry the request now; without it the step would repeat
            return Err(ObserverError::Vanished(self.op.id.clone()));
        }
        Ok(())
    }

    /// Sends one signal of the kill sequence. A signal that reached a
    /// process is made durable before it counts, so a restart keeps it.
    async fn signal(
        &self,
        s: &mut State,
        container_id: &str,
        rec: &PidRecord,
        signal: Signal,
    ) -> Step {
        let k = &self.kernel;
        // the intent is durable before the first signal can land
        if let Some(kill) = s.kill.as_mut().filter(|kill| !kill.intent) {
            k.store.record_kill_intent(&self.op.id).await?;
            kill.intent = true;
        }
        let hit = match k
            .backend
            .signal_op(container_id, &self.op.id, rec, signal)
            .await
        {
            Ok(pids) => {
                tracing::info!(op = %self.op.id, signal = signal.name(), ?pids, "signalled op");
                !pids.is_empty()
            }
            Err(e) => {
                tracing::warn!(op = %self.op.id, %e, "signal failed; retrying");
                false
            }
        };
        k.probes.forget(container_id);
        if let Some(kill) = s.kill {
            if hit && !kill.signalled {
                k.store.record_signalled(&self.op.id).await?;
            }
            s.kill = Some(kill.sent(signal, Instant::now(), hit));
        }
        Ok(())
    }

    /// A probe of the container, reduced to what it says about this op.
    async fn probe(&self, container_id: &str, fresh: bool, pid: Option<&PidRecord>) -> Probe {
        let k = &self.kernel;
        let max_age = if fresh {
            std::time::Duration::ZERO
        } else {
            k.config.ops.probe_interval
        };
        let view = match k
            .probes
            .probe(k.backend.as_ref(), container_id, max_age)
            .await
        {
            Ok(snap) => ProbeView::Seen {
                shim: match pid.map(|rec| snap.shim(&self.op.id, rec)) {
                    None => ShimProcess::Unknown,
                    Some(Some(true)) => ShimProcess::Alive,
                    Some(Some(false)) => ShimProcess::PidReused,
                    Some(None) => ShimProcess::Absent,
                },
                marked: snap.has_op(&self.op.id),
            },
            Err(failure @ (ProbeFailure::Gone | ProbeFailure::Stopped)) => {
                k.forget_container(container_id);
                if failure == ProbeFailure::Gone {
                    ProbeView::Gone
                } else {
                    ProbeView::Stopped
                }
            }
            Err(ProbeFailure::Unreachable(msg) | ProbeFailure::Other(msg)) => {
                tracing::warn!(op = %self.op.id, %msg, "container unreachable");
                ProbeView::Unreachable(msg)
            }
        };
        Probe { view, fresh }
    }

    /// How the wrapper's launch ended, per the backend's own record.
    async fn launch_end(&self) -> LaunchEnd {
        let Some(launch_id) = &self.op.exec_id else {
            return LaunchEnd::NotRecorded;
        };
        match self.kernel.backend.launch_status(launch_id).await {
            Ok(None) => LaunchEnd::Running,
            Ok(Some(status)) => LaunchEnd::Exited(status),
            Err(e) if e.is_unreachable() => LaunchEnd::Unreachable,
            Err(e) => LaunchEnd::Unconfirmable(e.to_string()),
        }
    }
}
