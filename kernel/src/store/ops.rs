//! Op rows: insert (with idempotency), the claim that guards the only exec,
//! progress updates, kill requests and the compare-and-set terminal write.

use rusqlite::{params, Connection, OptionalExtension, Row};
use sha2::{Digest, Sha256};

use super::runs::Counted;
use super::{now_ms, Store, StoreError, StoreResult};
use crate::lifecycle::{
    live_sql, observed_sql, terminal_sql, KillReason, Outcome, Status, EFFECT_UNCERTAIN,
};

/// An op as the control plane records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub id: String,
    pub run_id: String,
    pub command: Vec<String>,
    pub background: bool,
    pub timeout_sec: u64,
    pub status: Status,
    pub attempt: u32,
    pub failed_attempts: u32,
    pub exec_claimed_at: Option<i64>,
    pub scratch_key: String,
    pub container_id: Option<String>,
    pub pid: Option<sandbox::PidRecord>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub heartbeat_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub exit_code: Option<i32>,
    pub killed: bool,
    pub kill_requested_at: Option<i64>,
    pub kill_reason: Option<KillReason>,
    /// A kill or timeout signal reached the op's processes (durable, so a
    /// kill interrupted by a restart still ends `killed`).
    pub kill_signalled: bool,
    /// A kill or timeout signal was about to be sent (written before it).
    pub kill_intent: bool,
    /// The Docker exec that ran the op's wrapper, when known.
    pub exec_id: Option<String>,
    /// When the op was handed to its container's resident launcher.
    pub handed_over_at: Option<i64>,
    pub effect: Option<String>,
    pub error: Option<String>,
    pub output_tail: Option<String>,
    pub log_sha256: Option<String>,
    pub log_size: Option<u64>,
    /// What the command's process tree used (from the shim's code record).
    pub usage: Option<sandbox::Usage>,
    /// Processes the command left behind that its shim stopped before
    /// recording the code (from the code record; 0 when none or unknown).
    pub leftovers: u32,
    pub kernel_id: Option<String>,
    pub report_id: Option<String>,
    pub delivered_inline: bool,
    /// The approval rule that held it (SPEC §16), if one did.
    pub approval_rule: Option<String>,
    pub approval_timeout_sec: Option<u64>,
    pub approval_on_timeout: Option<crate::tasks::OnTimeout>,
    pub approval_escalated_at: Option<i64>,
    /// `operator`, `timeout` or `kill` (for a denial), `operator` for an approval.
    pub approval_decided_by: Option<String>,
    pub approval_decided_at: Option<i64>,
    pub schedule_id: Option<String>,
}

impl Op {
    /// When the timeout budget started: the recorded start, else its
    /// approval (a wait for an operator is not the command's time), else
    /// its creation.
    pub fn budget_start_ms(&self) -> i64 {
        self.started_at
            .or(self
                .approval_decided_at
                .filter(|_| !matches!(self.status, Status::AwaitingApproval | Status::Denied)))
            .unwrap_or(self.created_at)
    }
}

/// Every column of an op row, in the order [`op_from_row`] does not rely on:
/// rows are read by column name.
pub(super) const COLUMNS: &str = "id, run_id, command, background, timeout_sec, status, attempt, failed_attempts, \
    exec_claimed_at, scratch_key, container_id, pid, proc_start_ticks, hostname, created_at, started_at, \
    heartbeat_at, finished_at, exit_code, killed, kill_requested_at, kill_reason, kill_signalled, kill_intent, exec_id, \
    handed_over_at, effect, error, output_tail, log_sha256, log_size, cpu_ms, max_rss_kb, leftovers, kernel_id, report_id, delivered_inline, \
    approval_rule, approval_timeout_sec, approval_on_timeout, approval_escalated_at, approval_decided_by, \
    approval_decided_at, schedule_id";

/// The one mapping of an op row (selected with [`COLUMNS`]) to an [`Op`].
pub(super) fn op_from_row(row: &Row<'_>) -> rusqlite::Result<Op> {
    let corrupt = |what: String| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, what.into())
    };
    let command: String = row.get("command")?;
    let status: String = row.get("status")?;
    let pid: Option<i64> = row.get("pid")?;
    let start: Option<i64> = row.get("proc_start_ticks")?;
    let kill_reason: Option<String> = row.get("kill_reason")?;
    Ok(Op {
        id: row.get("id")?,
        run_id: row.get("run_id")?,
        command: serde_json::from_str(&command).map_err(|e| corrupt(e.to_string()))?,
        background: row.get("background")?,
        timeout_sec: row.get::<_, i64>("timeout_sec")? as u64,
        status: Status::parse(&status).ok_or_else(|| corrupt(format!("status {status}")))?,
        attempt: row.get::<_, i64>("attempt")? as u32,
        failed_attempts: row.get::<_, i64>("failed_attempts")? as u32,
        exec_claimed_at: row.get("exec_claimed_at")?,
        scratch_key: row.get("scratch_key")?,
        container_id: row.get("container_id")?,
        pid: match (pid, start) {
            (Some(pid), Some(start)) => Some(sandbox::PidRecord {
                pid: pid as u32,
                start_ticks: start as u64,
                hostname: row
                    .get::<_, Option<String>>("hostname")?
                    .unwrap_or_default(),
            }),
            _ => None,
        },
        created_at: row.get("created_at")?,
        started_at: row.get("started_at")?,
        heartbeat_at: row.get("heartbeat_at")?,
        finished_at: row.get("finished_at")?,
        exit_code: row.get("exit_code")?,
        killed: row.get("killed")?,
        kill_requested_at: row.get("kill_requested_at")?,
        kill_reason: kill_reason.as_deref().and_then(KillReason::parse),
        kill_signalled: row.get("kill_signalled")?,
        kill_intent: row.get("kill_intent")?,
        exec_id: row.get("exec_id")?,
        handed_over_at: row.get("handed_over_at")?,
        effect: row.get("effect")?,
        error: row.get("error")?,
        output_tail: row.get("output_tail")?,
        log_sha256: row.get("log_sha256")?,
        log_size: row.get::<_, Option<i64>>("log_size")?.map(|v| v as u64),
        usage: match (
            row.get::<_, Option<i64>>("cpu_ms")?,
            row.get::<_, Option<i64>>("max_rss_kb")?,
        ) {
            (Some(cpu), Some(rss)) => Some(sandbox::Usage {
                cpu_ms: cpu as u64,
                max_rss_kb: rss as u64,
            }),
            _ => None,
        },
        leftovers: row.get::<_, i64>("leftovers")?.clamp(0, u32::MAX as i64) as u32,
        kernel_id: row.get("kernel_id")?,
        report_id: row.get("report_id")?,
        delivered_inline: row.get("delivered_inline")?,
        approval_rule: row.get("approval_rule")?,
        approval_timeout_sec: row
            .get::<_, Option<i64>>("approval_timeout_sec")?
            .map(|v| v as u64),
        approval_on_timeout: row
            .get::<_, Option<String>>("approval_on_timeout")?
            .as_deref()
            .and_then(crate::tasks::OnTimeout::parse),
        approval_escalated_at: row.get("approval_escalated_at")?,
        approval_decided_by: row.get("approval_decided_by")?,
        approval_decided_at: row.get("approval_decided_at")?,
        schedule_id: row.get("schedule_id")?,
    })
}

/// A validated start request.
#[derive(Debug, Clone)]
pub struct StartRequest {
    pub run_id: String,
    pub scratch_key: String,
    pub command: Vec<String>,
    pub background: bool,
    pub timeout_sec: u64,
    pub idempotency_key: Option<String>,
    /// Set when an approval rule matched: the op waits for an operator.
    pub approval: Option<ApprovalHold>,
    /// The schedule firing it, if one is.
    pub schedule_id: Option<String>,
}

/// Why and how an op waits for approval (SPEC §16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalHold {
    /// The pattern that matched (`*` for a run whose rules hold every op).
    pub rule: String,
    pub timeout_sec: Option<u64>,
    pub on_timeout: crate::tasks::OnTimeout,
}

impl StartRequest {
    /// What a retry under the same idempotency key must repeat exactly.
    fn fingerprint(&self) -> String {
        let body = serde_json::json!([self.command, self.background, self.timeout_sec]);
        hex::encode(Sha256::digest(body.to_string().as_bytes()))
    }
}

/// Live-op limits checked in the insert's own transaction, so concurrent
/// starts cannot pass them together.
#[derive(Debug, Clone, Copy)]
pub struct Admission {
    /// The live ops a run and its descendants may have together when the
    /// run has the kernel's default envelope (a run with its own envelope
    /// uses its `max_live_ops`).
    pub max_live_per_run: u64,
    /// Every live op of the kernel.
    pub max_live: u64,
    /// The unfinished descendant runs a run may have when it has the
    /// kernel's default envelope (else its envelope's `max_children`).
    pub max_children: u64,
    /// A run not recorded yet may be created (as a top-level run with the
    /// kernel's defaults): the operator's implicit run, never a run
    /// token's (its run is gone: purged, it must not come back unbounded).
    pub implicit_run: bool,
}

impl Admission {
    /// No limit (tests, drills and tools that write rows directly).
    pub const UNLIMITED: Admission = Admission {
        max_live_per_run: u64::MAX,
        max_live: u64::MAX,
        max_children: u64::MAX,
        implicit_run: true,
    };
}

/// The result of inserting a start.
#[derive(Debug)]
pub enum NewOp {
    Created(Op),
    /// The idempotency key was seen before with the same request.
    Existing(Op),
    /// The idempotency key was seen before with a different request.
    KeyConflict(String),
    /// A live-op limit, the run's state or a budget forbids it: nothing
    /// was inserted.
    Refused(super::Refusal),
}

/// How an observer attempt begins, for the "failed attempts in a row" count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptStart {
    /// The previous attempt (if any) did not fail.
    Clean,
    /// The previous attempt failed right after the one before it failed.
    AfterFailureInARow,
    /// The previous attempt failed after a healthy stretch: the count
    /// starts again at one.
    AfterIsolatedFailure,
}

/// The terminal write of an op.
#[derive(Debug, Clone)]
pub struct Settlement {
    pub outcome: Outcome,
    pub output_tail: Option<String>,
    pub log: Option<sandbox::LogDigest>,
    pub usage: Option<sandbox::Usage>,
    /// Processes the command left behind that the shim stopped (from the
    /// code record, with the usage).
    pub leftovers: u32,
    /// When the command ended, by its code record (unix ms); `None` when
    /// no code was recorded (then it is charged until the settlement).
    pub ended_at: Option<i64>,
    /// The most an op without a recorded end is charged (its timeout and
    /// kill sequence), so a kernel outage or a grace window is not billed.
    pub charge_cap_ms: Option<i64>,
}

/// Why a new op of `run_id` may not be admitted now, if it may not: its
/// run tree's live-op limits (the run's and every ancestor's, each over
/// its subtree), then the kernel-wide one.
fn admission_refusal(
    conn: &Connection,
    run_id: &str,
    limits: Admission,
) -> StoreResult<Option<String>> {
    if let Some(refusal) = super::runs::tree_limit_refusal(conn, run_id, Counted::Ops, limits)? {
        return Ok(Some(refusal));
    }
    // an index-only count through the partial index of live statuses
    let total: i64 = conn
        .prepare_cached(&format!(
            "SELECT COUNT(*) FROM ops WHERE status IN ({})",
            live_sql()
        ))?
        .query_row([], |r| r.get(0))?;
    let total = total as u64;
    Ok((total >= limits.max_live).then(|| {
        format!(
            "the kernel already has {total} live operations (limit {})",
            limits.max_live
        )
    }))
}

/// The event of an op's terminal write: `tool.completed` for a command
/// that ended with a code (killed or not), `tool.failed` for every other end.
fn settled_event(op: &Op) -> (&'static str, serde_json::Value) {
    let seconds = |ms: Option<i64>| ms.map(|ms| ms.max(0) as f64 / 1000.0);
    let op_seconds = seconds(op.started_at.zip(op.finished_at).map(|(s, f)| f - s));
    let cpu_seconds = seconds(op.usage.map(|u| u.cpu_ms as i64));
    match op.status {
        Status::Completed => (
            "tool.completed",
            serde_json::json!({
                "background": op.background,
                "exit_code": op.exit_code,
                "killed": op.killed,
                "op_seconds": op_seconds,
                "cpu_seconds": cpu_seconds,
            }),
        ),
        status => (
            "tool.failed",
            serde_json::json!({
                "background": op.background,
                "status": status.as_str(),
                "effect": op.effect,
                "exit_code": op.exit_code,
                "killed": op.killed,
                "error": op.error,
                "op_seconds": op_seconds,
            }),
        ),
    }
}

pub(super) fn get(conn: &Connection, id: &str) -> StoreResult<Option<Op>> {
    Ok(conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM ops WHERE id = ?1"))?
        .query_row([id], op_from_row)
        .optional()?)
}

/// Inserts a start inside the caller's transaction: the idempotency key
/// first (a retry finds its op), then admission (the run's state and
/// budgets, the live-op limits), then the row (`awaiting_approval` when the
/// request carries an approval hold, else `starting`) with its events.
/// Writes nothing unless it returns `Created`.
pub(super) fn insert_in(
    tx: &Connection,
    req: &StartRequest,
    limits: Admission,
) -> StoreResult<NewOp> {
    let request_sha = req.fingerprint();
    if let Some(key) = &req.idempotency_key {
        let seen: Option<(String, String)> = tx
            .prepare_cached(
                "SELECT id, request_sha256 FROM ops WHERE run_id = ?1 AND idempotency_key = ?2",
            )?
            .query_row(params![req.run_id, key], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        if let Some((id, sha)) = seen {
            if sha != request_sha {
                return Ok(NewOp::KeyConflict(id));
            }
            let op = get(tx, &id)?.ok_or_else(|| StoreError::Corrupt(id.clone()))?;
            return Ok(NewOp::Existing(op));
        }
    }
    let id = uuid::Uuid::new_v4().to_string();
    let now = now_ms();
    // the run's state and budgets are read in this transaction: a pause,
    // cancel or usage fact commits before or after it, whole
    if let Some(refusal) = super::runs::run_refusal(tx, &req.run_id)? {
        return Ok(NewOp::Refused(refusal));
    }
    if !limits.implicit_run && super::runs::get_run(tx, &req.run_id)?.is_none() {
        return Ok(NewOp::Refused(super::Refusal::NoRun(req.run_id.clone())));
    }
    if let Some(refusal) = admission_refusal(tx, &req.run_id, limits)? {
        return Ok(NewOp::Refused(super::Refusal::Limit(refusal)));
    }
    super::runs::ensure_top_level(tx, &req.run_id, now)?;
    // a new op reopens a finished run: its container is needed again
    tx.prepare_cached(
        "UPDATE runs SET finished_at = NULL WHERE run_id = ?1 AND finished_at IS NOT NULL",
    )?
    .execute([&req.run_id])?;
    let status = match req.approval {
        Some(_) => Status::AwaitingApproval,
        None => Status::Starting,
    };
    let hold = req.approval.as_ref();
    tx.prepare_cached(
        "INSERT INTO ops (id, run_id, command, background, timeout_sec, status, scratch_key, \
         created_at, idempotency_key, request_sha256, approval_rule, approval_timeout_sec, \
         approval_on_timeout, schedule_id) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    )?
    .execute(params![
        id,
        req.run_id,
        serde_json::to_string(&req.command).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        req.background,
        req.timeout_sec as i64,
        status.as_str(),
        req.scratch_key,
        now,
        req.idempotency_key,
        request_sha,
        hold.map(|h| h.rule.clone()),
        hold.and_then(|h| h.timeout_sec).map(|t| t as i64),
        hold.map(|h| h.on_timeout.as_str()),
        req.schedule_id,
    ])?;
    super::journal::append_event(
        tx,
        &req.run_id,
        "tool.started",
        Some(&id),
        serde_json::json!({
            "command": crate::report::bounded_argv(&req.command, crate::report::MAX_VIEW_ARGV_BYTES).0,
            "background": req.background,
            "timeout_sec": req.timeout_sec,
            "schedule_id": req.schedule_id,
        }),
    )?;
    if let Some(hold) = hold {
        super::journal::append_event(
            tx,
            &req.run_id,
            "approval.requested",
            Some(&id),
            serde_json::json!({
                "rule": hold.rule,
                "timeout_sec": hold.timeout_sec,
                "on_timeout": hold.on_timeout.as_str(),
            }),
        )?;
    }
    let op = get(tx, &id)?.ok_or_else(|| StoreError::Corrupt(id.clone()))?;
    Ok(NewOp::Created(op))
}

impl Store {
    pub async fn insert_op(&self, req: StartRequest, limits: Admission) -> StoreResult<NewOp> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let new = insert_in(&tx, &req, limits)?;
            if matches!(new, NewOp::Created(_)) {
                tx.commit()?;
            }
            Ok(new)
        })
        .await
    }

    /// Every observed (starting or running) op: id and creation time only
    /// (the watchdog's look, every few seconds, reads no command).
    pub async fn observed_op_ids(&self) -> StoreResult<Vec<(String, i64)>> {
        self.call(|conn| {
            let sql = format!(
                "SELECT id, created_at FROM ops WHERE status IN ({})",
                crate::lifecycle::observed_sql()
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    pub async fn get_op(&self, id: &str) -> StoreResult<Option<Op>> {
        let id = id.to_owned();
        self.call(move |conn| get(conn, &id)).await
    }

    /// Every op that is not terminal, oldest first.
    pub async fn live_ops(&self) -> StoreResult<Vec<Op>> {
        self.call(|conn| {
            let sql = format!(
                "SELECT {COLUMNS} FROM ops WHERE status IN ({}) ORDER BY created_at",
                observed_sql()
            );
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query_map([], op_from_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Live ops (not terminal), newest first, optionally of one run: read
    /// through the index of live statuses, whatever the table's size.
    pub async fn list_live_ops(&self, run_id: Option<String>, limit: u32) -> StoreResult<Vec<Op>> {
        self.call(move |conn| {
            let sql = format!(
                "SELECT {COLUMNS} FROM ops WHERE status IN ({}) AND (?1 IS NULL OR run_id = ?1) \
                 ORDER BY created_at DESC LIMIT ?2",
                live_sql()
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(params![run_id, limit], op_from_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Ops, newest first, optionally of one run.
    pub async fn list_ops(&self, run_id: Option<String>, limit: u32) -> StoreResult<Vec<Op>> {
        self.call(move |conn| {
            let sql = format!(
                "SELECT {COLUMNS} FROM ops WHERE (?1 IS NULL OR run_id = ?1) \
                 ORDER BY created_at DESC LIMIT ?2"
            );
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query_map(params![run_id, limit], op_from_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// The claim that guards the only exec of an op: succeeds once, for a
    /// `starting` op that was never claimed and has no kill request (a kill
    /// that arrives before the exec wins: the op never runs). The caller
    /// that wins is the only one allowed to create the exec.
    pub async fn claim_exec(
        &self,
        id: &str,
        kernel_id: &str,
        container_id: &str,
        handover: bool,
    ) -> StoreResult<bool> {
        let (id, kernel_id, container_id) =
            (id.to_owned(), kernel_id.to_owned(), container_id.to_owned());
        self.call(move |conn| {
            let now = now_ms();
            let n = conn
                .prepare_cached(
                    "UPDATE ops SET exec_claimed_at = ?2, kernel_id = ?3, container_id = ?4, \
                     attempt = MAX(attempt, 1), heartbeat_at = ?2, handed_over_at = ?5 \
                     WHERE id = ?1 AND status = 'starting' AND exec_claimed_at IS NULL \
                     AND kill_requested_at IS NULL",
                )?
                .execute(params![
                    id,
                    now,
                    kernel_id,
                    container_id,
                    handover.then_some(now)
                ])?;
            Ok(n == 1)
        })
        .await
    }

    pub async fn set_container(&self, id: &str, container_id: &str) -> StoreResult<()> {
        let (id, container_id) = (id.to_owned(), container_id.to_owned());
        self.call(move |conn| {
            conn.execute(
                "UPDATE ops SET container_id = ?2 WHERE id = ?1",
                params![id, container_id],
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
        self.call(move |conn| {
            let n = match pid {
                None => conn
                    .prepare_cached(
                        "UPDATE ops SET status = 'running', started_at = COALESCE(started_at, ?2) \
                         WHERE id = ?1 AND status = 'starting'",
                    )?
                    .execute(params![id, started_at])?,
                Some(rec) => conn
                    .prepare_cached(
                        "UPDATE ops SET status = 'running', started_at = COALESCE(started_at, ?2), \
                         pid = ?3, proc_start_ticks = ?4, hostname = ?5 \
                         WHERE id = ?1 AND status = 'starting'",
                    )?
                    .execute(params![
                        id,
                        started_at,
                        rec.pid,
                        rec.start_ticks as i64,
                        rec.hostname
                    ])?,
            };
            Ok(n == 1)
        })
        .await
    }

    /// Clears the count of failed observer attempts (an attempt stayed healthy).
    pub async fn reset_failed_attempts(&self, id: &str) -> StoreResult<()> {
        let id = id.to_owned();
        self.call(move |conn| {
            conn.execute(
                "UPDATE ops SET failed_attempts = 0 WHERE id = ?1 AND failed_attempts > 0",
                [id],
            )?;
            Ok(())
        })
        .await
    }

    /// Records the Docker exec that runs the op's wrapper.
    pub async fn record_exec(&self, id: &str, exec_id: &str) -> StoreResult<()> {
        let (id, exec_id) = (id.to_owned(), exec_id.to_owned());
        self.call(move |conn| {
            conn.execute(
                "UPDATE ops SET exec_id = ?2 WHERE id = ?1",
                params![id, exec_id],
            )?;
            Ok(())
        })
        .await
    }

    /// Records that a kill or timeout signal is about to be sent.
    pub async fn record_kill_intent(&self, id: &str) -> StoreResult<()> {
        let id = id.to_owned();
        self.call(move |conn| {
            conn.execute(
                "UPDATE ops SET kill_intent = 1 WHERE id = ?1 AND kill_intent = 0",
                [id],
            )?;
            Ok(())
        })
        .await
    }

    /// Records that a kill or timeout signal reached the op's processes.
    pub async fn record_signalled(&self, id: &str) -> StoreResult<()> {
        let id = id.to_owned();
        self.call(move |conn| {
            conn.execute(
                "UPDATE ops SET kill_signalled = 1 WHERE id = ?1 AND kill_signalled = 0",
                [id],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn record_pid(&self, id: &str, rec: &sandbox::PidRecord) -> StoreResult<()> {
        let (id, rec) = (id.to_owned(), rec.clone());
        self.call(move |conn| {
            conn.execute(
                "UPDATE ops SET pid = ?2, proc_start_ticks = ?3, hostname = ?4 WHERE id = ?1",
                params![id, rec.pid, rec.start_ticks as i64, rec.hostname],
            )?;
            Ok(())
        })
        .await
    }

    /// Records a kill request (durably, so it survives a restart). The first
    /// reason is kept. Returns the op as it is now.
    pub async fn request_kill(&self, id: &str, reason: KillReason) -> StoreResult<Option<Op>> {
        let id = id.to_owned();
        self.call(move |conn| {
            conn.execute(
                &format!(
                    "UPDATE ops SET kill_requested_at = ?2, kill_reason = ?3 \
                     WHERE id = ?1 AND kill_requested_at IS NULL AND status IN ({})",
                    observed_sql()
                ),
                params![id, now_ms(), reason.as_str()],
            )?;
            get(conn, &id)
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
        self.call(move |conn| {
            conn.execute(
                &format!(
                    "UPDATE ops SET attempt = attempt + 1, failed_attempts = {failed}, \
                     kernel_id = ?2, heartbeat_at = ?3 WHERE id = ?1 AND status IN ({})",
                    observed_sql()
                ),
                params![id, kernel_id, now_ms()],
            )?;
            Ok(get(conn, &id)?.filter(|op| op.status.is_observed()))
        })
        .await
    }

    /// The compare-and-set terminal write: only a non-terminal row changes.
    /// Returns whether this writer won.
    /// A won write also appends the op's usage fact to the ledger and its
    /// `tool.completed` or `tool.failed` event, in the same transaction.
    pub async fn settle(&self, id: &str, s: Settlement) -> StoreResult<bool> {
        let id = id.to_owned();
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let (exit_code, killed, effect, error) = match &s.outcome {
                Outcome::Completed { exit_code, killed } => (Some(*exit_code), *killed, None, None),
                Outcome::TimedOut { exit_code, killed } => {
                    (*exit_code, *killed, Some(EFFECT_UNCERTAIN), None)
                }
                Outcome::Lost { reason } => (None, false, Some(EFFECT_UNCERTAIN), Some(reason.clone())),
                Outcome::Failed { error, killed } => (None, *killed, None, Some(error.clone())),
            };
            let now = now_ms();
            let n = tx.prepare_cached(
                &format!(
                    "UPDATE ops SET status = ?2, exit_code = ?3, killed = ?4, effect = ?5, error = ?6, \
                     output_tail = ?7, log_sha256 = ?8, log_size = ?9, finished_at = ?10, \
                     cpu_ms = ?11, max_rss_kb = ?12, leftovers = ?13 \
                     WHERE id = ?1 AND status IN ({})",
                    observed_sql()
                ))?.execute(
                params![
                    id,
                    s.outcome.status().as_str(),
                    exit_code,
                    killed,
                    effect,
                    error,
                    s.output_tail,
                    s.log.as_ref().map(|l| l.sha256.clone()),
                    s.log.as_ref().map(|l| l.size as i64),
                    now,
                    s.usage.map(|u| u.cpu_ms as i64),
                    s.usage.map(|u| u.max_rss_kb as i64),
                    s.leftovers as i64,
                ],
            )?;
            if n != 1 {
                return Ok(false);
            }
            let op = get(&tx, &id)?.ok_or_else(|| StoreError::Corrupt(id.clone()))?;
            let wall = op.started_at.map(|start| match s.ended_at {
                Some(end) => end.min(now) - start,
                None => (now - start).min(s.charge_cap_ms.unwrap_or(i64::MAX)),
            });
            let cpu = op.usage.map(|u| u.cpu_ms as i64);
            super::journal::record_op_usage(&tx, &op.run_id, &id, wall, cpu)?;
            let (kind, data) = settled_event(&op);
            super::journal::append_event(&tx, &op.run_id, kind, Some(&id), data)?;
            super::schedules::finalize_in(&tx, &op)?;
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    /// Marks a foreground op's result as handed to its caller directly.
    pub async fn mark_delivered_inline(&self, id: &str) -> StoreResult<()> {
        let id = id.to_owned();
        self.call(move |conn| {
            conn.execute(
                &format!(
                    "UPDATE ops SET delivered_inline = 1 WHERE id = ?1 AND report_id IS NULL \
                     AND status IN ({})",
                    terminal_sql()
                ),
                [id],
            )?;
            Ok(())
        })
        .await
    }

    /// Refreshes `heartbeat_at` of every live op this kernel observes.
    pub async fn heartbeat(&self, kernel_id: &str) -> StoreResult<usize> {
        let kernel_id = kernel_id.to_owned();
        self.call(move |conn| {
            Ok(conn.execute(
                &format!(
                    "UPDATE ops SET heartbeat_at = ?2 WHERE kernel_id = ?1 AND status IN ({})",
                    observed_sql()
                ),
                params![kernel_id, now_ms()],
            )?)
        })
        .await
    }

    pub async fn register_kernel(&self, kernel_id: &str) -> StoreResult<()> {
        let kernel_id = kernel_id.to_owned();
        self.call(move |conn| {
            conn.execute(
                "INSERT OR REPLACE INTO kernels (id, started_at) VALUES (?1, ?2)",
                params![kernel_id, now_ms()],
            )?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_store;

    fn req(key: Option<&str>, cmd: &str) -> StartRequest {
        StartRequest {
            run_id: "r1".into(),
            scratch_key: "k".into(),
            command: vec!["sh".into(), "-c".into(), cmd.into()],
            background: true,
            timeout_sec: 60,
            idempotency_key: key.map(str::to_owned),
            approval: None,
            schedule_id: None,
        }
    }

    async fn created(store: &Store, r: StartRequest) -> Op {
        match store.insert_op(r, Admission::UNLIMITED).await.unwrap() {
            NewOp::Created(op) => op,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn idempotency_key_returns_the_same_op_or_conflicts() {
        let store = test_store();
        let op = created(&store, req(Some("k1"), "true")).await;
        match store
            .insert_op(req(Some("k1"), "true"), Admission::UNLIMITED)
            .await
            .unwrap()
        {
            NewOp::Existing(again) => assert_eq!(again.id, op.id),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            store
                .insert_op(req(Some("k1"), "false"), Admission::UNLIMITED)
                .await
                .unwrap(),
            NewOp::KeyConflict(_)
        ));
        let other = created(&store, req(None, "true")).await;
        assert_ne!(other.id, op.id);
    }

    #[tokio::test]
    async fn admission_is_checked_in_the_insert_and_retries_pass_it() {
        let store = test_store();
        let one = Admission {
            max_live_per_run: 1,
            max_live: 10,
            max_children: 1,
            implicit_run: true,
        };
        let NewOp::Created(a) = store.insert_op(req(Some("k1"), "true"), one).await.unwrap() else {
            panic!()
        };
        // the retry of an admitted start finds its op, limit or not
        match store.insert_op(req(Some("k1"), "true"), one).await.unwrap() {
            NewOp::Existing(again) => assert_eq!(again.id, a.id),
            other => panic!("{other:?}"),
        }
        match store.insert_op(req(Some("k2"), "true"), one).await.unwrap() {
            NewOp::Refused(why) => assert!(why.to_string().contains("limit 1"), "{why}"),
            other => panic!("{other:?}"),
        }
        // concurrent starts cannot pass the limit together
        let store2 = test_store();
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let s = store2.clone();
                tokio::spawn(async move { s.insert_op(req(None, "true"), one).await.unwrap() })
            })
            .collect();
        let mut created = 0;
        for t in tasks {
            created += matches!(t.await.unwrap(), NewOp::Created(_)) as usize;
        }
        assert_eq!(created, 1);
    }

    #[tokio::test]
    async fn a_kill_before_the_claim_wins() {
        let store = test_store();
        let op = created(&store, req(None, "true")).await;
        store.request_kill(&op.id, KillReason::Kill).await.unwrap();
        assert!(!store.claim_exec(&op.id, "k", "c1", false).await.unwrap());
        let row = store.get_op(&op.id).await.unwrap().unwrap();
        assert_eq!(row.exec_claimed_at, None, "nothing may be executed");
    }

    #[tokio::test]
    async fn exec_claim_is_won_once() {
        let store = test_store();
        let op = created(&store, req(None, "true")).await;
        assert!(store.claim_exec(&op.id, "k", "c1", false).await.unwrap());
        assert!(!store.claim_exec(&op.id, "k", "c2", true).await.unwrap());
        let row = store.get_op(&op.id).await.unwrap().unwrap();
        assert_eq!((row.attempt, row.container_id.as_deref()), (1, Some("c1")));
        assert!(store.mark_running(&op.id, 5).await.unwrap());
        assert!(!store.mark_running(&op.id, 6).await.unwrap());
        assert_eq!(
            store.get_op(&op.id).await.unwrap().unwrap().started_at,
            Some(5)
        );
    }

    #[tokio::test]
    async fn first_terminal_writer_wins() {
        let store = test_store();
        let op = created(&store, req(None, "true")).await;
        let usage = sandbox::Usage {
            cpu_ms: 1500,
            max_rss_kb: 4096,
        };
        let done = |outcome| Settlement {
            outcome,
            output_tail: None,
            log: None,
            usage: Some(usage),
            leftovers: 3,
            ended_at: None,
            charge_cap_ms: None,
        };
        assert!(store
            .settle(
                &op.id,
                done(Outcome::Completed {
                    exit_code: 0,
                    killed: false
                })
            )
            .await
            .unwrap());
        assert!(!store
            .settle(&op.id, done(Outcome::Lost { reason: "x".into() }))
            .await
            .unwrap());
        let row = store.get_op(&op.id).await.unwrap().unwrap();
        assert_eq!(
            (row.status, row.exit_code, row.effect, row.usage),
            (Status::Completed, Some(0), None, Some(usage))
        );
        assert_eq!(row.leftovers, 3, "the leftovers its shim stopped");
        assert!(store
            .begin_attempt(&op.id, "k", AttemptStart::Clean)
            .await
            .unwrap()
            .is_none());
        assert!(store
            .request_kill(&op.id, KillReason::Kill)
            .await
            .unwrap()
            .unwrap()
            .kill_requested_at
            .is_none());
    }

    #[tokio::test]
    async fn lost_is_uncertain_and_has_no_exit_code() {
        let store = test_store();
        let op = created(&store, req(None, "true")).await;
        let s = Settlement {
            outcome: Outcome::Lost {
                reason: "gone".into(),
            },
            output_tail: None,
            log: None,
            usage: None,
            leftovers: 0,
            ended_at: None,
            charge_cap_ms: None,
        };
        assert!(store.settle(&op.id, s).await.unwrap());
        let row = store.get_op(&op.id).await.unwrap().unwrap();
        assert_eq!(row.exit_code, None);
        assert_eq!(row.effect.as_deref(), Some(EFFECT_UNCERTAIN));
    }
}
