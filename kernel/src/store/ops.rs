//! Op rows: the typed row and its columns, what a start request, an
//! attempt and a settlement carry, and the reads of ops. The transaction
//! scripts that write them are `admit`, `claims` and `settle`.

use sha2::{Digest, Sha256};

pub use super::admission::Admission;
use super::db::{Row, Tx, Value};
use super::{now_ms, Store, StoreError, StoreResult};
use crate::lifecycle::{live_sql, observed_sql, KillReason, Outcome, Status};
use crate::vals;

/// An op as the control plane records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// The op's id, a lowercase UUID.
    pub id: String,
    /// The run it belongs to.
    pub run_id: String,
    /// The argv, as the start request gave it.
    pub command: Vec<String>,
    /// Started in the background (its result goes to a report) or in the
    /// foreground.
    pub background: bool,
    /// Its timeout in seconds, counted from its start.
    pub timeout_sec: u64,
    /// How its stdin is wired (SPEC §25): `/dev/null`, a pipe, a terminal.
    pub io: sandbox::Io,
    /// Where it stands in the lifecycle.
    pub status: Status,
    /// The current observer attempt; only attempt 1 may launch the command.
    pub attempt: u32,
    /// Observer attempts that failed in a row (the supervisor gives up at a
    /// bound).
    pub failed_attempts: u32,
    /// When it won the exec claim (unix ms); `None` while never claimed.
    pub exec_claimed_at: Option<i64>,
    /// Its run's scratch key: which `.ops` dir holds its files.
    pub scratch_key: String,
    /// The container it was launched in, once claimed.
    pub container_id: Option<String>,
    /// Its wrapper's identity from the `.pid` file, once recorded.
    pub pid: Option<sandbox::PidRecord>,
    /// When it was admitted (unix ms).
    pub created_at: i64,
    /// When its start was confirmed (`running`), unix ms.
    pub started_at: Option<i64>,
    /// When the observing kernel last refreshed it (unix ms).
    pub heartbeat_at: Option<i64>,
    /// When it was settled (unix ms).
    pub finished_at: Option<i64>,
    /// The command's exit code, when it has one.
    pub exit_code: Option<i32>,
    /// A kill's signal reached the command.
    pub killed: bool,
    /// When a kill or timeout was requested (unix ms).
    pub kill_requested_at: Option<i64>,
    /// Why it is being killed, once a kill or timeout is requested.
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
    /// `uncertain` for a lost or timed-out op (it may or may not have done its
    /// work).
    pub effect: Option<String>,
    /// Why it was lost, failed or denied.
    pub error: Option<String>,
    /// The end of its output (at most `TAIL_BYTES`), kept after the log file is
    /// pruned.
    pub output_tail: Option<String>,
    /// Hex sha256 of its final log: its output artifact.
    pub log_sha256: Option<String>,
    /// Its final log's size, in bytes.
    pub log_size: Option<u64>,
    /// What the command's process tree used (from the shim's code record).
    pub usage: Option<sandbox::Usage>,
    /// Processes the command left behind that its shim stopped before
    /// recording the code (from the code record; 0 when none or unknown).
    pub leftovers: u32,
    /// The kernel process (boot id, pid, start time) whose observer claimed it
    /// and heartbeats it.
    pub kernel_id: Option<String>,
    /// The report that delivered its result, once drained.
    pub report_id: Option<String>,
    /// Its result was returned directly (a foreground op): no report carries
    /// it.
    pub delivered_inline: bool,
    /// The approval rule that held it (SPEC §16), if one did.
    pub approval_rule: Option<String>,
    /// How long it may wait for a decision, seconds (`None`: forever).
    pub approval_timeout_sec: Option<u64>,
    /// What the wait's timeout does (`None`: escalate).
    pub approval_on_timeout: Option<crate::runs::OnTimeout>,
    /// When its approval wait was escalated (unix ms); escalated once.
    pub approval_escalated_at: Option<i64>,
    /// `operator`, `timeout` or `kill` (for a denial), `operator` for an approval.
    pub approval_decided_by: Option<String>,
    /// When the operator or the timeout decided (unix ms).
    pub approval_decided_at: Option<i64>,
    /// The schedule that fired it, if one did.
    pub schedule_id: Option<String>,
    /// The cluster node its run was placed on when it was admitted (SPEC
    /// §20): only that node claims and runs it; `None` without a cluster.
    pub node: Option<String>,
    /// Where it came from (SPEC §28); `None` for an op admitted before
    /// origins were recorded.
    pub origin: Option<crate::origin::Origin>,
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

    /// When the op was asked to run: its approval, else its creation (the
    /// start of `opkernel_op_start_seconds`).
    pub fn requested_at_ms(&self) -> i64 {
        self.approval_decided_at.unwrap_or(self.created_at)
    }
}

/// Every column of an op row, in the order [`op_from_row`] does not rely on:
/// rows are read by column name.
pub(super) const COLUMNS: &str = "id, run_id, command, background, timeout_sec, status, attempt, failed_attempts, \
    exec_claimed_at, scratch_key, container_id, pid, proc_start_ticks, hostname, created_at, started_at, \
    heartbeat_at, finished_at, exit_code, killed, kill_requested_at, kill_reason, kill_signalled, kill_intent, exec_id, \
    handed_over_at, effect, error, output_tail, log_sha256, log_size, cpu_ms, max_rss_kb, leftovers, kernel_id, report_id, delivered_inline, \
    approval_rule, approval_timeout_sec, approval_on_timeout, approval_escalated_at, approval_decided_by, \
    approval_decided_at, schedule_id, node, io, origin_surface, origin_channel, origin_principal, origin_route";

/// A row's origin (`origin_surface`, `origin_channel`,
/// `origin_principal`); `None` for a row admitted before origins were.
pub(super) fn origin_from(row: &Row) -> StoreResult<Option<crate::origin::Origin>> {
    let surface: Option<String> = row.get("origin_surface")?;
    let Some(surface) = surface else {
        return Ok(None);
    };
    let surface = crate::origin::Surface::parse(&surface)
        .ok_or_else(|| StoreError::Corrupt(format!("origin surface {surface}")))?;
    Ok(Some(crate::origin::Origin {
        surface,
        channel: row
            .get::<Option<String>>("origin_channel")?
            .unwrap_or_default(),
        principal: row
            .get::<Option<String>>("origin_principal")?
            .unwrap_or_default(),
        route: row
            .get::<Option<String>>("origin_route")?
            .unwrap_or_default(),
    }))
}

/// The one mapping of an op row (selected with [`COLUMNS`]) to an [`Op`].
pub(super) fn op_from_row(row: &Row) -> StoreResult<Op> {
    let command: String = row.get("command")?;
    let status: String = row.get("status")?;
    let pid: Option<i64> = row.get("pid")?;
    let start: Option<i64> = row.get("proc_start_ticks")?;
    let kill_reason: Option<String> = row.get("kill_reason")?;
    Ok(Op {
        id: row.get("id")?,
        run_id: row.get("run_id")?,
        command: serde_json::from_str(&command)
            .map_err(|e| StoreError::Corrupt(format!("op command: {e}")))?,
        background: row.get("background")?,
        timeout_sec: row.get::<i64>("timeout_sec")? as u64,
        io: io_from(row.get("io")?)?,
        status: Status::parse(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("status {status}")))?,
        attempt: row.get::<i64>("attempt")? as u32,
        failed_attempts: row.get::<i64>("failed_attempts")? as u32,
        exec_claimed_at: row.get("exec_claimed_at")?,
        scratch_key: row.get("scratch_key")?,
        container_id: row.get("container_id")?,
        pid: match (pid, start) {
            (Some(pid), Some(start)) => Some(sandbox::PidRecord {
                pid: pid as u32,
                start_ticks: start as u64,
                hostname: row.get::<Option<String>>("hostname")?.unwrap_or_default(),
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
        log_size: row.get::<Option<i64>>("log_size")?.map(|v| v as u64),
        usage: match (
            row.get::<Option<i64>>("cpu_ms")?,
            row.get::<Option<i64>>("max_rss_kb")?,
        ) {
            (Some(cpu), Some(rss)) => Some(sandbox::Usage {
                cpu_ms: cpu as u64,
                max_rss_kb: rss as u64,
            }),
            _ => None,
        },
        leftovers: row.get::<i64>("leftovers")?.clamp(0, u32::MAX as i64) as u32,
        kernel_id: row.get("kernel_id")?,
        report_id: row.get("report_id")?,
        delivered_inline: row.get("delivered_inline")?,
        approval_rule: row.get("approval_rule")?,
        approval_timeout_sec: row
            .get::<Option<i64>>("approval_timeout_sec")?
            .map(|v| v as u64),
        approval_on_timeout: row
            .get::<Option<String>>("approval_on_timeout")?
            .as_deref()
            .and_then(crate::runs::OnTimeout::parse),
        approval_escalated_at: row.get("approval_escalated_at")?,
        approval_decided_by: row.get("approval_decided_by")?,
        approval_decided_at: row.get("approval_decided_at")?,
        schedule_id: row.get("schedule_id")?,
        node: row.get("node")?,
        origin: origin_from(row)?,
    })
}

/// An op's stdin mode as its row holds it (NULL: `/dev/null`).
fn io_from(text: Option<String>) -> StoreResult<sandbox::Io> {
    text.map_or(Ok(sandbox::Io::Null), |t| {
        sandbox::Io::parse(&t).map_err(|e| StoreError::Corrupt(format!("op io: {e}")))
    })
}

/// The column value of a stdin mode (NULL for `/dev/null`).
pub(super) fn io_column(io: sandbox::Io) -> Option<String> {
    io.has_stdin().then(|| io.spec())
}

/// The ops a query with [`COLUMNS`] reads, in its order.
pub(super) fn ops_of(tx: &mut dyn Tx, sql: &str, params: &[Value]) -> StoreResult<Vec<Op>> {
    tx.query(sql, params)?.iter().map(op_from_row).collect()
}

/// A validated start request.
#[derive(Debug, Clone)]
pub struct StartRequest {
    /// The run to start it in.
    pub run_id: String,
    /// The run's scratch key.
    pub scratch_key: String,
    /// The argv (non-empty, no NUL bytes, bounded).
    pub command: Vec<String>,
    /// Background (a report delivers its result) or foreground.
    pub background: bool,
    /// The timeout, in seconds.
    pub timeout_sec: u64,
    /// How its stdin is wired (SPEC §25).
    pub io: sandbox::Io,
    /// The `Idempotency-Key` header: a retry with the same key finds the same
    /// op.
    pub idempotency_key: Option<String>,
    /// Set when an approval rule matched: the op waits for an operator.
    pub approval: Option<ApprovalHold>,
    /// The schedule firing it, if one is.
    pub schedule_id: Option<String>,
    /// Where it came from, from the call's context (SPEC §28).
    pub origin: crate::origin::Origin,
}

pub use crate::approval::ApprovalHold;

impl StartRequest {
    /// What a retry under the same idempotency key must repeat exactly.
    pub(super) fn fingerprint(&self) -> String {
        // an op without stdin keeps the fingerprint it had before SPEC §25
        let body = match self.io {
            sandbox::Io::Null => {
                serde_json::json!([self.command, self.background, self.timeout_sec])
            }
            io => serde_json::json!([self.command, self.background, self.timeout_sec, io.spec()]),
        };
        hex::encode(Sha256::digest(body.to_string().as_bytes()))
    }
}

/// The result of inserting a start.
#[derive(Debug)]
pub enum NewOp {
    /// A new row (`starting`, or `awaiting_approval` under a hold), committed.
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
    /// The terminal status and its fields, written by compare-and-set.
    pub outcome: Outcome,
    /// The end of the output ([`crate::report_text::cut_tail`]).
    pub output_tail: Option<String>,
    /// The final log's digest and size, when the log could be read.
    pub log: Option<sandbox::LogDigest>,
    /// What the command's tree used, from the code record.
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

impl Settlement {
    /// A settlement with nothing recorded but its outcome (no log, no
    /// usage: the op's node is gone).
    pub fn of(outcome: Outcome) -> Settlement {
        Settlement {
            outcome,
            output_tail: None,
            log: None,
            usage: None,
            leftovers: 0,
            ended_at: None,
            charge_cap_ms: Some(0),
        }
    }
}

pub(super) fn get(tx: &mut dyn Tx, id: &str) -> StoreResult<Option<Op>> {
    tx.query_opt(
        &format!("SELECT {COLUMNS} FROM ops WHERE id = ?1"),
        vals![id],
    )?
    .as_ref()
    .map(op_from_row)
    .transpose()
}

/// The run an op belongs to; `None` for an unknown op.
pub(super) fn run_of(tx: &mut dyn Tx, id: &str) -> StoreResult<Option<String>> {
    tx.query_opt("SELECT run_id FROM ops WHERE id = ?1", vals![id])?
        .map(|row| row.get("run_id"))
        .transpose()
}

impl Store {
    /// Every observed (starting or running) op: id and creation time only
    /// (the watchdog's look, every few seconds, reads no command).
    pub async fn observed_op_ids(&self) -> StoreResult<Vec<(String, i64)>> {
        let mine = self.node_filter();
        self.read(move |tx| {
            let sql = format!(
                "SELECT id, created_at FROM ops WHERE status IN ({}){}",
                crate::lifecycle::observed_sql(),
                mine.0
            );
            tx.query(&sql, &mine.1)?
                .iter()
                .map(|r| Ok((r.get("id")?, r.get("created_at")?)))
                .collect()
        })
        .await
    }

    /// The op by id; `None` when no such op exists (or it was purged).
    pub async fn get_op(&self, id: &str) -> StoreResult<Option<Op>> {
        let id = id.to_owned();
        self.read(move |tx| get(tx, &id)).await
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
        let mine = self.node_filter();
        self.read(move |tx| {
            let sql = format!(
                "SELECT {COLUMNS} FROM ops WHERE status IN ({statuses}){} ORDER BY created_at",
                mine.0
            );
            ops_of(tx, &sql, &mine.1)
        })
        .await
    }

    /// On a cluster node, the condition that keeps a read of observed ops
    /// to this node's (`?1` its name), with its parameter.
    fn node_filter(&self) -> (&'static str, Vec<Value>) {
        match self.node() {
            Some(node) => (" AND node = ?1", vals![node].to_vec()),
            None => ("", Vec::new()),
        }
    }

    /// This node's observed ops with a kill request (the node that took
    /// the kill may be another one: the observer here is woken by it).
    pub async fn node_kill_requests(&self) -> StoreResult<Vec<String>> {
        let Some(node) = self.node().map(str::to_owned) else {
            return Ok(Vec::new());
        };
        self.read(move |tx| {
            let sql = format!(
                "SELECT id FROM ops WHERE node = ?1 AND status IN ({}) AND kill_requested_at IS NOT NULL",
                observed_sql()
            );
            tx.query(&sql, vals![node])?
                .iter()
                .map(|r| r.get("id"))
                .collect()
        })
        .await
    }

    /// Live ops (not terminal), newest first, optionally of one run: read
    /// through the index of live statuses, whatever the table's size.
    pub async fn list_live_ops(&self, run_id: Option<String>, limit: u32) -> StoreResult<Vec<Op>> {
        self.list_ops_by(run_id, None, true, limit).await
    }

    /// Ops, newest first, optionally of one run.
    pub async fn list_ops(&self, run_id: Option<String>, limit: u32) -> StoreResult<Vec<Op>> {
        self.list_ops_by(run_id, None, false, limit).await
    }

    /// Ops, newest first, optionally of one run, of one origin surface
    /// (SPEC §28), only the live ones.
    pub async fn list_ops_by(
        &self,
        run_id: Option<String>,
        surface: Option<crate::origin::Surface>,
        live: bool,
        limit: u32,
    ) -> StoreResult<Vec<Op>> {
        self.read(move |tx| {
            let live = match live {
                true => format!("status IN ({})", live_sql()),
                false => "1 = 1".to_owned(),
            };
            let sql = format!(
                "SELECT {COLUMNS} FROM ops WHERE {live} \
                 AND (CAST(?1 AS TEXT) IS NULL OR run_id = ?1) \
                 AND (CAST(?2 AS TEXT) IS NULL OR origin_surface = ?2) \
                 ORDER BY created_at DESC LIMIT ?3"
            );
            ops_of(tx, &sql, vals![run_id, surface.map(|s| s.as_str()), limit])
        })
        .await
    }

    /// Refreshes `heartbeat_at` of every live op this kernel observes.
    pub async fn heartbeat(&self, kernel_id: &str) -> StoreResult<usize> {
        let kernel_id = kernel_id.to_owned();
        self.write(move |tx| {
            let sql = format!(
                "UPDATE ops SET heartbeat_at = ?2 WHERE kernel_id = ?1 AND status IN ({})",
                observed_sql()
            );
            Ok(tx.execute(&sql, vals![&kernel_id, now_ms()])? as usize)
        })
        .await
    }

    /// Records this kernel process in the `kernels` table at start.
    pub async fn register_kernel(&self, kernel_id: &str) -> StoreResult<()> {
        let kernel_id = kernel_id.to_owned();
        self.write(move |tx| {
            tx.execute(
                "INSERT INTO kernels (id, started_at) VALUES (?1, ?2) \
                 ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at",
                vals![&kernel_id, now_ms()],
            )?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
#[path = "ops_tests.rs"]
mod tests;
