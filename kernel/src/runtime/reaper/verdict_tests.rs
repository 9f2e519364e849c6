//! The reaper's pure decisions (`decide_reap`, `verdict`, `scratch_fate`).

use super::*;

fn removable() -> ReapFacts {
    ReapFacts {
        run_id: Some("r".into()),
        scratch_key_matches: true,
        running: true,
        idle_ms: 7_200_000,
        ttl_ms: 3_600_000,
        ..ReapFacts::default()
    }
}

#[test]
fn decide_reap_keeps_anything_live_or_undecidable() {
    assert!(matches!(verdict(&removable()), Verdict::Remove(_)));
    let keep = |change: &dyn Fn(&mut ReapFacts), why: &str| {
        let mut f = removable();
        change(&mut f);
        let Verdict::Keep(reason) = verdict(&f) else {
            panic!("removed, though {why}");
        };
        let reason = reason.to_string();
        assert!(reason.contains(why), "{reason} lacks {why}");
    };
    keep(&|f| f.run_id = None, "run label");
    keep(&|f| f.scratch_key_matches = false, "scratch key");
    keep(
        &|f| f.owned = Err("/other/home".into()),
        "another kernel home",
    );
    keep(
        &|f| f.live_op = Some(("o1".into(), "starting".into())),
        "op o1 is starting",
    );
    keep(
        &|f| f.marked_process = Ok(Some("op x still has processes".into())),
        "still has processes",
    );
    keep(
        &|f| f.marked_process = Err("timeout".into()),
        "cannot probe",
    );
    keep(
        &|f| f.unknown_process = Ok(Some("python x.py".into())),
        "unknown process",
    );
    keep(&|f| f.unknown_process = Err("gone".into()), "process table");
    keep(&|f| f.idle_ms = 10_000, "below the 3600s ttl");
    // a finished run goes at once; a stopped container is not probed
    let mut f = removable();
    f.run_finished = true;
    f.idle_ms = 0;
    assert_eq!(verdict(&f), Verdict::Remove(RemoveReason::RunFinished));
    assert_eq!(verdict(&f).to_string(), "run finished and no op is live");
    let mut f = removable();
    f.running = false;
    f.marked_process = Err("not running".into());
    assert!(matches!(verdict(&f), Verdict::Remove(_)));
}

#[test]
fn decide_reap_decides_each_container_on_its_own_facts() {
    let named = |id: &str, change: &dyn Fn(&mut ReapFacts)| {
        let mut f = removable();
        f.container_id = id.into();
        f.name = format!("opk-{id}");
        f.run_label = Some("r".into());
        change(&mut f);
        f
    };
    let facts = [
        named("a", &|_| {}),
        named("b", &|f| f.live_op = Some(("o".into(), "running".into()))),
        named("c", &|f| {
            f.run_id = None;
            f.run_label = Some("../bad".into());
        }),
    ];
    let got: Vec<(String, ReapAction, Option<String>)> = decide_reap(&facts)
        .into_iter()
        .map(|d| (d.container_id, d.action, d.run_id))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a".into(), ReapAction::Remove, Some("r".into())),
            ("b".into(), ReapAction::Keep, Some("r".into())),
            ("c".into(), ReapAction::Keep, Some("../bad".into())),
        ]
    );
    assert!(
        decide_reap(&facts).iter().all(|d| !d.removed),
        "deciding removes nothing"
    );
    assert!(decide_reap(&[]).is_empty());
}

#[test]
fn a_scratch_dir_goes_with_the_last_container_once_delivered() {
    assert_eq!(scratch_fate(Some(false), true), ScratchFate::Remove);
    assert!(
        matches!(scratch_fate(Some(false), false), ScratchFate::Keep(w) if w.contains("delivered"))
    );
    assert!(
        matches!(scratch_fate(Some(true), true), ScratchFate::Keep(w) if w.contains("other container"))
    );
    // the container list could not be had: keep
    assert!(matches!(scratch_fate(None, true), ScratchFate::Keep(_)));
}

#[test]
fn idle_processes_are_recognised() {
    assert!(super::is_idle_process(
        "/sbin/docker-init -- /bin/sh -c while :; do sleep 3600; done"
    ));
    assert!(super::is_idle_process("sleep 3600"));
    assert!(super::is_idle_process("/.opkernel/shim idle"));
    assert!(super::is_idle_process("/.opkernel/shim serve"));
    assert!(super::is_idle_process(
        "/sbin/docker-init -- /.opkernel/shim idle"
    ));
    assert!(!super::is_idle_process("/.opkernel/shim launch x"));
    assert!(!super::is_idle_process("python server.py"));
}
