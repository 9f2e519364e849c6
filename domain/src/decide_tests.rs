//! Table tests of the decision core: one row per situation, each named for
//! the invariant of ARCHITECTURE.md it holds.

use super::*;
use crate::wake::Wakes;

const SEC: Duration = Duration::from_secs(1);

fn rec() -> PidRecord {
    PidRecord {
        pid: 42,
        start_ticks: 1000,
        hostname: "box".into(),
    }
}

struct World {
    t0: Instant,
}

impl World {
    fn new() -> World {
        World { t0: Instant::now() }
    }
    fn at(&self, secs: u64) -> Instant {
        self.t0 + Duration::from_secs(secs)
    }
    /// A confirmed op with its pid recorded, started at t0, timeout 100 s,
    /// evidence window 10 s, grace 60 s, kill grace 5 s.
    fn running(&self) -> State {
        State {
            start: Start::Confirmed,
            handover: None,
            pid: Some(rec()),
            kill: None,
            root_mode: false,
            timeout_at: self.at(100),
            evidence_by: self.at(10),
            next_tick: self.at(5),
            unreachable_since: None,
            timing: Timing {
                kill_grace: 5 * SEC,
                grace: 60 * SEC,
                start_evidence: 10 * SEC,
            },
        }
    }
    fn step(&self, secs: u64) -> Evidence {
        Evidence::new(self.at(secs), Wakes::NONE, CodeFile::Missing)
    }
}

fn seen(shim: ShimProcess, marked: bool, fresh: bool) -> Option<Probe> {
    Some(Probe {
        view: ProbeView::Seen { shim, marked },
        fresh,
    })
}

fn failed(view: ProbeView, fresh: bool) -> Option<Probe> {
    Some(Probe { view, fresh })
}

fn settled(action: &Action) -> Option<&Outcome> {
    match action {
        Action::Settle(outcome) => Some(outcome),
        _ => None,
    }
}

fn is_lost(action: &Action) -> bool {
    matches!(action, Action::Settle(Outcome::Lost { .. }))
}

fn completed(code: i32, killed: bool) -> Action {
    Action::Settle(Outcome::Completed {
        exit_code: code,
        killed,
    })
}

type Case = (&'static str, State, Evidence, fn(&Action) -> bool);

fn check(cases: Vec<Case>) {
    let mut failures = Vec::new();
    for (name, state, evidence, ok) in cases {
        let action = next(&state, &evidence);
        if !ok(&action) {
            failures.push(format!("{name}: got {action:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn a_recorded_result_beats_the_container() {
    let w = World::new();
    let alarm = |secs, code, probe| Evidence {
        wakes: Wakes::of(&[Wake::Alarm]),
        code,
        probe,
        ..w.step(secs)
    };
    let mut unreachable = w.running();
    unreachable.unreachable_since = Some(w.at(0));
    check(vec![
        (
            "code and a removed container",
            w.running(),
            alarm(1, CodeFile::Recorded(3), failed(ProbeView::Gone, true)),
            |a| *a == completed(3, false),
        ),
        (
            "code and an unreachable daemon past the grace",
            unreachable,
            alarm(
                90,
                CodeFile::Recorded(0),
                failed(ProbeView::Unreachable("down".into()), false),
            ),
            |a| *a == completed(0, false),
        ),
        (
            "code and a dead wrapper",
            w.running(),
            alarm(
                1,
                CodeFile::Recorded(7),
                seen(ShimProcess::Absent, false, true),
            ),
            |a| *a == completed(7, false),
        ),
        (
            "code before any pid was recorded",
            State {
                pid: None,
                ..w.running()
            },
            w.step(1).with_code(CodeFile::Recorded(0)),
            |a| *a == completed(0, false),
        ),
        (
            "no code: a removed container is lost",
            w.running(),
            alarm(1, CodeFile::Missing, failed(ProbeView::Gone, false)),
            is_lost,
        ),
        (
            "no code: a stopped container is lost",
            w.running(),
            alarm(1, CodeFile::Missing, failed(ProbeView::Stopped, false)),
            is_lost,
        ),
    ]);
}

impl Evidence {
    fn with_code(self, code: CodeFile) -> Evidence {
        Evidence { code, ..self }
    }
}

#[test]
fn lost_is_never_zero_and_completion_carries_the_recorded_code() {
    // every combination of the step's facts: a Completed outcome only ever
    // carries the code the wrapper recorded, and Lost carries none by type
    let w = World::new();
    let codes = [
        CodeFile::Missing,
        CodeFile::Recorded(0),
        CodeFile::Recorded(5),
        CodeFile::Unusable("garbage".into()),
    ];
    let probes = [
        None,
        seen(ShimProcess::Alive, true, true),
        seen(ShimProcess::Absent, false, true),
        seen(ShimProcess::PidReused, false, false),
        failed(ProbeView::Gone, true),
        failed(ProbeView::Unreachable("x".into()), true),
    ];
    let ends = [
        None,
        Some(LaunchEnd::Exited(0)),
        Some(LaunchEnd::Exited(5)),
        Some(LaunchEnd::Running),
    ];
    let mut seen_outcomes = 0;
    for root_mode in [false, true] {
        for code in &codes {
            for probe in &probes {
                for end in &ends {
                    for wakes in [Wakes::NONE, Wakes::of(&[Wake::Alarm])] {
                        let state = State {
                            root_mode,
                            ..w.running()
                        };
                        let e = Evidence {
                            wakes,
                            code: code.clone(),
                            probe: probe.clone(),
                            launch_end: end.clone(),
                            ..w.step(200)
                        };
                        let action = next(&state, &e);
                        match settled(&action) {
                            Some(Outcome::Completed { exit_code, .. })
                            | Some(Outcome::TimedOut {
                                exit_code: Some(exit_code),
                                ..
                            }) => {
                                seen_outcomes += 1;
                                assert_eq!(
                                    *code,
                                    CodeFile::Recorded(*exit_code),
                                    "{action:?} from {e:?}"
                                );
                            }
                            Some(Outcome::Failed { .. }) => {
                                panic!("an attached op never fails: {action:?} from {e:?}")
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    assert!(seen_outcomes > 0);
}

#[test]
fn a_code_is_believed_only_from_an_identity_checked_wrapper() {
    let w = World::new();
    let root = || State {
        root_mode: true,
        ..w.running()
    };
    let step = |code, probe, end| Evidence {
        code,
        probe,
        launch_end: end,
        ..w.step(1)
    };
    check(vec![
        (
            "root: a code next to a live wrapper is ignored for now",
            root(),
            step(
                CodeFile::Recorded(0),
                seen(ShimProcess::Alive, true, true),
                None,
            ),
            |a| *a == Action::Wait(RECHECK),
        ),
        (
            "root: a cached probe is no proof; probe afresh",
            root(),
            step(
                CodeFile::Recorded(0),
                seen(ShimProcess::Absent, false, false),
                None,
            ),
            |a| *a == Action::Probe { fresh: true },
        ),
        (
            "root: a failed probe is no proof of death",
            root(),
            step(
                CodeFile::Recorded(0),
                failed(ProbeView::Unreachable("x".into()), true),
                None,
            ),
            |a| *a == Action::Wait(RECHECK),
        ),
        (
            "root: wrapper gone, ask how its launch ended",
            root(),
            step(
                CodeFile::Recorded(0),
                seen(ShimProcess::Absent, false, true),
                None,
            ),
            |a| *a == Action::AskLaunchEnd,
        ),
        (
            "root: the launch ended with the same code",
            root(),
            step(
                CodeFile::Recorded(3),
                seen(ShimProcess::Absent, false, true),
                Some(LaunchEnd::Exited(3)),
            ),
            |a| *a == completed(3, false),
        ),
        (
            "root: a forged code (launch ended otherwise) is lost",
            root(),
            step(
                CodeFile::Recorded(0),
                seen(ShimProcess::PidReused, false, true),
                Some(LaunchEnd::Exited(137)),
            ),
            is_lost,
        ),
        (
            "root: no launch recorded, nothing corroborates",
            root(),
            step(
                CodeFile::Recorded(0),
                seen(ShimProcess::Absent, false, true),
                Some(LaunchEnd::NotRecorded),
            ),
            is_lost,
        ),
        (
            "root: a code awaiting its launch's end beats a vanish alarm",
            root(),
            Evidence {
                wakes: Wakes::of(&[Wake::Alarm]),
                ..step(
                    CodeFile::Recorded(0),
                    seen(ShimProcess::Absent, false, true),
                    Some(LaunchEnd::Running),
                )
            },
            |a| *a == Action::Wait(RECHECK),
        ),
        (
            "root: ... and a kill's vanish verdict",
            State {
                kill: Some(Kill {
                    reason: KillReason::Kill,
                    phase: KillPhase::KillSent { at: w.at(0) },
                    signalled: true,
                    intent: true,
                }),
                ..root()
            },
            step(
                CodeFile::Recorded(143),
                seen(ShimProcess::Absent, false, true),
                Some(LaunchEnd::Unreachable),
            ),
            |a| *a == Action::Wait(RECHECK),
        ),
        (
            "root: the launch still runs",
            root(),
            step(
                CodeFile::Recorded(0),
                seen(ShimProcess::Absent, false, true),
                Some(LaunchEnd::Running),
            ),
            |a| *a == Action::Wait(RECHECK),
        ),
        (
            "unusable code while the wrapper lives settles nothing",
            w.running(),
            step(
                CodeFile::Unusable("x".into()),
                seen(ShimProcess::Alive, true, true),
                None,
            ),
            |a| matches!(a, Action::Wait(_)),
        ),
        (
            "unusable code: judged only on a fresh probe",
            w.running(),
            step(CodeFile::Unusable("x".into()), None, None),
            |a| *a == Action::Probe { fresh: true },
        ),
        (
            "unusable code and a dead wrapper: lost",
            w.running(),
            step(
                CodeFile::Unusable("x".into()),
                seen(ShimProcess::Absent, false, true),
                None,
            ),
            is_lost,
        ),
        (
            "unusable code, no pid recorded: wait for the wrapper",
            State {
                pid: None,
                ..w.running()
            },
            step(CodeFile::Unusable("x".into()), None, None),
            |a| matches!(a, Action::Wait(_)),
        ),
    ]);
}

#[test]
fn nothing_is_signalled_or_declared_dead_without_proof() {
    let w = World::new();
    let killing = |phase| State {
        kill: Some(Kill {
            reason: KillReason::Kill,
            phase,
            signalled: false,
            intent: false,
        }),
        ..w.running()
    };
    let unrecorded_kill = State {
        pid: None,
        ..killing(KillPhase::Requested)
    };
    let alarm = |probe| Evidence {
        wakes: Wakes::of(&[Wake::Alarm]),
        probe,
        ..w.step(1)
    };
    check(vec![
        (
            "a kill before the pid is recorded signals nothing",
            unrecorded_kill.clone(),
            w.step(1),
            |a| matches!(a, Action::Wait(d) if *d <= RECHECK),
        ),
        (
            "... and is lost only after the evidence window",
            unrecorded_kill,
            w.step(11),
            is_lost,
        ),
        (
            "TERM goes to the recorded wrapper's identity",
            killing(KillPhase::Requested),
            w.step(1),
            |a| {
                *a == Action::Signal {
                    signal: Signal::Term,
                    rec: rec(),
                }
            },
        ),
        (
            "KILL only after the grace",
            killing(KillPhase::TermSent { at: w.at(1) }),
            w.step(3),
            |a| matches!(a, Action::Wait(_)),
        ),
        (
            "a zero kill grace still waits a recheck between signals",
            State {
                timing: Timing {
                    kill_grace: Duration::ZERO,
                    ..w.running().timing
                },
                ..killing(KillPhase::TermSent { at: w.at(1) })
            },
            w.step(1),
            |a| matches!(a, Action::Wait(_)),
        ),
        (
            "KILL after the grace",
            killing(KillPhase::TermSent { at: w.at(1) }),
            w.step(6),
            |a| {
                matches!(
                    a,
                    Action::Signal {
                        signal: Signal::Kill,
                        ..
                    }
                )
            },
        ),
        (
            "after KILL and a grace, only a fresh probe judges",
            killing(KillPhase::KillSent { at: w.at(1) }),
            w.step(7),
            |a| *a == Action::Probe { fresh: true },
        ),
        (
            "after KILL, a live wrapper gets KILL again",
            killing(KillPhase::KillSent { at: w.at(1) }),
            Evidence {
                probe: seen(ShimProcess::Alive, true, true),
                ..w.step(7)
            },
            |a| {
                matches!(
                    a,
                    Action::Signal {
                        signal: Signal::Kill,
                        ..
                    }
                )
            },
        ),
        (
            "after KILL, a vanished wrapper without a code is lost",
            killing(KillPhase::KillSent { at: w.at(1) }),
            Evidence {
                probe: seen(ShimProcess::Absent, false, true),
                ..w.step(7)
            },
            is_lost,
        ),
        (
            "a cached probe missing the wrapper is not a death verdict",
            w.running(),
            alarm(seen(ShimProcess::Absent, false, false)),
            |a| *a == Action::Probe { fresh: true },
        ),
        (
            "a fresh probe missing the wrapper is",
            w.running(),
            alarm(seen(ShimProcess::Absent, false, true)),
            is_lost,
        ),
        (
            "a probe taken before the pid was recorded is asked again",
            w.running(),
            alarm(seen(ShimProcess::Unknown, false, true)),
            |a| *a == Action::Probe { fresh: true },
        ),
        (
            "a reused pid is not the wrapper",
            w.running(),
            alarm(seen(ShimProcess::PidReused, true, true)),
            is_lost,
        ),
        (
            "an alarm first takes the shared (cached) probe",
            w.running(),
            alarm(None),
            |a| *a == Action::Probe { fresh: false },
        ),
        (
            "no alarm, no tick: no probe at all",
            w.running(),
            w.step(1),
            |a| matches!(a, Action::Wait(_)),
        ),
        (
            "no pid yet but a marked process: alive",
            State {
                pid: None,
                ..w.running()
            },
            Evidence {
                tick: true,
                probe: seen(ShimProcess::Unknown, true, false),
                ..w.step(20)
            },
            |a| matches!(a, Action::Wait(_)),
        ),
        (
            "no pid, nothing marked in a fresh probe, window over: lost",
            State {
                pid: None,
                ..w.running()
            },
            Evidence {
                tick: true,
                probe: seen(ShimProcess::Unknown, false, true),
                ..w.step(20)
            },
            is_lost,
        ),
        (
            "no pid, nothing marked, within the window: wait",
            State {
                pid: None,
                ..w.running()
            },
            Evidence {
                tick: true,
                probe: seen(ShimProcess::Unknown, false, true),
                ..w.step(2)
            },
            |a| matches!(a, Action::Wait(_)),
        ),
    ]);
}

/// The rows of time, kills and starts (a second file: one file stays
/// readable).
#[path = "decide_time_tests.rs"]
mod time;
