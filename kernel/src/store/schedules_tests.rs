use super::*;
use crate::lifecycle::Outcome;
use crate::store::Admission;
use crate::store::{test_store, Settlement};

fn every(run: &str, seconds: u64, catch_up: bool) -> NewSchedule {
    NewSchedule {
        run_id: run.into(),
        command: vec!["true".into()],
        timeout_sec: 60,
        timing: Timing::Every { seconds },
        catch_up,
        delete_after_success: false,
    }
}

async fn create(store: &Store, new: NewSchedule) -> Schedule {
    store.create_schedule(new).await.unwrap().unwrap()
}

/// Moves a schedule's next due time (as the clock passing would).
async fn set_due(store: &Store, id: &str, due: i64) {
    let id = id.to_owned();
    store
        .write(move |tx| {
            tx.execute(
                "UPDATE schedules SET next_due_at = ?2 WHERE id = ?1",
                vals![&id, due],
            )?;
            Ok(())
        })
        .await
        .unwrap();
}

async fn fire(store: &Store, id: &str, due: i64) -> Fire {
    store
        .fire_schedule(id, due, "k1", None, Admission::UNLIMITED)
        .await
        .unwrap()
}

async fn finish(store: &Store, op: &str, code: i32) {
    let settled = store
        .settle(
            op,
            Settlement {
                outcome: Outcome::Completed {
                    exit_code: code,
                    killed: false,
                },
                output_tail: Some("x".repeat(10_000)),
                log: None,
                usage: None,
                leftovers: 0,
                ended_at: None,
                charge_cap_ms: None,
            },
        )
        .await
        .unwrap();
    assert!(settled);
}

async fn kinds(store: &Store, run: &str) -> Vec<String> {
    store
        .events_after(run, 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind.name().to_owned())
        .collect()
}

#[tokio::test]
async fn two_schedulers_racing_fire_a_due_time_once() {
    // two kernels' connections on one control plane, as two scheduler loops
    let path = std::env::temp_dir().join(format!("opkernel-race-{}.db", uuid::Uuid::new_v4()));
    let a = Store::open(&path, Default::default()).unwrap();
    let b = Store::open(&path, Default::default()).unwrap();
    let s = create(&a, every("r", 60, false)).await;
    let base = now_ms() - 100_000;
    for round in 0..20 {
        let due = base + round * 1000;
        set_due(&a, &s.id, due).await;
        let (x, y) = tokio::join!(
            a.fire_schedule(&s.id, due, "ka", None, Admission::UNLIMITED),
            b.fire_schedule(&s.id, due, "kb", None, Admission::UNLIMITED)
        );
        let fired: Vec<Op> = [x.unwrap(), y.unwrap()]
            .into_iter()
            .filter_map(|f| match f {
                Fire::Fired(op) => Some(op),
                Fire::NotDue => None,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(fired.len(), 1, "round {round}");
        finish(&a, &fired[0].id, 0).await;
    }
    let ops = a.list_ops(Some("r".into()), 100).await.unwrap();
    assert_eq!(ops.len(), 20, "one op per due time");
    // the same due time never fires twice, even after finalization
    let due = now_ms() - 5000;
    set_due(&a, &s.id, due).await;
    let Fire::Fired(op) = fire(&a, &s.id, due).await else {
        panic!()
    };
    finish(&a, &op.id, 0).await;
    set_due(&a, &s.id, due).await;
    assert!(matches!(fire(&b, &s.id, due).await, Fire::NotDue));
    assert_eq!(a.list_ops(Some("r".into()), 100).await.unwrap().len(), 21);
}

#[tokio::test]
async fn finalization_records_a_bounded_result_and_reschedules_from_the_due_time() {
    let store = test_store().await;
    let s = create(&store, every("r", 10, false)).await;
    let due = now_ms() - 100;
    set_due(&store, &s.id, due).await;
    let Fire::Fired(op) = fire(&store, &s.id, due).await else {
        panic!()
    };
    assert_eq!(op.schedule_id.as_deref(), Some(s.id.as_str()));
    // claimed while its op lives: not due again
    assert!(store
        .due_schedules(now_ms() + 60_000, 10)
        .await
        .unwrap()
        .is_empty());
    finish(&store, &op.id, 3).await;
    let s = store.get_schedule(&s.id).await.unwrap().unwrap();
    assert_eq!(s.next_due_at, Some(due + 10_000));
    assert_eq!(
        (s.last_status.as_deref(), s.last_exit_code),
        (Some("completed"), Some(3))
    );
    assert_eq!(
        s.last_output_tail.as_ref().map(String::len),
        Some(MAX_LAST_TAIL)
    );
    assert_eq!((s.claimed_at, s.current_op_id.as_deref()), (None, None));
    // an op that outlives three slots: they are skipped, with an event
    let due = now_ms() - 35_000;
    set_due(&store, &s.id, due).await;
    let Fire::Fired(op) = fire(&store, &s.id, due).await else {
        panic!()
    };
    let fired = store.get_schedule(&s.id).await.unwrap().unwrap();
    assert_eq!(
        fired.next_due_at,
        Some(due + 40_000),
        "the catch-up fires once"
    );
    set_due(&store, &s.id, due + 10_000).await;
    // (as if the op ran through the next slots)
    finish(&store, &op.id, 0).await;
    let s = store.get_schedule(&s.id).await.unwrap().unwrap();
    assert_eq!(s.next_due_at, Some(due + 40_000));
    let events = store.events_after("r", 0, 100).await.unwrap();
    let skipped = events
        .iter()
        .find_map(|e| match &e.kind {
            crate::event_kind::EventKind::ScheduleSkipped(skipped) => Some(skipped),
            _ => None,
        })
        .unwrap();
    assert_eq!(skipped.reason, "previous still running");
    assert_eq!(skipped.slots, Some(3));
}

#[tokio::test]
async fn one_shots_are_deleted_after_success_or_disabled() {
    let store = test_store().await;
    let at = |delete_after_success| NewSchedule {
        timing: Timing::At {
            at_ms: now_ms() - 10,
        },
        delete_after_success,
        ..every("r", 1, false)
    };
    for (delete, code, kept) in [(true, 0, false), (true, 1, true), (false, 0, true)] {
        let s = create(&store, at(delete)).await;
        let due = s.next_due_at.unwrap();
        let Fire::Fired(op) = fire(&store, &s.id, due).await else {
            panic!()
        };
        finish(&store, &op.id, code).await;
        let after = store.get_schedule(&s.id).await.unwrap();
        assert_eq!(after.is_some(), kept, "delete={delete} code={code}");
        if let Some(after) = after {
            assert!(!after.enabled && after.next_due_at.is_none());
        }
    }
}

#[tokio::test]
async fn start_up_follows_catch_up() {
    let store = test_store().await;
    let now = now_ms();
    let overdue = now - 3_500;
    let mk = |catch_up, one_shot: bool| NewSchedule {
        timing: if one_shot {
            Timing::At { at_ms: overdue }
        } else {
            Timing::Every { seconds: 1 }
        },
        ..every("r", 1, catch_up)
    };
    let recurring_off = create(&store, mk(false, false)).await;
    let recurring_on = create(&store, mk(true, false)).await;
    let once_off = create(&store, mk(false, true)).await;
    let once_on = create(&store, mk(true, true)).await;
    for s in [&recurring_off, &recurring_on] {
        set_due(&store, &s.id, overdue).await;
    }
    let report = store.schedules_at_start("k2").await.unwrap();
    assert_eq!(
        (report.advanced, report.skipped, report.catching_up),
        (1, 1, 2)
    );
    // catch_up false: no run record; the recurring one moves to a future slot
    let r = store
        .get_schedule(&recurring_off.id)
        .await
        .unwrap()
        .unwrap();
    assert!(r.next_due_at.unwrap() > now_ms() - 50 && r.last_op_id.is_none());
    let o = store.get_schedule(&once_off.id).await.unwrap().unwrap();
    assert!(!o.enabled && o.last_status.as_deref() == Some("skipped"));
    // catch_up true: left due, and one fire covers every missed slot
    let due = store.due_schedules(now_ms(), 10).await.unwrap();
    let ids: Vec<&str> = due.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&recurring_on.id.as_str()) && ids.contains(&once_on.id.as_str()));
    let Fire::Fired(_) = fire(&store, &recurring_on.id, overdue).await else {
        panic!()
    };
    let r = store.get_schedule(&recurring_on.id).await.unwrap().unwrap();
    assert!(r.next_due_at.unwrap() > now_ms() - 50);
    assert!(store.list_ops(Some("r".into()), 10).await.unwrap().len() == 1);
    // no run record for the skipped ones, a skip event for each
    let k = kinds(&store, "r").await;
    assert_eq!(k.iter().filter(|k| *k == "schedule.skipped").count(), 2);
    assert_eq!(k.iter().filter(|k| *k == "schedule.fired").count(), 1);
}

#[tokio::test]
async fn a_claim_left_by_a_dead_kernel_is_taken_over_or_cleared() {
    let store = test_store().await;
    let s = create(&store, every("r", 60, false)).await;
    let due = now_ms() - 10;
    set_due(&store, &s.id, due).await;
    let Fire::Fired(op) = fire(&store, &s.id, due).await else {
        panic!()
    };
    // the op still runs: the new kernel takes the claim over
    let report = store.schedules_at_start("k2").await.unwrap();
    assert_eq!(report.adopted, 1);
    let s2 = store.get_schedule(&s.id).await.unwrap().unwrap();
    assert_eq!(s2.claimed_by.as_deref(), Some("k2"));
    // a claim with no op behind it (as a torn write would leave) is cleared
    let id = s.id.clone();
    store
        .write(move |tx| {
            tx.execute(
                "UPDATE schedules SET current_op_id = NULL WHERE id = ?1",
                vals![&id],
            )?;
            Ok(())
        })
        .await
        .unwrap();
    let report = store.schedules_at_start("k3").await.unwrap();
    assert_eq!(report.cleared, 1);
    assert_eq!(
        store.get_schedule(&s.id).await.unwrap().unwrap().claimed_at,
        None
    );
    // the due time's op is found by its key: never a second op for it
    set_due(&store, &s.id, due).await;
    assert!(matches!(fire(&store, &s.id, due).await, Fire::Adopted(o) if o.id == op.id));
}

#[tokio::test]
async fn a_refused_fire_is_a_skip_with_its_reason() {
    let store = test_store().await;
    let s = create(&store, every("r", 60, false)).await;
    store.ensure_run("r", None).await.unwrap();
    store
        .change_run("r", crate::runs::RunAction::Pause, "operator", None)
        .await
        .unwrap();
    let due = now_ms() - 10;
    set_due(&store, &s.id, due).await;
    match fire(&store, &s.id, due).await {
        Fire::Skipped(reason) => assert!(reason.contains("paused"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let after = store.get_schedule(&s.id).await.unwrap().unwrap();
    assert_eq!(after.next_due_at, Some(due + 60_000));
    assert_eq!(after.claimed_at, None);
    assert!(store
        .list_ops(Some("r".into()), 10)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_one_shot_refused_for_a_passing_reason_waits_and_is_not_lost() {
    let store = test_store().await;
    store.ensure_run("r", None).await.unwrap();
    let s = create(
        &store,
        NewSchedule {
            timing: Timing::At {
                at_ms: now_ms() - 10,
            },
            ..every("r", 1, false)
        },
    )
    .await;
    store
        .change_run("r", crate::runs::RunAction::Pause, "operator", None)
        .await
        .unwrap();
    for _ in 0..3 {
        // each retry comes due (as the clock passing would)
        let due = now_ms() - 1;
        set_due(&store, &s.id, due).await;
        assert!(matches!(fire(&store, &s.id, due).await, Fire::Skipped(_)));
        let after = store.get_schedule(&s.id).await.unwrap().unwrap();
        assert!(after.enabled, "still to run");
        assert!(after.next_due_at.unwrap() > now_ms());
    }
    // the first refusal is in the trace, not every retry
    let k = kinds(&store, "r").await;
    assert_eq!(
        k.iter().filter(|k| *k == "schedule.skipped").count(),
        1,
        "{k:?}"
    );
    store
        .change_run("r", crate::runs::RunAction::Resume, "operator", None)
        .await
        .unwrap();
    let due = now_ms() - 1;
    set_due(&store, &s.id, due).await;
    assert!(matches!(fire(&store, &s.id, due).await, Fire::Fired(_)));
}

/// Makes one column of a schedule row unreadable (as a bad write or a
/// hand edit would).
async fn corrupt(store: &Store, id: &str, column: &'static str, value: crate::store::db::Value) {
    let id = id.to_owned();
    store
        .write(move |tx| {
            tx.execute(
                &format!("UPDATE schedules SET {column} = ?2 WHERE id = ?1"),
                vals![&id, value.clone()],
            )?;
            Ok(())
        })
        .await
        .unwrap();
}

/// A row the kernel cannot read (garbage command JSON, an unparsable
/// timing; due, or holding a dead kernel's claim) is left out and never
/// stops the others: start-up still applies its rules to them, and the
/// due ones still come out and fire.
#[tokio::test]
async fn a_corrupt_row_never_stops_the_others() {
    let store = test_store().await;
    let now = now_ms();
    let overdue = now - 3_500;
    let bad_command = create(&store, every("r", 1, true)).await;
    let bad_timing = create(&store, every("r", 1, true)).await;
    let bad_claimed = create(&store, every("r", 1, true)).await;
    let catching_up = create(&store, every("r", 1, true)).await;
    let advancing = create(&store, every("r", 1, false)).await;
    for s in [
        &bad_command,
        &bad_timing,
        &bad_claimed,
        &catching_up,
        &advancing,
    ] {
        set_due(&store, &s.id, overdue).await;
    }
    corrupt(&store, &bad_command.id, "command", "not json".into()).await;
    corrupt(&store, &bad_timing.id, "spec", "every blue moon".into()).await;
    corrupt(&store, &bad_claimed.id, "command", "[1, 2".into()).await;
    corrupt(&store, &bad_claimed.id, "claimed_at", 1i64.into()).await;
    let report = store.schedules_at_start("k2").await.unwrap();
    assert_eq!((report.advanced, report.catching_up), (1, 1), "{report:?}");
    let due = store.due_schedules(now_ms(), 10).await.unwrap();
    let ids: Vec<&str> = due.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, vec![catching_up.id.as_str()]);
    let Fire::Fired(_) = fire(&store, &catching_up.id, overdue).await else {
        panic!("the readable due schedule did not fire")
    };
    let a = store.get_schedule(&advancing.id).await.unwrap().unwrap();
    assert!(a.next_due_at.unwrap() > now_ms() - 50);
}

#[tokio::test]
async fn a_node_starting_beside_a_live_one_misses_only_what_it_missed_too() {
    let store = test_store().await;
    let store = store
        .with_options(crate::store::StoreOptions {
            node: Some("n1".into()),
            ..Default::default()
        })
        .await;
    let n2 = store
        .join_node("n2", "http://n2:7878", 60_000)
        .await
        .unwrap();
    store
        .join_node("n1", "http://n1:7878", 60_000)
        .await
        .unwrap();
    // n2 has been up for 10 s
    store
        .write(|tx| {
            tx.execute(
                "UPDATE nodes SET joined_at = joined_at - 10000 WHERE name = 'n2'",
                vals![],
            )?;
            Ok(())
        })
        .await
        .unwrap();
    let seen = create(&store, every("r", 1, false)).await;
    let missed = create(&store, every("r", 1, false)).await;
    let now = now_ms();
    set_due(&store, &seen.id, now - 3_500).await;
    set_due(&store, &missed.id, now - 30_000).await;
    // due while n2 was up: its scheduler fires it, nothing was missed;
    // due before: the whole cluster was down then, the rule applies
    let report = store.schedules_at_start("k-n1").await.unwrap();
    assert_eq!((report.advanced, report.skipped), (1, 0), "{report:?}");
    let left = store.get_schedule(&seen.id).await.unwrap().unwrap();
    assert_eq!(left.next_due_at, Some(now - 3_500));
    let moved = store.get_schedule(&missed.id).await.unwrap().unwrap();
    assert!(moved.next_due_at.unwrap() > now - 50);
    // n2's lease lapsed too: nobody saw the first one either
    assert!(store.renew_lease("n2", n2, -1, (0, 0)).await.unwrap());
    let report = store.schedules_at_start("k-n1").await.unwrap();
    assert_eq!(report.advanced, 1, "{report:?}");
}
