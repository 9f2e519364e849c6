//! Table tests of the decision core, continued: unreachable containers,
//! timeouts, kills across restarts, unconfirmed starts, waits, and the
//! launcher's claim.

use super::*;

#[test]
fn an_unreachable_container_is_lost_only_after_the_grace() {
    let w = World::new();
    let since = |secs| State {
        unreachable_since: Some(w.at(secs)),
        ..w.running()
    };
    let alarm = |secs| Evidence {
        wakes: Wakes::of(&[Wake::Alarm]),
        probe: failed(ProbeView::Unreachable("timeout".into()), false),
        ..w.step(secs)
    };
    check(vec![
        ("inside the grace", since(0), alarm(59), |a| {
            matches!(a, Action::Wait(_))
        }),
        ("past the grace", since(0), alarm(60), is_lost),
    ]);
    let mut s = w.running();
    s.observe(
        &failed(ProbeView::Unreachable("x".into()), true).unwrap(),
        w.at(3),
    );
    s.observe(
        &failed(ProbeView::Unreachable("x".into()), true).unwrap(),
        w.at(9),
    );
    assert_eq!(
        s.unreachable_since,
        Some(w.at(3)),
        "the first failure starts the grace"
    );
    s.observe(&seen(ShimProcess::Alive, true, true).unwrap(), w.at(10));
    assert_eq!(s.unreachable_since, None, "an answer ends it");
}

#[test]
fn timeouts_count_from_the_recorded_start() {
    // started 30 s ago with a 60 s budget: due in 30 s by any later reading
    let clock = Clock {
        wall_ms: 1_000_000,
        mono: Instant::now(),
    };
    let started = clock.wall_ms - 30_000;
    let due = clock.instant(started + 60_000);
    assert_eq!(due, clock.mono + 30 * SEC);
    // a restart 20 s later reads both clocks again: the same instant
    let later = Clock {
        wall_ms: clock.wall_ms + 20_000,
        mono: clock.mono + 20 * SEC,
    };
    assert_eq!(later.instant(started + 60_000), due);
    // a deadline already past stays past (no fresh budget after a restart)
    assert!(later.instant(started + 10_000) < later.mono);
    // a later attempt of the same supervision carries the reading forward
    // on the monotonic clock: a wall-clock step between attempts (+2 h
    // here) moves no deadline, where a fresh reading would have put it
    // 2 h in the past
    let carried = clock.at(clock.mono + 20 * SEC);
    assert_eq!(carried.mono, clock.mono + 20 * SEC);
    assert_eq!(carried.instant(started + 60_000), due);
    let stepped = Clock {
        wall_ms: clock.wall_ms + 20_000 + 7_200_000,
        mono: clock.mono + 20 * SEC,
    };
    assert!(
        stepped.instant(started + 60_000) < stepped.mono,
        "a fresh reading is fooled"
    );

    let w = World::new();
    check(vec![
        (
            "before the deadline: wait no longer than it",
            w.running(),
            w.step(90),
            |a| *a == Action::Wait(10 * SEC),
        ),
        (
            "at the deadline: record the timeout request",
            w.running(),
            w.step(100),
            |a| *a == Action::RequestTimeout,
        ),
        (
            "an earlier kill request is not replaced by a timeout",
            State {
                kill: Some(Kill::adopt(KillReason::Kill, false)),
                ..w.running()
            },
            w.step(100),
            |a| {
                matches!(
                    a,
                    Action::Signal {
                        signal: Signal::Term,
                        ..
                    }
                )
            },
        ),
    ]);
}

#[test]
fn a_kill_is_carried_through_restarts() {
    let w = World::new();
    let adopted = |reason, signalled| State {
        kill: Some(Kill::adopt(reason, signalled)),
        ..w.running()
    };
    let intended = |reason| State {
        kill: Some(Kill::adopt(reason, false).with_intent(true)),
        ..w.running()
    };
    let code = |c| w.step(1).with_code(CodeFile::Recorded(c));
    check(vec![
        (
            "signalled before the restart: killed",
            adopted(KillReason::Kill, true),
            code(143),
            |a| *a == completed(143, true),
        ),
        (
            "a timeout signalled before the restart: timed out",
            adopted(KillReason::Timeout, true),
            code(137),
            |a| {
                *a == Action::Settle(Outcome::TimedOut {
                    exit_code: Some(137),
                    killed: true,
                })
            },
        ),
        (
            "never signalled: the command's own result",
            adopted(KillReason::Timeout, false),
            code(0),
            |a| *a == completed(0, false),
        ),
        (
            "TERM landed, the kernel died before recording it: the code is the witness",
            intended(KillReason::Cancel),
            code(143),
            |a| *a == completed(143, true),
        ),
        (
            "a 143 before any signal was about to be sent: the command's own",
            adopted(KillReason::Cancel, false),
            code(143),
            |a| *a == completed(143, false),
        ),
        (
            "KILL landed unrecorded on a timeout: timed out",
            intended(KillReason::Timeout),
            code(137),
            |a| {
                *a == Action::Settle(Outcome::TimedOut {
                    exit_code: Some(137),
                    killed: true,
                })
            },
        ),
        (
            "another code while a kill was asked: the command's own result",
            intended(KillReason::Kill),
            code(1),
            |a| *a == completed(1, false),
        ),
        (
            "the sequence starts over at TERM",
            adopted(KillReason::Kill, true),
            w.step(1),
            |a| {
                matches!(
                    a,
                    Action::Signal {
                        signal: Signal::Term,
                        ..
                    }
                )
            },
        ),
    ]);
    let k = Kill::adopt(KillReason::Kill, false);
    let term = k.sent(Signal::Term, w.at(1), false);
    assert_eq!(term.phase, KillPhase::TermSent { at: w.at(1) });
    assert!(!term.signalled, "a signal that hit nothing does not count");
    assert!(term.sent(Signal::Kill, w.at(6), true).signalled);
    assert!(
        Kill::adopt(KillReason::Kill, true)
            .sent(Signal::Term, w.at(1), false)
            .signalled,
        "a signal before a restart still counts"
    );
}

#[test]
fn an_unconfirmed_start_is_settled_by_evidence_and_never_run_again() {
    let w = World::new();
    let unconfirmed = State {
        start: Start::Unconfirmed,
        pid: None,
        evidence_by: w.at(60),
        ..w.running()
    };
    let step = |secs, code, pid_file, probe| Evidence {
        code,
        pid_file,
        probe,
        ..w.step(secs)
    };
    check(vec![
        (
            "a pid file confirms it",
            unconfirmed.clone(),
            step(1, CodeFile::Missing, Some(rec()), None),
            |a| *a == Action::ConfirmStart,
        ),
        (
            "a code file confirms it (even an unusable one)",
            unconfirmed.clone(),
            step(1, CodeFile::Unusable("x".into()), None, None),
            |a| *a == Action::ConfirmStart,
        ),
        (
            "no file: look for a marked process",
            unconfirmed.clone(),
            step(1, CodeFile::Missing, None, None),
            |a| *a == Action::Probe { fresh: true },
        ),
        (
            "a marked process confirms it",
            unconfirmed.clone(),
            step(
                1,
                CodeFile::Missing,
                None,
                seen(ShimProcess::Unknown, true, true),
            ),
            |a| *a == Action::ConfirmStart,
        ),
        (
            "nothing yet: wait",
            unconfirmed.clone(),
            step(
                59,
                CodeFile::Missing,
                None,
                failed(ProbeView::Unreachable("x".into()), true),
            ),
            |a| *a == Action::Wait(START_POLL),
        ),
        (
            "nothing by the deadline: lost, effect uncertain",
            unconfirmed.clone(),
            step(
                60,
                CodeFile::Missing,
                None,
                seen(ShimProcess::Unknown, false, true),
            ),
            |a| matches!(a, Action::Settle(Outcome::Lost { reason }) if reason.contains("may still have run")),
        ),
        (
            "a kill waits for evidence: nothing to signal",
            State {
                kill: Some(Kill::adopt(KillReason::Kill, false)),
                ..unconfirmed
            },
            step(
                1,
                CodeFile::Missing,
                None,
                seen(ShimProcess::Unknown, false, true),
            ),
            |a| *a == Action::Wait(START_POLL),
        ),
    ]);
}

#[test]
fn the_start_evidence_window_has_one_start() {
    let t = Timing {
        kill_grace: 5 * SEC,
        grace: 60 * SEC,
        start_evidence: 10 * SEC,
    };
    assert_eq!(t.evidence_window(Start::Confirmed), 10 * SEC);
    assert_eq!(t.evidence_window(Start::Unconfirmed), 60 * SEC);
    let clock = Clock {
        wall_ms: 1_000_000,
        mono: Instant::now(),
    };
    // claimed long ago (a restart, or a start request that took the Docker
    // timeout to fail): the window runs from when this attempt watches
    assert_eq!(
        evidence_deadline(&clock, clock.wall_ms - 120_000, 10 * SEC),
        clock.mono + 10 * SEC
    );
    // a claim "in the future" (the wall clock stepped back): from the claim
    assert_eq!(
        evidence_deadline(&clock, clock.wall_ms + 5_000, 10 * SEC),
        clock.mono + 15 * SEC
    );
}

#[test]
fn waits_follow_the_op() {
    let w = World::new();
    let unmonitored = State {
        pid: None,
        ..w.running()
    };
    check(vec![
        (
            "a monitored op sleeps until the timeout",
            w.running(),
            w.step(1),
            |a| *a == Action::Wait(99 * SEC),
        ),
        (
            "an unmonitored op ticks itself",
            unmonitored,
            w.step(1),
            |a| *a == Action::Wait(4 * SEC),
        ),
        (
            "a pid file is recorded before anything else",
            State {
                pid: None,
                kill: Some(Kill::adopt(KillReason::Kill, false)),
                ..w.running()
            },
            Evidence {
                pid_file: Some(rec()),
                ..w.step(1)
            },
            |a| *a == Action::RecordPid(rec()),
        ),
    ]);
}

#[test]
fn the_recorded_container_must_still_be_the_ops() {
    let ok = ContainerFacts {
        identity_matches: true,
        hostname: "box".into(),
    };
    assert_eq!(judge_container(&ok, Some(&rec())), None);
    assert_eq!(judge_container(&ok, None), None);
    let other_host = ContainerFacts {
        hostname: "other".into(),
        ..ok.clone()
    };
    assert!(judge_container(&other_host, Some(&rec())).is_some());
    let foreign = ContainerFacts {
        identity_matches: false,
        ..ok
    };
    assert!(judge_container(&foreign, None).is_some());
}

#[test]
fn a_command_that_never_started_is_failed_never_completed() {
    let w = World::new();
    let not_started = || CodeFile::NotStarted("cannot fork".into());
    let is_failed = |a: &Action| {
        matches!(
            a,
            Action::Settle(Outcome::Failed { error, killed: false }) if error.contains("cannot fork")
        )
    };
    let root = || State {
        root_mode: true,
        ..w.running()
    };
    let step = |probe, end| Evidence {
        code: not_started(),
        probe,
        launch_end: end,
        ..w.step(1)
    };
    let unconfirmed = State {
        start: Start::Unconfirmed,
        pid: None,
        ..w.running()
    };
    check(vec![
        (
            "the shim's not-started record settles failed",
            w.running(),
            step(None, None),
            is_failed,
        ),
        (
            "an unconfirmed start with a not-started record: the shim ran, confirm first",
            unconfirmed,
            step(None, None),
            |a| *a == Action::ConfirmStart,
        ),
        (
            "root: the record next to a live shim is ignored for now",
            root(),
            step(seen(ShimProcess::Alive, true, true), None),
            |a| *a == Action::Wait(RECHECK),
        ),
        (
            "root: believed when the launch ended with 125",
            root(),
            step(
                seen(ShimProcess::Absent, false, true),
                Some(LaunchEnd::Exited(NOT_STARTED_STATUS)),
            ),
            is_failed,
        ),
        (
            "root: a forged record (the launch ended otherwise) is lost",
            root(),
            step(
                seen(ShimProcess::Absent, false, true),
                Some(LaunchEnd::Exited(0)),
            ),
            is_lost,
        ),
    ]);
}

#[test]
fn a_request_for_the_launcher_is_claimed_or_taken_back_never_both() {
    let w = World::new();
    let handed = |handover| State {
        start: Start::Unconfirmed,
        pid: None,
        handover: Some(handover),
        ..w.running()
    };
    let pending = || handed(Handover::Pending { claim_by: w.at(3) });
    let killed = |mut s: State| {
        s.kill = Some(Kill::adopt(KillReason::Kill, false));
        s
    };
    check(vec![
        (
            "pending: wait for the claim, spend no probe (no docker exec)",
            pending(),
            w.step(1),
            |a| *a == Action::Wait(2 * SEC),
        ),
        (
            "pending: the launcher's pid file confirms the start",
            pending(),
            Evidence {
                pid_file: Some(rec()),
                ..w.step(1)
            },
            |a| *a == Action::ConfirmStart,
        ),
        (
            "pending past the claim window: ask for it back",
            pending(),
            w.step(3),
            |a| *a == Action::Withdraw,
        ),
        (
            "pending and killed: ask for it back at once",
            killed(pending()),
            w.step(1),
            |a| *a == Action::Withdraw,
        ),
        (
            "claimed: await its pid file by file events, no probe",
            handed(Handover::Claimed),
            w.step(4),
            |a| *a == Action::Wait(6 * SEC),
        ),
        (
            "claimed and no evidence by the deadline: lost, never run elsewhere",
            handed(Handover::Claimed),
            Evidence {
                probe: failed(ProbeView::Gone, true),
                ..w.step(10)
            },
            is_lost,
        ),
        (
            "returned unclaimed: nothing ran; start it by exec",
            handed(Handover::Returned),
            w.step(4),
            |a| *a == Action::LaunchByExec,
        ),
        (
            "returned and killed: cancelled before start, nothing ran",
            killed(handed(Handover::Returned)),
            w.step(4),
            |a| matches!(a, Action::Settle(Outcome::Failed { killed: true, .. })),
        ),
    ]);
    // a claimed request belongs to the launcher: no exec, the evidence decides
    assert_eq!(
        Handover::after_withdraw(Handback::Claimed),
        Handover::Claimed
    );
    assert_eq!(
        Handover::after_withdraw(Handback::Withdrawn),
        Handover::Returned
    );
    assert_eq!(
        Handover::after_withdraw(Handback::NeverFiled),
        Handover::Returned
    );
}

#[test]
fn a_kill_before_the_claim_fails_the_op_unstarted() {
    assert!(cancelled_before_start(false, true).is_some());
    assert_eq!(
        cancelled_before_start(true, true),
        None,
        "a claimed op is never cancelled as unstarted"
    );
    assert_eq!(cancelled_before_start(false, false), None);
}
