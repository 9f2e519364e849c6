//! Op rows: the typed row and its columns, what a start request, an
//! attempt and a settlement carry, and the reads of ops. The transaction
//! scripts that write them are `admit`, `claims` and `settle`.

use rusqlite::{params, Connection, OptionalExtension, Row};
use sha2::{Digest, Sha256};

pub use super::admission::Admission;
use super::{now_ms, Store, StoreResult};
use crate::lifecycle::{live_sql, observed_sql, KillReason, Outcome, Status};

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
    pub approval_on_timeout: Option<crate::runs::OnTimeout>,
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
            .and_then(crate::runs::OnTimeout::parse),
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

pub use crate::approval::ApprovalHold;

impl StartRequest {
    /// What a retry under the same idempotency key must repeat exactly.
    pub(super) fn fingerprint(&self) -> String {
        let body = serde_json::json!([self.command, self.background, self.timeout_sec]);
        hex::encode(Sha256::digest(body.to_string().as_bytes()))
    }
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

pub(super) fn get(conn: &Connection, id: &str) -> StoreResult<Option<Op>> {
    Ok(conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM ops WHERE id = ?1"))?
        .query_row([id], op_from_row)
        .optional()?)
}

impl Store {
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

    /// Every op that is not terminal (held for approval included), oldest
    /// first: what keeps a container from the reaper.
    pub async fn live_ops(&self) -> StoreResult<Vec<Op>> {
        self.ops_in(live_sql()).await
    }

    /// Every op an observer watches (`starting`, `running`), oldest first:
    /// what recovery attaches to.
    pub async fn observed_ops(&self) -> StoreResult<Vec<Op>> {
        self.ops_in(observed_sql()).await
    }

    async fn ops_in(&self, statuses: String) -> StoreResult<Vec<Op>> {
        self.call(move |conn| {
            let sql = format!(
                "SELECT {COLUMNS} FROM ops WHERE status IN ({statuses}) ORDER BY created_at"
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
#[path = "ops_tests.rs"]
mod tests;
