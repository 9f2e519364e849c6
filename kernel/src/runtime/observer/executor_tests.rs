//! The executor on a fake backend: the real control plane (SQLite in a
//! temporary home), real `.ops` files, real inotify; only the backend is
//! scripted. These pin what the executor does with the decision core's
//! actions: one launch per op at most, nothing run after a kill before the
//! claim, evidence (never a re-run) for an unknown start, signals only to
//! the recorded wrapper.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sandbox::backend::prelude::*;
use sandbox::{RunIdentity, Signal};

use crate::runtime::fake_backend::{Fake, Launcher, OnStart, WRAPPER_PID};

use crate::lifecycle::{KillReason, Status};
use crate::runtime::config::Config;
use crate::runtime::kernel::Kernel;
use crate::store::{Admission, NewOp, Op, StartRequest};

struct Harness {
    kernel: Arc<Kernel>,
    fake: Arc<Fake>,
    home: PathBuf,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

async fn harness(on_start: OnStart) -> Harness {
    harness_with(on_start, Launcher::None).await
}

async fn harness_with(on_start: OnStart, launcher: Launcher) -> Harness {
    let home = std::env::temp_dir().join(format!("opk-exec-{}", uuid::Uuid::new_v4().simple()));
    let mut config: Config = crate::app::settings::load::defaults(home.clone());
    config.profile.run_as = Some("1000:1000".into());
    config.ops.grace = Duration::from_millis(600);
    config.ops.start_evidence_window = Duration::from_millis(300);
    config.ops.kill_grace = Duration::from_millis(300);
    config.ops.probe_interval = Duration::from_millis(100);
    config.ops.launcher_claim = Duration::from_millis(300);
    config.drills.on = true;
    let fake = Arc::new(Fake::new(config.scratch_root(), on_start, launcher));
    let kernel = Kernel::open_with(config, fake.clone()).await.unwrap();
    if launcher == Launcher::Claims {
        let fake = fake.clone();
        tokio::spawn(async move {
            loop {
                fake.claim_pending();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
    Harness { kernel, fake, home }
}

impl Harness {
    async fn insert(&self, command: &str) -> Op {
        let req = StartRequest {
            run_id: "r1".into(),
            scratch_key: sandbox::profile::scratch_key("r1"),
            command: vec!["sh".into(), "-c".into(), command.into()],
            background: true,
            timeout_sec: 60,
            io: sandbox::Io::Null,
            idempotency_key: None,
            approval: None,
            schedule_id: None,
            origin: crate::origin::Origin::new(crate::origin::Surface::Http, "test", "operator"),
        };
        match self
            .kernel
            .store
            .insert_op(req, Admission::UNLIMITED)
            .await
            .unwrap()
        {
            NewOp::Created(op) => op,
            other => panic!("not inserted: {other:?}"),
        }
    }

    async fn terminal(&self, id: &str) -> Op {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let op = self.kernel.store.get_op(id).await.unwrap().unwrap();
            if op.status.is_terminal() {
                self.kernel.wait_observer_done(id).await;
                return op;
            }
            assert!(std::time::Instant::now() < deadline, "not terminal: {op:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn starts(&self) -> usize {
        self.fake.starts.lock().len()
    }
}

#[tokio::test]
async fn a_command_is_launched_once_and_its_code_settles_it() {
    let h = harness(OnStart::Exit(3)).await;
    let op = h.insert("exit 3").await;
    super::spawn_fresh(&h.kernel, op.clone());
    let done = h.terminal(&op.id).await;
    assert_eq!((done.status, done.exit_code), (Status::Completed, Some(3)));
    assert_eq!(
        done.pid.map(|p| p.pid),
        None,
        "settled by its code before any pid step"
    );
    assert_eq!(h.starts(), 1);
}

#[tokio::test]
async fn a_kill_before_the_claim_means_nothing_runs() {
    let h = harness(OnStart::Exit(0)).await;
    let op = h.insert("true").await;
    h.kernel
        .store
        .request_kill(&op.id, KillReason::Kill)
        .await
        .unwrap();
    super::spawn(&h.kernel, op.id.clone());
    let done = h.terminal(&op.id).await;
    assert_eq!(done.status, Status::Failed);
    assert!(done.killed);
    assert_eq!(h.starts(), 0, "a cancelled op never reaches the backend");
    assert!(h.fake.launches.lock().is_empty());
}

#[tokio::test]
async fn an_unknown_start_is_settled_by_evidence_never_by_a_second_launch() {
    let h = harness(OnStart::Vanish).await;
    let op = h.insert("echo once").await;
    super::spawn_fresh(&h.kernel, op.clone());
    let done = h.terminal(&op.id).await;
    assert_eq!(done.status, Status::Lost);
    assert_eq!(done.effect.as_deref(), Some("uncertain"));
    assert_eq!(done.exit_code, None, "lost is never 0");
    assert_eq!(h.starts(), 1, "the claim launches once, and only once");
}

#[tokio::test]
async fn a_refused_start_fails_without_a_retry() {
    let h = harness(OnStart::Refuse).await;
    let op = h.insert("true").await;
    super::spawn_fresh(&h.kernel, op.clone());
    let done = h.terminal(&op.id).await;
    assert_eq!(done.status, Status::Failed);
    assert!(done.error.unwrap_or_default().contains("refused"));
    assert_eq!(h.starts(), 1);
}

#[tokio::test]
async fn a_kill_signals_the_recorded_wrapper_identity_and_ends_killed() {
    let h = harness(OnStart::RunUntilSignalled).await;
    let op = h.insert("sleep 600").await;
    super::spawn_fresh(&h.kernel, op.clone());
    // wait for the pid record
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while h
        .kernel
        .store
        .get_op(&op.id)
        .await
        .unwrap()
        .unwrap()
        .pid
        .is_none()
    {
        assert!(std::time::Instant::now() < deadline, "pid never recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.kernel
        .store
        .request_kill(&op.id, KillReason::Kill)
        .await
        .unwrap();
    h.kernel.poke_kill(&op.id);
    let done = h.terminal(&op.id).await;
    assert_eq!(
        (done.status, done.exit_code),
        (Status::Completed, Some(143))
    );
    assert!(done.killed, "the signal reached the command");
    assert_eq!(
        *h.fake.signals.lock(),
        vec![(op.id.clone(), WRAPPER_PID, Signal::Term)],
        "one TERM, to the recorded wrapper's identity"
    );
}

#[tokio::test]
async fn a_failed_attempt_reattaches_and_never_relaunches() {
    let h = harness(OnStart::RunUntilSignalled).await;
    let op = h.insert("sleep 600").await;
    super::spawn_fresh(&h.kernel, op.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(h.kernel.inject_observer_fault(&op.id));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // the command ends on its own now
    h.fake.alive.lock().remove(&op.id);
    h.fake.write(&op.id, "code", "0\n");
    let done = h.terminal(&op.id).await;
    assert_eq!((done.status, done.exit_code), (Status::Completed, Some(0)));
    assert!(
        done.attempt >= 2,
        "the fault failed attempt 1: {}",
        done.attempt
    );
    assert_eq!(h.starts(), 1);
}

#[tokio::test]
async fn a_wrapper_that_vanishes_without_a_code_is_lost() {
    let h = harness(OnStart::RunUntilSignalled).await;
    let op = h.insert("sleep 600").await;
    super::spawn_fresh(&h.kernel, op.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.fake.alive.lock().remove(&op.id);
    let done = h.terminal(&op.id).await;
    assert_eq!(done.status, Status::Lost);
    assert_eq!(done.exit_code, None);
    assert!(h.fake.signals.lock().is_empty(), "nothing is signalled");
}

fn inbox_file(h: &Harness, op: &str, state: &str) -> PathBuf {
    h.fake
        .run_ops()
        .path()
        .join("inbox")
        .join(format!("{op}.{state}"))
}

fn assert_no_handover(h: &Harness, op: &str) {
    for state in ["req", "claimed", "withdrawn"] {
        assert!(
            !inbox_file(h, op, state).exists(),
            "{op}.{state} left in the inbox"
        );
    }
}

#[tokio::test]
async fn a_claimed_request_runs_without_any_exec() {
    let h = harness_with(OnStart::Exit(5), Launcher::Claims).await;
    let op = h.insert("exit 5").await;
    super::spawn_fresh(&h.kernel, op.clone());
    let done = h.terminal(&op.id).await;
    assert_eq!((done.status, done.exit_code), (Status::Completed, Some(5)));
    assert_eq!(*h.fake.claims.lock(), vec![op.id.clone()]);
    assert_eq!(h.starts(), 0, "the launcher ran it; no docker exec");
    assert!(h.fake.launches.lock().is_empty());
    // settled: its handover files left the inbox (SPEC §21)
    assert_no_handover(&h, &op.id);
}

#[tokio::test]
async fn an_unclaimed_request_is_taken_back_and_started_once_by_exec() {
    let h = harness_with(OnStart::Exit(0), Launcher::Silent).await;
    let op = h.insert("true").await;
    super::spawn_fresh(&h.kernel, op.clone());
    let done = h.terminal(&op.id).await;
    assert_eq!((done.status, done.exit_code), (Status::Completed, Some(0)));
    assert_eq!(h.starts(), 1, "exactly one path ran it");
    assert_no_handover(&h, &op.id);
    // a launcher that wakes up now finds nothing to claim
    assert_eq!(h.fake.claim_pending(), 0);
}

#[tokio::test]
async fn a_kill_while_the_request_waits_takes_it_back_and_nothing_runs() {
    let h = harness_with(OnStart::Exit(0), Launcher::Silent).await;
    let op = h.insert("true").await;
    super::spawn_fresh(&h.kernel, op.clone());
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.kernel
        .store
        .request_kill(&op.id, KillReason::Kill)
        .await
        .unwrap();
    h.kernel.poke_kill(&op.id);
    let done = h.terminal(&op.id).await;
    assert_eq!(done.status, Status::Failed);
    assert!(done.killed);
    assert_eq!(h.starts(), 0);
    assert_eq!(h.fake.claim_pending(), 0, "withdrawn: never claimable");
}

/// A kernel that died after filing a request: the next attempt takes it
/// back (then starts it once by exec) or, when the launcher claimed it,
/// leaves it to the launcher's evidence and never execs.
#[tokio::test]
async fn a_request_left_by_a_dead_kernel_runs_exactly_once() {
    for claimed_before in [false, true] {
        let h = harness_with(OnStart::Exit(0), Launcher::Silent).await;
        let op = h.insert("true").await;
        let identity = RunIdentity::new("r1", &h.kernel.config.profile).unwrap();
        let container = h
            .fake
            .ensure_container(&identity, &h.kernel.config.profile)
            .await
            .unwrap();
        assert!(h
            .kernel
            .store
            .claim_exec(&op.id, "dead-kernel", &container.id, (true, None))
            .await
            .unwrap());
        let request = sandbox::Request {
            host: "box".into(),
            op_id: op.id.clone(),
            run_as: "1000:1000".into(),
            log_cap: 1024,
            io: sandbox::Io::Null,
            argv: vec!["true".into()],
        };
        h.fake.run_ops().submit(&request).unwrap();
        if claimed_before {
            // claimed, then the launcher died before the pid file
            std::fs::rename(
                inbox_file(&h, &op.id, "req"),
                inbox_file(&h, &op.id, "claimed"),
            )
            .unwrap();
        }
        super::spawn(&h.kernel, op.id.clone());
        let done = h.terminal(&op.id).await;
        if claimed_before {
            assert_eq!(done.status, Status::Lost, "{done:?}");
            assert_eq!(h.starts(), 0, "a claimed request is never run elsewhere");
        } else {
            assert_eq!((done.status, done.exit_code), (Status::Completed, Some(0)));
            assert_eq!(h.starts(), 1);
            assert_no_handover(&h, &op.id);
        }
    }
}

#[tokio::test]
async fn per_run_maps_shrink_to_live_work() {
    use std::collections::HashSet;
    let h = harness(OnStart::Exit(0)).await;
    let k = &h.kernel;
    for run in ["a", "b", "c"] {
        k.bump_run(run);
        drop(k.launch_gate(run).await);
    }
    let held = k.launch_gate("b").await;
    let listener = k.run_events("c");
    let live: HashSet<String> = HashSet::from(["a".to_owned()]);
    k.trim_idle(&live, &HashSet::new());
    let [_, gates, events, _] = k.run_map_sizes();
    // a: live; b: its gate is held; c: someone listens for its events
    assert_eq!((gates, events), (2, 2));
    drop((held, listener));
    k.trim_idle(&HashSet::new(), &HashSet::new());
    assert_eq!(k.run_map_sizes(), [0, 0, 0, 0]);
}

/// Every live op waits as its observer's task: the attempt's whole state
/// machine, allocated once. What it holds while it waits is what each of
/// thousands of live ops costs the kernel.
#[tokio::test]
async fn a_waiting_observer_is_small() {
    let h = harness(OnStart::Exit(0)).await;
    let op = h.insert("true").await;
    let inbox = Arc::new(crate::runtime::inbox::Inbox::default());
    let attempt = super::ObserverAttempt::new(h.kernel.clone(), op, inbox, Arc::default());
    let run = attempt.run();
    let size = std::mem::size_of_val(&run);
    let op = h.insert("true").await;
    let handle = h.kernel.claim_handle(&op.id).unwrap();
    let supervisor =
        super::supervise::supervise(h.kernel.clone(), op.id.clone(), handle, Some(Box::new(op)));
    let supervisor = std::mem::size_of_val(&supervisor);
    eprintln!(
        "an observer attempt's future: {size} bytes; its supervisor's: {supervisor} bytes; an op: {} bytes",
        std::mem::size_of::<Op>()
    );
    assert!(
        supervisor <= 1024,
        "an op's supervisor holds {supervisor} bytes while its attempt runs: box what grew it"
    );
    // in a test build: 6 KiB before its steps were boxed, 2.3 KiB after;
    // the supervisor's 4 KiB, 400 bytes once its op and store calls were
    assert!(
        size <= 4096,
        "an observer attempt's task holds {size} bytes while it waits: box the step that grew it"
    );
}
