//! Schedule timing as pure functions (SPEC §15): `cron` (5 fields, UTC),
//! `every_sec` and `at`; the next due time of a series; what start-up does
//! with an overdue schedule. No I/O here: the store applies it inside the
//! claim and finalization transactions. All times are unix milliseconds.

use std::str::FromStr;

/// Longest `every_sec`: a year.
pub const MAX_EVERY_SEC: u64 = 366 * 24 * 3600;
/// Slots counted one by one when a series is advanced past missed ones;
/// beyond it the count says "at least".
const MAX_COUNTED_SLOTS: u64 = 100_000;

/// When a schedule fires.
#[derive(Debug, Clone)]
pub enum Timing {
    /// A 5-field cron expression, evaluated in UTC.
    Cron {
        /// The expression as the request gave it (stored and shown).
        expr: String,
        /// The parsed expression.
        cron: Box<croner::Cron>,
    },
    /// Every so many seconds, counted from the previous due time.
    Every {
        /// The period, in seconds (at most [`MAX_EVERY_SEC`]).
        seconds: u64,
    },
    /// Once, at this time.
    At {
        /// The due time, in unix milliseconds.
        at_ms: i64,
    },
}

impl PartialEq for Timing {
    fn eq(&self, other: &Self) -> bool {
        self.kind() == other.kind() && self.spec() == other.spec()
    }
}

fn to_datetime(ms: i64) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp_millis(ms)
}

impl Timing {
    /// Exactly one of the three, checked.
    pub fn from_request(
        cron: Option<&str>,
        every_sec: Option<u64>,
        at: Option<&str>,
    ) -> Result<Timing, String> {
        match (cron, every_sec, at) {
            (Some(expr), None, None) => Timing::parse("cron", expr),
            (None, Some(s), None) => Timing::parse("every", &s.to_string()),
            (None, None, Some(at)) => Timing::parse("at", at),
            _ => Err("give exactly one of cron, every_sec and at".to_owned()),
        }
    }

    /// A stored `(kind, spec)` pair, or a request's.
    pub fn parse(kind: &str, spec: &str) -> Result<Timing, String> {
        match kind {
            "cron" => {
                let fields = spec.split_whitespace().count();
                if fields != 5 {
                    return Err(format!(
                        "cron must have 5 fields (minute hour day-of-month month day-of-week, UTC), got {fields}: {spec:?}"
                    ));
                }
                let cron = croner::Cron::from_str(spec)
                    .map_err(|e| format!("cron expression {spec:?}: {e}"))?;
                Ok(Timing::Cron {
                    expr: spec.split_whitespace().collect::<Vec<_>>().join(" "),
                    cron: Box::new(cron),
                })
            }
            "every" => {
                let seconds: u64 = spec
                    .parse()
                    .map_err(|_| format!("every_sec must be a whole number, got {spec:?}"))?;
                if !(1..=MAX_EVERY_SEC).contains(&seconds) {
                    return Err(format!(
                        "every_sec must be between 1 and {MAX_EVERY_SEC}, got {seconds}"
                    ));
                }
                Ok(Timing::Every { seconds })
            }
            "at" => {
                let at = chrono::DateTime::parse_from_rfc3339(spec)
                    .map_err(|e| format!("at must be an RFC 3339 time, got {spec:?}: {e}"))?;
                Ok(Timing::At {
                    at_ms: at.timestamp_millis(),
                })
            }
            other => Err(format!("unknown schedule kind {other:?}")),
        }
    }

    /// `cron`, `every` or `at`: the stored kind, with [`Timing::spec`] its
    /// value.
    pub fn kind(&self) -> &'static str {
        match self {
            Timing::Cron { .. } => "cron",
            Timing::Every { .. } => "every",
            Timing::At { .. } => "at",
        }
    }

    /// The stored spelling (parsed back by [`Timing::parse`]).
    pub fn spec(&self) -> String {
        match self {
            Timing::Cron { expr, .. } => expr.clone(),
            Timing::Every { seconds } => seconds.to_string(),
            Timing::At { at_ms } => crate::report_text::rfc3339(*at_ms),
        }
    }

    /// The timing as operators read it: the cron expression, `every Ns`,
    /// or `at <rfc3339>`.
    pub fn when(&self) -> String {
        match self {
            Timing::Cron { expr, .. } => expr.clone(),
            Timing::Every { seconds } => format!("every {seconds}s"),
            Timing::At { .. } => format!("at {}", self.spec()),
        }
    }

    /// Whether the schedule fires more than once (every kind but `at`).
    pub fn is_recurring(&self) -> bool {
        !matches!(self, Timing::At { .. })
    }

    /// The first due time of a schedule made at `now`.
    pub fn first_due(&self, now: i64) -> Option<i64> {
        match self {
            Timing::At { at_ms } => Some(*at_ms),
            Timing::Every { seconds } => Some(now + (*seconds as i64) * 1000),
            Timing::Cron { .. } => self.after(now),
        }
    }

    /// The series' next due time strictly after `t` (`None` for a one-shot
    /// or a cron expression that never matches again).
    pub fn after(&self, t: i64) -> Option<i64> {
        match self {
            Timing::At { .. } => None,
            Timing::Every { seconds } => Some(t + (*seconds as i64) * 1000),
            Timing::Cron { cron, .. } => {
                // whole seconds: cron's resolution, and stable keys
                let from = to_datetime(t - t.rem_euclid(1000))?;
                cron.find_next_occurrence(&from, false)
                    .ok()
                    .map(|d| d.timestamp_millis())
            }
        }
    }

    /// Continues the series from `due` to its first due time after `now`,
    /// and counts the slots in between that are passed over (`due` itself
    /// not included).
    pub fn next_after_now(&self, due: i64, now: i64) -> (Option<i64>, u64) {
        match self {
            Timing::At { .. } => (None, 0),
            Timing::Every { seconds } => {
                let period = (*seconds as i64) * 1000;
                if now < due {
                    return (Some(due + period), 0);
                }
                let k = (now - due) / period + 1;
                (Some(due + k * period), (k - 1) as u64)
            }
            Timing::Cron { .. } => {
                let mut next = self.after(due);
                let mut passed = 0;
                while let Some(t) = next.filter(|t| *t <= now) {
                    passed += 1;
                    if passed >= MAX_COUNTED_SLOTS {
                        return (self.after(now), passed);
                    }
                    next = self.after(t);
                }
                (next, passed)
            }
        }
    }
}

/// What start-up does with a schedule that is not held by a live op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Startup {
    /// Not due yet: nothing.
    NotOverdue,
    /// `catch_up: true`: fire once, for this due time (the next due time
    /// then follows the present, not every missed slot).
    FireOnce {
        /// The overdue time the fire is recorded for.
        due: i64,
    },
    /// `catch_up: false`, one-shot: disable it, `last_status: "skipped"`.
    SkipOneShot,
    /// `catch_up: false`, recurring: move to the next future slot without
    /// recording a run; `missed` slots are passed over.
    Advance {
        /// The first due time after now; `None` when a cron expression
        /// never matches again.
        next: Option<i64>,
        /// Overdue slots passed over, the stored due time included.
        missed: u64,
    },
}

/// The start-up rule for an unclaimed, enabled schedule due at `next_due`.
pub fn startup(timing: &Timing, catch_up: bool, next_due: i64, now: i64) -> Startup {
    if next_due > now {
        return Startup::NotOverdue;
    }
    match (catch_up, timing.is_recurring()) {
        (true, _) => Startup::FireOnce { due: next_due },
        (false, false) => Startup::SkipOneShot,
        (false, true) => {
            let (next, passed) = timing.next_after_now(next_due, now);
            Startup::Advance {
                next,
                missed: passed + 1,
            }
        }
    }
}

/// Why a due time's op was not admitted, as the schedule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireRefusal {
    /// The run is completed or cancelled.
    RunOver,
    /// The run is gone (purged).
    RunGone,
    /// Paused, or a live-op limit: it passes.
    Passing,
    /// A budget is reached.
    Budget,
    /// Over the run's envelope or a kernel ceiling (its timeout): standing
    /// until the schedule or the settings change.
    Ceiling,
}

/// What a refused fire does to its schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterRefusal {
    /// The schedule ends with its run.
    End,
    /// A one-shot tries the same due time again later.
    Postpone,
    /// The slot is skipped (`schedule.skipped`); a series goes on.
    Skip,
}

/// The rule for a refused fire: a schedule ends with its run; a one-shot
/// refused for a passing reason tries again; anything else skips the slot.
pub fn after_refusal(why: FireRefusal, recurring: bool) -> AfterRefusal {
    match (why, recurring) {
        (FireRefusal::RunOver | FireRefusal::RunGone, _) => AfterRefusal::End,
        (FireRefusal::Passing, false) => AfterRefusal::Postpone,
        _ => AfterRefusal::Skip,
    }
}

/// What a schedule becomes when its current due time's op ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterOp {
    /// A one-shot that asked for it and succeeded: the schedule goes.
    Delete,
    /// A one-shot that ran, or any schedule of a run that is over: it is
    /// released and disabled (`done`).
    Disable,
    /// A series goes on from `next_due`; when the op outlived due times,
    /// they were skipped (`schedule.skipped`, "previous still running"):
    /// `skipped` is the first of them and how many.
    Next {
        /// The next due time (`None`: the series has no more).
        next_due: Option<i64>,
        /// The first due time skipped, and the count.
        skipped: Option<(i64, u64)>,
    },
}

/// How an op's end finalizes its schedule (SPEC §15): `succeeded` is a
/// completed op with exit code 0 that was not killed; `next_due` is the
/// schedule's next due time as stored, `now` the settlement's time.
pub fn after_op(
    timing: &Timing,
    delete_after_success: bool,
    succeeded: bool,
    run_over: bool,
    next_due: Option<i64>,
    now: i64,
) -> AfterOp {
    if !timing.is_recurring() && delete_after_success && succeeded {
        return AfterOp::Delete;
    }
    if run_over {
        return AfterOp::Disable;
    }
    if !timing.is_recurring() {
        // a one-shot given a later time while its op ran (a declared
        // schedule re-timed, SPEC §28) fires then; else it is done
        return match next_due.filter(|due| *due > now) {
            Some(due) => AfterOp::Next {
                next_due: Some(due),
                skipped: None,
            },
            None => AfterOp::Disable,
        };
    }
    match next_due.filter(|due| *due <= now) {
        Some(due) => {
            let (after, passed) = timing.next_after_now(due, now);
            AfterOp::Next {
                next_due: after,
                skipped: Some((due, passed + 1)),
            }
        }
        None => AfterOp::Next {
            next_due,
            skipped: None,
        },
    }
}

/// A schedule's state as operators see it (derived, never stored).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleState {
    /// Enabled, waiting for its next due time.
    Waiting,
    /// The op its current due time fired is live.
    Running,
    /// Paused: its due times are not fired until it is resumed.
    Paused,
    /// Disabled: a finished one-shot, or its run is over.
    Done,
}

impl ScheduleState {
    /// The rule: a disabled schedule is done, whatever else holds; then a
    /// paused one is paused; then one holding a live op is running.
    pub fn of(enabled: bool, paused: bool, running: bool) -> ScheduleState {
        match (enabled, paused, running) {
            (false, _, _) => ScheduleState::Done,
            (true, true, _) => ScheduleState::Paused,
            (true, false, true) => ScheduleState::Running,
            (true, false, false) => ScheduleState::Waiting,
        }
    }

    /// The state's wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            ScheduleState::Waiting => "waiting",
            ScheduleState::Running => "running",
            ScheduleState::Paused => "paused",
            ScheduleState::Done => "done",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedules_state_and_when() {
        use ScheduleState::*;
        // (enabled, paused, running) -> state
        let table = [
            ((true, false, false), Waiting),
            ((true, false, true), Running),
            ((true, true, false), Paused),
            ((true, true, true), Paused),
            ((false, false, false), Done),
            ((false, true, false), Done),
            ((false, false, true), Done),
            ((false, true, true), Done),
        ];
        for ((enabled, paused, running), want) in table {
            let got = ScheduleState::of(enabled, paused, running);
            assert_eq!(
                got, want,
                "enabled={enabled} paused={paused} running={running}"
            );
            let wire = serde_json::to_value(got).unwrap();
            assert_eq!(wire, got.as_str());
        }
        let when = |kind: &str, spec: &str| Timing::parse(kind, spec).unwrap().when();
        assert_eq!(when("cron", "*/5  * * * *"), "*/5 * * * *");
        assert_eq!(when("every", "90"), "every 90s");
        assert_eq!(
            when("at", "2026-11-29T01:02:03+01:00"),
            "at 2026-11-29T00:02:03.000Z"
        );
    }

    #[test]
    fn what_a_refused_fire_does() {
        use AfterRefusal::*;
        use FireRefusal::*;
        let table = [
            (RunOver, false, End),
            (RunOver, true, End),
            (RunGone, false, End),
            (RunGone, true, End),
            (Passing, false, Postpone),
            (Passing, true, Skip),
            (Budget, false, Skip),
            (Budget, true, Skip),
        ];
        for (why, recurring, want) in table {
            assert_eq!(
                after_refusal(why, recurring),
                want,
                "{why:?} recurring={recurring}"
            );
        }
    }

    const MIN: i64 = 60_000;

    fn t(s: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(s)
            .unwrap_or_else(|e| panic!("{e}"))
            .timestamp_millis()
    }

    #[test]
    fn exactly_one_timing_and_clear_errors() {
        assert!(Timing::from_request(Some("*/5 * * * *"), None, None).is_ok());
        assert!(Timing::from_request(None, Some(1), None).is_ok());
        assert!(Timing::from_request(None, None, Some("2026-12-01T10:00:00Z")).is_ok());
        for bad in [
            Timing::from_request(None, None, None),
            Timing::from_request(Some("* * * * *"), Some(1), None),
            Timing::from_request(Some("* * * * * *"), None, None),
            Timing::from_request(Some("61 * * * *"), None, None),
            Timing::from_request(None, Some(0), None),
            Timing::from_request(None, None, Some("tomorrow")),
        ] {
            assert!(bad.is_err(), "{bad:?}");
        }
        let every = Timing::parse("every", "30").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Timing::parse(every.kind(), &every.spec()).ok(), Some(every));
    }

    #[test]
    fn cron_is_utc_and_strictly_after() {
        let c = Timing::parse("cron", "0 3 * * *").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.after(t("2026-11-30T02:59:59Z")),
            Some(t("2026-11-30T03:00:00Z"))
        );
        assert_eq!(
            c.after(t("2026-11-30T03:00:00Z")),
            Some(t("2026-12-01T03:00:00Z"))
        );
        assert_eq!(
            c.after(t("2026-11-30T03:00:00.500Z")),
            Some(t("2026-12-01T03:00:00Z"))
        );
    }

    #[test]
    fn a_series_continues_from_its_due_time() {
        let e = Timing::Every { seconds: 10 };
        let due = 1_000_000;
        assert_eq!(e.after(due), Some(due + 10_000));
        // nothing missed
        assert_eq!(e.next_after_now(due, due + 3_000), (Some(due + 10_000), 0));
        // three slots passed while the previous op ran
        assert_eq!(e.next_after_now(due, due + 35_000), (Some(due + 40_000), 3));
        // exactly on a slot: that slot is passed too (it is not after now)
        assert_eq!(e.next_after_now(due, due + 20_000), (Some(due + 30_000), 2));
        let c = Timing::parse("cron", "*/15 * * * *").unwrap_or_else(|e| panic!("{e}"));
        let due = t("2026-11-30T06:00:00Z");
        assert_eq!(
            c.next_after_now(due, due + 50 * MIN),
            (Some(t("2026-11-30T07:00:00Z")), 3)
        );
        let at = Timing::At { at_ms: due };
        assert_eq!(at.next_after_now(due, due + MIN), (None, 0));
    }

    #[test]
    fn the_startup_table() {
        let every = Timing::Every { seconds: 60 };
        let once = Timing::At { at_ms: 0 };
        let now = 10 * MIN;
        // not due yet: nothing, whatever catch_up says
        for timing in [&every, &once] {
            for catch_up in [false, true] {
                assert_eq!(startup(timing, catch_up, now + 1, now), Startup::NotOverdue);
            }
        }
        // overdue by 3 slots and a bit
        let due = now - 3 * MIN - 5_000;
        assert_eq!(startup(&every, true, due, now), Startup::FireOnce { due });
        assert_eq!(startup(&once, true, due, now), Startup::FireOnce { due });
        assert_eq!(startup(&once, false, due, now), Startup::SkipOneShot);
        assert_eq!(
            startup(&every, false, due, now),
            Startup::Advance {
                next: Some(due + 4 * MIN),
                missed: 4
            }
        );
    }

    #[test]
    fn an_ops_end_finalizes_its_schedule() {
        let every = Timing::Every { seconds: 60 };
        let once = Timing::At { at_ms: 1_000 };
        let min = 60_000;
        // (timing, delete_after_success, succeeded, run_over, next_due, now) -> after
        let table = [
            (&once, true, true, false, None, 5_000, AfterOp::Delete),
            (&once, true, false, false, None, 5_000, AfterOp::Disable),
            (&once, false, true, false, None, 5_000, AfterOp::Disable),
            // re-timed while its op ran (a declared one-shot's new time)
            (
                &once,
                false,
                true,
                false,
                Some(20 * min),
                5_000,
                AfterOp::Next {
                    next_due: Some(20 * min),
                    skipped: None,
                },
            ),
            (
                &once,
                false,
                true,
                true,
                Some(20 * min),
                5_000,
                AfterOp::Disable,
            ),
            (
                &every,
                true,
                true,
                true,
                Some(10 * min),
                5_000,
                AfterOp::Disable,
            ),
            (
                &every,
                false,
                true,
                false,
                Some(10 * min),
                5 * min,
                AfterOp::Next {
                    next_due: Some(10 * min),
                    skipped: None,
                },
            ),
            // the op outlived three due times (10, 11, 12 min): skipped,
            // the series goes on after now
            (
                &every,
                false,
                false,
                false,
                Some(10 * min),
                12 * min + 30_000,
                AfterOp::Next {
                    next_due: Some(13 * min),
                    skipped: Some((10 * min, 3)),
                },
            ),
        ];
        for (timing, delete, ok, over, next, now, want) in table {
            assert_eq!(
                after_op(timing, delete, ok, over, next, now),
                want,
                "{timing:?} delete={delete} ok={ok} over={over} next={next:?} now={now}"
            );
        }
    }
}
