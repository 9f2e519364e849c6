//! Reports, their delivery marks and notes. A drain writes the report and
//! marks its ops and notes delivered in one transaction; until it is acked,
//! asking again returns the very same report.

use super::db::Tx;
use super::journal::append_event;
use super::ops::{ops_of, COLUMNS};
use super::{now_ms, Op, Store, StoreError, StoreResult};
use crate::event_kind::{EventKind, NoteReceived, ReportDelivered};
use crate::lifecycle::{live_sql, terminal_sql, Status};
use crate::report_text::{
    bounded_argv, render, MAX_NOTE_BYTES, MAX_REPORT_ITEMS, MAX_REPORT_NOTE_BYTES,
    MAX_VIEW_ARGV_BYTES,
};
use crate::vals;

/// Pending (undelivered) notes a run may hold.
pub const MAX_PENDING_NOTES: u64 = 64;

pub use crate::report_text::{Report, ReportItem, RunningItem};

/// An op's line in a report: what it resolved to, bounded.
fn report_item(op: &Op) -> ReportItem {
    let end = op.finished_at.unwrap_or_else(now_ms);
    ReportItem {
        operation_id: op.id.clone(),
        command: bounded_argv(&op.command, MAX_VIEW_ARGV_BYTES).0,
        status: op.status,
        exit_code: op.exit_code,
        killed: op.killed,
        effect: op.effect.clone(),
        message: op.error.clone(),
        duration_sec: ((end - op.budget_start_ms()).max(0) as f64) / 1000.0,
        timeout_sec: op.timeout_sec,
        output_tail: op.output_tail.clone(),
        kill_reason: op
            .killed
            .then(|| op.kill_reason.map(|r| r.as_str().to_owned()))
            .flatten(),
        denied_by: (op.status == Status::Denied)
            .then(|| op.approval_decided_by.clone())
            .flatten(),
        leftovers: op.leftovers,
    }
}

/// Background ops only: a foreground op's result goes to its caller
/// inline and never appears in a report, resolved or running.
const BACKGROUND: &str = "background = 1";

fn running_items(tx: &mut dyn Tx, run_id: &str) -> StoreResult<Vec<RunningItem>> {
    let now = now_ms();
    Ok(query_ops(
        tx,
        &format!(
            "run_id = ?1 AND {BACKGROUND} AND status IN ({}) ORDER BY created_at",
            live_sql()
        ),
        run_id,
    )?
    .iter()
    .map(|op| RunningItem {
        operation_id: op.id.clone(),
        command: bounded_argv(&op.command, MAX_VIEW_ARGV_BYTES).0,
        running_sec: ((now - op.budget_start_ms()).max(0) / 1000) as u64,
        timeout_sec: op.timeout_sec,
        awaiting_approval: op.status == Status::AwaitingApproval,
    })
    .collect())
}

/// A run's resolved background ops no report holds yet, in the order a
/// report lists them, at most `limit`: read through the index of
/// undelivered ops, never the run's history.
fn resolved_filter(limit: usize) -> String {
    format!(
        "run_id = ?1 AND {BACKGROUND} AND status IN ({}) AND report_id IS NULL \
         AND delivered_inline = 0 ORDER BY finished_at, id LIMIT {limit}",
        terminal_sql()
    )
}

/// Whether a drain would return something: an unacked report, a resolved
/// op no report holds yet (its first, by [`resolved_filter`]) or a pending
/// note.
fn pending_sql() -> String {
    format!(
        "SELECT EXISTS (SELECT 1 FROM reports WHERE run_id = ?1 AND acked_at IS NULL) \
         OR (SELECT id FROM ops WHERE {}) IS NOT NULL \
         OR EXISTS (SELECT 1 FROM notes WHERE run_id = ?1 AND report_id IS NULL)",
        resolved_filter(1)
    )
}

fn query_ops(tx: &mut dyn Tx, filter: &str, run_id: &str) -> StoreResult<Vec<Op>> {
    let sql = format!("SELECT {COLUMNS} FROM ops WHERE {filter}");
    ops_of(tx, &sql, vals![run_id])
}

/// The resolved ops and notes that fit one report (at most
/// [`MAX_REPORT_ITEMS`] results, notes up to [`MAX_REPORT_NOTE_BYTES`], at
/// least one note), and how many of the given ones wait for the next report.
/// `resolved` holds at most one op more than fits, so `more` may count
/// fewer than all that wait; the mark only has to say that more come.
fn within_bounds(
    mut resolved: Vec<Op>,
    mut notes: Vec<(i64, String)>,
) -> (Vec<Op>, Vec<(i64, String)>, usize) {
    let mut more = resolved.len().saturating_sub(MAX_REPORT_ITEMS);
    resolved.truncate(MAX_REPORT_ITEMS);
    let mut bytes = 0;
    let fit = notes
        .iter()
        .position(|(_, t)| {
            bytes += t.len();
            bytes > MAX_REPORT_NOTE_BYTES
        })
        .unwrap_or(notes.len())
        .max(1)
        .min(notes.len());
    more += notes.len() - fit;
    notes.truncate(fit);
    (resolved, notes, more)
}

/// A report's text with its closing `Budget:` line when a budget applies.
fn with_budget(text: String, run_id: &str, budget: &[crate::runs::LimitUse]) -> String {
    match crate::runs::budget_line(run_id, budget) {
        Some(line) => format!("{text}{line}\n"),
        None => text,
    }
}

fn unacked(tx: &mut dyn Tx, run_id: &str) -> StoreResult<Option<Report>> {
    let body: Option<String> = tx
        .query_opt(
            "SELECT body FROM reports WHERE run_id = ?1 AND acked_at IS NULL ORDER BY created_at LIMIT 1",
            vals![run_id],
        )?
        .map(|r| r.get("body"))
        .transpose()?;
    body.map(|b| {
        serde_json::from_str(&b).map_err(|e| StoreError::Corrupt(format!("report body: {e}")))
    })
    .transpose()
}

/// The drain transaction script (see [`Store::drain_report`]): the tree's
/// lock, the unacked report if any, else the resolved ops and pending
/// notes that fit one report, the report, its delivery marks and its
/// `report.delivered` event.
fn drain_in(tx: &mut dyn Tx, run_id: &str) -> StoreResult<Option<Report>> {
    // locks the run's tree: a drain is serialized with the tree's
    // settlements (what it resolves) and every other drain of the run
    super::tree::lock_tree_of(tx, run_id)?;
    if let Some(report) = unacked(tx, run_id)? {
        return Ok(Some(report));
    }
    let resolved = query_ops(tx, &resolved_filter(MAX_REPORT_ITEMS + 1), run_id)?;
    let notes = tx
        .query(
            "SELECT id, text FROM notes WHERE run_id = ?1 AND report_id IS NULL ORDER BY id",
            vals![run_id],
        )?
        .iter()
        .map(|r| Ok((r.get("id")?, r.get("text")?)))
        .collect::<StoreResult<Vec<(i64, String)>>>()?;
    if resolved.is_empty() && notes.is_empty() {
        return Ok(None);
    }
    let (resolved, notes, more) = within_bounds(resolved, notes);
    let items: Vec<ReportItem> = resolved.iter().map(report_item).collect();
    let running = running_items(tx, run_id)?;
    let note_texts: Vec<String> = notes.iter().map(|(_, t)| t.clone()).collect();
    let budget = super::admission::budget_status(tx, run_id)?;
    let report_id = uuid::Uuid::new_v4().to_string();
    let report = Report {
        report_id: Some(report_id.clone()),
        run_id: run_id.to_owned(),
        text: with_budget(render(&items, &running, &note_texts, more), run_id, &budget),
        resolved: items,
        running,
        notes: note_texts,
        more_pending: more,
    };
    mark_delivered(tx, &report, &resolved, &notes)?;
    let now = now_ms();
    for op in &resolved {
        let waited_ms = now - op.finished_at.unwrap_or(now);
        tx.note_fact(super::db::Fact::Reported { waited_ms });
    }
    Ok(Some(report))
}

/// Stores a report and marks what it delivers, with its `report.delivered`
/// event.
fn mark_delivered(
    tx: &mut dyn Tx,
    report: &Report,
    resolved: &[Op],
    notes: &[(i64, String)],
) -> StoreResult<()> {
    let body = serde_json::to_string(report).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let run_id = &report.run_id;
    tx.execute(
        "INSERT INTO reports (id, run_id, created_at, body) VALUES (?1, ?2, ?3, ?4)",
        vals![&report.report_id, run_id, now_ms(), body],
    )?;
    for op in resolved {
        let n = tx.execute(
            "UPDATE ops SET report_id = ?2 WHERE id = ?1 AND report_id IS NULL",
            vals![&op.id, &report.report_id],
        )?;
        if n != 1 {
            return Err(StoreError::Corrupt(format!("op {} delivered twice", op.id)));
        }
    }
    for (id, _) in notes {
        tx.execute(
            "UPDATE notes SET report_id = ?2 WHERE id = ?1",
            vals![*id, &report.report_id],
        )?;
    }
    let delivered = ReportDelivered {
        report_id: report.report_id.clone().unwrap_or_default(),
        operation_ids: report
            .resolved
            .iter()
            .map(|r| r.operation_id.clone())
            .collect(),
        notes: report.notes.len(),
    };
    append_event(tx, run_id, None, EventKind::ReportDelivered(delivered))?;
    Ok(())
}

/// The add-note transaction script (see [`Store::add_note`]).
fn add_note_in(
    tx: &mut dyn Tx,
    run_id: &str,
    text: &str,
    origin: Option<&crate::origin::Origin>,
) -> StoreResult<Option<i64>> {
    // locks the run's tree: the bound on pending notes is counted and kept
    // one note at a time, and a drain takes a note whole or not at all
    super::tree::lock_tree_of(tx, run_id)?;
    let pending: i64 = tx.scalar(
        "SELECT COUNT(*) FROM notes WHERE run_id = ?1 AND report_id IS NULL",
        vals![run_id],
    )?;
    if pending as u64 >= MAX_PENDING_NOTES {
        return Ok(None);
    }
    super::runs::ensure_top_level(tx, run_id, now_ms(), origin)?;
    let id: i64 = tx.scalar(
        "INSERT INTO notes (run_id, text, created_at) VALUES (?1, ?2, ?3) RETURNING id",
        vals![run_id, text, now_ms()],
    )?;
    let received = NoteReceived {
        note_id: id,
        bytes: text.len(),
    };
    append_event(tx, run_id, None, EventKind::NoteReceived(received))?;
    Ok(Some(id))
}

impl Store {
    /// True when a drain would return something: an unacked report,
    /// a resolved-but-undelivered op or a pending note.
    pub async fn has_pending(&self, run_id: &str) -> StoreResult<bool> {
        let run_id = run_id.to_owned();
        self.read(move |tx| tx.scalar(&pending_sql(), vals![run_id]))
            .await
    }

    /// Drains every resolved-but-undelivered op and pending note of the run
    /// into one report, or returns the unacked report if there is one.
    /// `None` when there is nothing to deliver.
    pub async fn drain_report(&self, run_id: &str) -> StoreResult<Option<Report>> {
        let run_id = run_id.to_owned();
        self.write(move |tx| drain_in(tx, &run_id)).await
    }

    /// The report a waiting caller gets when nothing resolved in time.
    pub async fn empty_report(&self, run_id: &str) -> StoreResult<Report> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            let running = running_items(tx, &run_id)?;
            let budget = super::admission::budget_status(tx, &run_id)?;
            Ok(Report {
                report_id: None,
                text: with_budget(render(&[], &running, &[], 0), &run_id, &budget),
                run_id,
                resolved: Vec::new(),
                running,
                notes: Vec::new(),
                more_pending: 0,
            })
        })
        .await
    }

    /// The run's stored reports, newest first, with when each was acked
    /// (reading them neither drains nor acks anything).
    pub async fn recent_reports(
        &self,
        run_id: &str,
        limit: u32,
    ) -> StoreResult<Vec<(Report, i64, Option<i64>)>> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            let rows = tx.query(
                "SELECT body, created_at, acked_at FROM reports WHERE run_id = ?1 \
                 ORDER BY created_at DESC LIMIT ?2",
                vals![run_id, limit],
            )?;
            rows.iter()
                .map(|row| {
                    let body: String = row.get("body")?;
                    let report: Report = serde_json::from_str(&body)
                        .map_err(|e| StoreError::Corrupt(format!("report body: {e}")))?;
                    Ok((report, row.get("created_at")?, row.get("acked_at")?))
                })
                .collect()
        })
        .await
    }

    /// Acknowledges a report. `Ok(false)` when no such report of this run exists.
    pub async fn ack_report(&self, run_id: &str, report_id: &str) -> StoreResult<bool> {
        let (run_id, report_id) = (run_id.to_owned(), report_id.to_owned());
        self.write(move |tx| {
            let exists: bool = tx.scalar(
                "SELECT EXISTS (SELECT 1 FROM reports WHERE id = ?1 AND run_id = ?2)",
                vals![&report_id, &run_id],
            )?;
            tx.execute(
                "UPDATE reports SET acked_at = ?3 WHERE id = ?1 AND run_id = ?2 AND acked_at IS NULL",
                vals![&report_id, &run_id, now_ms()],
            )?;
            Ok(exists)
        })
        .await
    }

    /// Adds a note; `None` when the run already holds
    /// [`MAX_PENDING_NOTES`] undelivered notes (nothing is added).
    pub async fn add_note(&self, run_id: &str, text: &str) -> StoreResult<Option<i64>> {
        self.add_note_from(run_id, text, None).await
    }

    /// [`Store::add_note`] by a call from `origin` (a top-level run the
    /// note makes records it).
    pub async fn add_note_from(
        &self,
        run_id: &str,
        text: &str,
        origin: Option<&crate::origin::Origin>,
    ) -> StoreResult<Option<i64>> {
        let (run_id, text, origin) = (run_id.to_owned(), text.to_owned(), origin.cloned());
        if text.len() > MAX_NOTE_BYTES {
            return Err(StoreError::Corrupt(format!(
                "note of {} bytes over the {MAX_NOTE_BYTES} byte bound",
                text.len()
            )));
        }
        self.write(move |tx| add_note_in(tx, &run_id, &text, origin.as_ref()))
            .await
    }

    /// All ops of a run, oldest first.
    pub async fn run_ops(&self, run_id: &str) -> StoreResult<Vec<Op>> {
        let run_id = run_id.to_owned();
        self.read(move |tx| query_ops(tx, "run_id = ?1 ORDER BY created_at", &run_id))
            .await
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::lifecycle::Outcome;
    use crate::store::{test_store, Admission, NewOp, Settlement, StartRequest};

    pub(crate) async fn new_op(store: &Store, run: &str, background: bool) -> String {
        let req = StartRequest {
            run_id: run.into(),
            scratch_key: "k".into(),
            command: vec!["true".into()],
            background,
            timeout_sec: 60,
            io: sandbox::Io::Null,
            idempotency_key: None,
            approval: None,
            schedule_id: None,
            origin: crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
        };
        let NewOp::Created(op) = store.insert_op(req, Admission::UNLIMITED).await.unwrap() else {
            panic!()
        };
        op.id
    }

    /// A drain, and the check for anything to drain, read only the run's
    /// undelivered ops, already in order: not every finished op of the
    /// run's history.
    #[tokio::test]
    async fn a_drain_reads_only_undelivered_ops() {
        let drain = format!(
            "SELECT {COLUMNS} FROM ops WHERE {}",
            resolved_filter(MAX_REPORT_ITEMS + 1)
        );
        for sql in [drain, pending_sql()] {
            let plan = crate::store::sqlite_query_plan(&sql)
                .await
                .into_iter()
                .filter(|step| step.contains(" ops ") || step.contains("TEMP B-TREE"))
                .collect::<Vec<_>>();
            assert_eq!(
                plan,
                ["SEARCH ops USING INDEX ops_undelivered (run_id=?)"],
                "{sql}"
            );
        }
    }

    pub(crate) async fn finished_op(store: &Store, run: &str, code: i32) -> String {
        let id = new_op(store, run, true).await;
        settle(store, &id, code).await;
        id
    }

    pub(crate) async fn settle(store: &Store, id: &str, code: i32) {
        let s = Settlement {
            outcome: Outcome::Completed {
                exit_code: code,
                killed: false,
            },
            output_tail: None,
            log: None,
            usage: None,
            leftovers: 0,
            ended_at: None,
            charge_cap_ms: None,
        };
        assert!(store.settle(id, s).await.unwrap());
    }

    #[tokio::test]
    async fn foreground_ops_never_appear_in_reports() {
        let store = test_store().await;
        let live_fg = new_op(&store, "r", false).await;
        let done_fg = new_op(&store, "r", false).await;
        settle(&store, &done_fg, 0).await;
        assert!(
            !store.has_pending("r").await.unwrap(),
            "a foreground result wakes no report waiter"
        );
        let bg = finished_op(&store, "r", 3).await;
        let report = store.drain_report("r").await.unwrap().unwrap();
        let ids: Vec<_> = report.resolved.iter().map(|i| &i.operation_id).collect();
        assert_eq!(ids, vec![&bg]);
        assert!(report.running.is_empty(), "{:?}", report.running);
        assert!(!report.text.contains(&live_fg) && !report.text.contains(&done_fg));
        assert!(store.empty_report("r").await.unwrap().running.is_empty());
        // the foreground op's own delivery is untouched: it is not marked delivered by a report
        assert_eq!(
            store.get_op(&done_fg).await.unwrap().unwrap().report_id,
            None
        );
    }

    #[tokio::test]
    async fn reports_are_bounded_and_hold_the_rest_back_without_loss() {
        let store = test_store().await;
        let mut all = std::collections::HashSet::new();
        for _ in 0..(MAX_REPORT_ITEMS + 5) {
            all.insert(finished_op(&store, "r", 0).await);
        }
        let big = "n".repeat(MAX_NOTE_BYTES);
        for _ in 0..3 {
            store.add_note("r", &big).await.unwrap().unwrap();
        }
        let first = store.drain_report("r").await.unwrap().unwrap();
        assert_eq!(first.resolved.len(), MAX_REPORT_ITEMS);
        assert_eq!(first.notes.len(), 2, "two 16 KiB notes fit 32 KiB");
        assert!(first.more_pending >= 2);
        assert!(first
            .text
            .contains("more results or notes wait for the next report"));
        store
            .ack_report("r", first.report_id.as_deref().unwrap())
            .await
            .unwrap();
        assert!(store.has_pending("r").await.unwrap());
        let second = store.drain_report("r").await.unwrap().unwrap();
        assert_eq!(
            (
                second.resolved.len(),
                second.notes.len(),
                second.more_pending
            ),
            (5, 1, 0)
        );
        let delivered: std::collections::HashSet<_> = first
            .resolved
            .iter()
            .chain(&second.resolved)
            .map(|i| i.operation_id.clone())
            .collect();
        assert_eq!(delivered, all, "every result exactly once");
    }

    #[tokio::test]
    async fn pending_notes_are_bounded() {
        let store = test_store().await;
        for _ in 0..MAX_PENDING_NOTES {
            assert!(store.add_note("r", "x").await.unwrap().is_some());
        }
        assert!(store.add_note("r", "x").await.unwrap().is_none());
        assert!(store.add_note("other", "x").await.unwrap().is_some());
        assert!(store
            .add_note("r", &"y".repeat(MAX_NOTE_BYTES + 1))
            .await
            .is_err());
    }

    #[tokio::test]
    async fn each_result_is_delivered_in_exactly_one_report() {
        let store = test_store().await;
        let a = finished_op(&store, "r", 0).await;
        let b = finished_op(&store, "r", 1).await;
        let other_run = finished_op(&store, "s", 0).await;
        let first = store.drain_report("r").await.unwrap().unwrap();
        let ids: Vec<_> = first
            .resolved
            .iter()
            .map(|i| i.operation_id.clone())
            .collect();
        assert_eq!(ids.len(), 2);
        assert!(ids.contains(&a) && ids.contains(&b) && !ids.contains(&other_run));
        // not acked: the same report again, identical
        assert_eq!(store.drain_report("r").await.unwrap().unwrap(), first);
        let rid = first.report_id.clone().unwrap();
        assert!(store.ack_report("r", &rid).await.unwrap());
        assert!(
            !store.ack_report("s", &rid).await.unwrap(),
            "another run cannot ack it"
        );
        assert!(store.drain_report("r").await.unwrap().is_none());
        assert!(!store.has_pending("r").await.unwrap());
        let c = finished_op(&store, "r", 2).await;
        let next = store.drain_report("r").await.unwrap().unwrap();
        assert_eq!(next.resolved.len(), 1);
        assert_eq!(next.resolved[0].operation_id, c);
    }

    #[tokio::test]
    async fn notes_ride_the_next_report() {
        let store = test_store().await;
        store.add_note("r", "please hurry").await.unwrap();
        assert!(store.has_pending("r").await.unwrap());
        let report = store.drain_report("r").await.unwrap().unwrap();
        assert_eq!(report.notes, vec!["please hurry".to_owned()]);
        assert!(report.text.contains("please hurry"));
        assert!(report.resolved.is_empty());
    }
}
