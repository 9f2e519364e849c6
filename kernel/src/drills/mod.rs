//! Recovery drills: named scenarios that run real kernel processes against
//! the local Docker engine, SIGKILL and restart them, cut the Docker socket,
//! tamper with op files, and check that no result is lost, duplicated or
//! invented. `opkernel drill` and the test suite run the same code.

mod crash;
mod egress;
mod faults;
pub mod harness;
mod interactive;
mod launcher;
pub mod pgserver;
mod pool;
pub mod proxy;
mod races;
mod runs;
mod store;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;
use serde_json::json;

use harness::KernelProcess;

type DrillFuture = Pin<Box<dyn Future<Output = anyhow::Result<String>> + Send>>;

/// Every drill by name.
pub const DRILLS: &[(&str, &str)] = &[
    ("kernel-sigkill-repeated", "kernel SIGKILLed 10 times while one op runs, each restart re-attaching: it runs once, ends once, is delivered once"),
    ("exit-while-down", "ops that exit while the kernel is down report their real codes (0, 7, 137)"),
    ("killed-from-inside", "process killed from inside without a code: lost, never 0"),
    ("container-removed", "run container removed from outside mid-op: lost, effect uncertain"),
    ("container-pause", "run container paused 12 s (inside the grace window) under an op: it waits and completes with its real code"),
    ("garbage-code", "empty or garbage .code with a dead process: lost, never a made-up code"),
    ("pid-reused", "a kill whose recorded pid now belongs to another op's process: signals are attempted and refused on identity; it lives, the op is lost"),
    ("kill-interrupted", "a kill interrupted by a kernel SIGKILL after its TERM landed (recorded) completes after the restart: killed 137"),
    ("timeout-not-extended", "a restart does not extend an op's timeout budget"),
    ("daemon-outage-short", "Docker unreachable for less than the grace window (probes by exec): nothing lost"),
    ("daemon-outage-long", "Docker unreachable beyond the grace window (probes by exec): lost, effect uncertain"),
    ("daemon-outage-launcher", "Docker unreachable beyond the grace window: every probe answered by the launcher, an op started meanwhile runs; completed with its code"),
    ("crash-around-create", "crashes around container creation and exec claim: container adopted, never twinned, nothing run twice"),
    ("unacked-report", "an unacked report is re-served identically after a restart, never duplicated"),
    ("supervisor-lost", "an op's supervisor gives up without settling it: the watchdog attaches a new one within seconds; it ends once with its code"),
    ("observer-crash", "a crashed observer's next attempt attaches; the command ran once; 3 failures make it lost"),
    ("slow-start", "(docker exec path) an exec start that outlives the request timeout: runs once when released, lost (uncertain) when dropped, never failed on a guess"),
    ("kill-before-start", "a kill during container creation wins: failed, killed, the command never runs"),
    ("clock-step", "a forward wall-clock step does not time out running ops"),
    ("kill-interrupted-term", "a TERM-honouring command killed across a kernel restart (the TERM recorded, the command ending while the kernel is down) ends killed 143"),
    ("launcher-killed-pending", "the launcher killed with requests pending: each is taken back and run once by exec"),
    ("kernel-killed-after-filing", "the kernel killed between filing a request and seeing it claimed: it runs once, claimed or taken back"),
    ("launcher-killed-after-claim", "the launcher killed between a claim and the pid file: lost by evidence, never run by exec"),
    ("container-restarted-pending", "the container restarted under a pending request: it runs once"),
    ("request-flood", "a flood of 500 requests at once (100 under gVisor): all run once through the launcher, delivered once"),
    ("cancel-interrupted", "a run with a child cancelled (10 live ops), the kernel SIGKILLed mid-cancel: all killed once, reported once"),
    ("scheduler-crash", "the kernel SIGKILLed while a schedule's claim is held: the op ends once, no due time fires twice"),
    ("approval-restart", "an op awaiting approval across a kernel SIGKILL: still waiting, nothing ran; approved, it runs once"),
    ("pool-adopt-crash", "the kernel SIGKILLed at each step of a warm-pool adoption (before the binding row, after it, after the binding file): the container is the run's or the pool's, never both; the op runs once; no other run gets it"),
    ("stdin-across-restart", "a cat with stdin, the kernel SIGKILLed between two writes: both lines reach the same process once, in order; EOF ends it 0, reported once"),
    ("tty-ctrl-c", "INT (Ctrl-C) to bash -i on a terminal stops its sleep; bash lives on and exits with its own code"),
    ("egress-bypass", "a run with an allow list tries the ways around the proxy (the host's other ports on the egress gateway and on docker0, Docker's TCP port and socket, another run's container, an IPv4-mapped address, IPv6, a raw socket, UDP): each fails, the proxy answers"),
    ("store-outage", "the PostgreSQL control plane crashed (pg_ctl -m immediate) for 20 s under 100 live ops (20 under gVisor): starts get 503, then every op settles with its real code, ran once, delivered once"),
];

fn drill(name: &str, kit: Kit) -> Option<DrillFuture> {
    Some(match name {
        "kernel-sigkill-repeated" => Box::pin(async move { crash::sigkill_repeated(&kit).await }),
        "exit-while-down" => Box::pin(async move { crash::exit_while_down(&kit).await }),
        "killed-from-inside" => Box::pin(async move { faults::killed_from_inside(&kit).await }),
        "container-removed" => Box::pin(async move { faults::container_removed(&kit).await }),
        "container-pause" => Box::pin(async move { faults::container_pause(&kit).await }),
        "garbage-code" => Box::pin(async move { faults::garbage_code(&kit).await }),
        "pid-reused" => Box::pin(async move { faults::pid_reused(&kit).await }),
        "kill-interrupted" => Box::pin(async move { crash::kill_interrupted(&kit).await }),
        "timeout-not-extended" => Box::pin(async move { crash::timeout_not_extended(&kit).await }),
        "daemon-outage-short" => {
            Box::pin(async move { faults::daemon_outage(&kit, false, false).await })
        }
        "daemon-outage-long" => {
            Box::pin(async move { faults::daemon_outage(&kit, true, false).await })
        }
        "daemon-outage-launcher" => {
            Box::pin(async move { faults::daemon_outage(&kit, true, true).await })
        }
        "crash-around-create" => Box::pin(async move { crash::crash_around_create(&kit).await }),
        "unacked-report" => Box::pin(async move { crash::unacked_report(&kit).await }),
        "observer-crash" => Box::pin(async move { faults::observer_crash(&kit).await }),
        "supervisor-lost" => Box::pin(async move { faults::supervisor_lost(&kit).await }),
        "slow-start" => Box::pin(async move { races::slow_start(&kit).await }),
        "kill-before-start" => Box::pin(async move { races::kill_before_start(&kit).await }),
        "clock-step" => Box::pin(async move { races::clock_step(&kit).await }),
        "kill-interrupted-term" => {
            Box::pin(async move { races::kill_interrupted_term(&kit).await })
        }
        "launcher-killed-pending" => {
            Box::pin(async move { launcher::launcher_killed_pending(&kit).await })
        }
        "kernel-killed-after-filing" => {
            Box::pin(async move { launcher::kernel_killed_after_filing(&kit).await })
        }
        "launcher-killed-after-claim" => {
            Box::pin(async move { launcher::launcher_killed_after_claim(&kit).await })
        }
        "container-restarted-pending" => {
            Box::pin(async move { launcher::container_restarted_pending(&kit).await })
        }
        "request-flood" => Box::pin(async move { launcher::request_flood(&kit).await }),
        "cancel-interrupted" => Box::pin(async move { runs::cancel_interrupted(&kit).await }),
        "scheduler-crash" => Box::pin(async move { runs::scheduler_crash(&kit).await }),
        "approval-restart" => Box::pin(async move { runs::approval_restart(&kit).await }),
        "store-outage" => Box::pin(async move { store::store_outage(&kit).await }),
        "stdin-across-restart" => {
            Box::pin(async move { interactive::stdin_across_restart(&kit).await })
        }
        "tty-ctrl-c" => Box::pin(async move { interactive::tty_ctrl_c(&kit).await }),
        "egress-bypass" => Box::pin(async move { egress::egress_bypass(&kit).await }),
        "pool-adopt-crash" => Box::pin(async move { pool::pool_adopt_crash(&kit).await }),
        _ => return None,
    })
}

/// One drill's outcome, as `opkernel drill --json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct DrillResult {
    /// The drill's name (one of [`DRILLS`]).
    pub name: String,
    /// Whether every check of the drill held.
    pub passed: bool,
    /// What the drill found when it passed, or the error chain when it failed.
    pub detail: String,
    /// How long it took, in seconds (one decimal).
    pub seconds: f64,
}

/// What a drill starts its kernels with: the binary and the run image
/// (`None`: the kernel's own default or `OPKERNEL_IMAGE`).
#[derive(Debug, Clone)]
pub struct Kit {
    /// The `opkernel` binary drills start as `serve`.
    pub bin: PathBuf,
    /// The run image every run container is made from (`None`: the kernel's
    /// default or `OPKERNEL_IMAGE`).
    pub image: Option<String>,
}

impl Kit {
    /// Starts a kernel for a drill, on this kit's image.
    pub async fn start(&self, tag: &str, env: &[(&str, &str)]) -> anyhow::Result<KernelProcess> {
        let mut env = env.to_vec();
        if let Some(image) = &self.image {
            env.push(("OPKERNEL_IMAGE", image));
        }
        KernelProcess::start(&self.bin, tag, &env).await
    }

    /// The container profile the kit's kernels make run containers with
    /// (as a kernel started with the drill harness's settings would).
    pub fn profile(&self) -> sandbox::Profile {
        let mut profile = sandbox::Profile {
            runtime: env_runtime(),
            ..sandbox::Profile::default()
        };
        if let Some(image) = self
            .image
            .clone()
            .or_else(|| std::env::var("OPKERNEL_IMAGE").ok())
        {
            profile.image = image;
        }
        profile
    }
}

/// The runtime drill kernels run their containers under (they inherit
/// `OPKERNEL_RUNTIME`); `runc` when unset or unknown.
pub fn env_runtime() -> sandbox::Runtime {
    std::env::var("OPKERNEL_RUNTIME")
        .ok()
        .and_then(|r| sandbox::Runtime::parse(r.trim()))
        .unwrap_or_default()
}

/// Runs one drill by name, on the default run image.
pub async fn run_one(name: &str) -> DrillResult {
    run_one_in(name, None).await
}

/// Runs one drill by name with every run container made from `image`.
pub async fn run_one_in(name: &str, image: Option<&str>) -> DrillResult {
    let began = Instant::now();
    let kit = harness::kernel_binary().map(|bin| Kit {
        bin,
        image: image.map(str::to_owned),
    });
    let outcome = match kit {
        Ok(kit) => match drill(name, kit) {
            Some(fut) => fut.await,
            None => Err(anyhow::anyhow!("no drill named {name:?}")),
        },
        Err(e) => Err(e),
    };
    let (passed, detail) = match outcome {
        Ok(detail) => (true, detail),
        Err(e) => (false, format!("{e:#}")),
    };
    DrillResult {
        name: name.to_owned(),
        passed,
        detail,
        seconds: (began.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    }
}

/// `opkernel drill [NAME|all] [--json]`: runs drills two at a time.
pub async fn run_cli(name: &str, as_json: bool) -> anyhow::Result<i32> {
    let names: Vec<&str> = if name == "all" {
        DRILLS.iter().map(|(n, _)| *n).collect()
    } else if DRILLS.iter().any(|(n, _)| *n == name) {
        vec![name]
    } else {
        let known: Vec<&str> = DRILLS.iter().map(|(n, _)| *n).collect();
        bail!(
            "no drill named {name:?}; known drills: all, {}",
            known.join(", ")
        );
    };
    let mut results = Vec::new();
    for pair in names.chunks(2) {
        let runs = pair.iter().map(|n| run_one(n));
        for r in futures::future::join_all(runs).await {
            if !as_json {
                println!(
                    "{:<24} {:<4} {:>6.1}s  {}",
                    r.name,
                    if r.passed { "PASS" } else { "FAIL" },
                    r.seconds,
                    r.detail
                );
            }
            results.push(r);
        }
    }
    let failed = results.iter().filter(|r| !r.passed).count();
    if as_json {
        println!("{}", json!({"drills": results}));
    } else {
        println!("{} passed, {} failed", results.len() - failed, failed);
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

/// Fails the drill with `msg` unless `cond` holds.
fn check(cond: bool, msg: impl FnOnce() -> String) -> anyhow::Result<()> {
    if cond {
        Ok(())
    } else {
        bail!(msg())
    }
}

fn unique_run(tag: &str) -> String {
    format!(
        "drill-{tag}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// The host path of a file in a run's scratch dir.
fn scratch_path(k: &KernelProcess, run: &str, name: &str) -> PathBuf {
    k.home
        .join("scratch")
        .join(sandbox::profile::scratch_key(run))
        .join(name)
}

fn ops_path(k: &KernelProcess, run: &str, op: &str, ext: &str) -> PathBuf {
    scratch_path(k, run, &format!(".ops/{op}.{ext}"))
}

/// A kernel log line without its terminal colours (ANSI SGR sequences).
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ parameters m
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Lines of a scratch file (0 when missing).
fn count_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// How many times the run's journal records each op's end (its
/// `tool.completed` or `tool.failed`, written by the settlement that won):
/// an op that ended once has exactly one.
async fn op_ends(
    k: &KernelProcess,
    run: &str,
) -> anyhow::Result<std::collections::HashMap<String, usize>> {
    let mut ends = std::collections::HashMap::new();
    let mut after = 0;
    loop {
        let page = k
            .client
            .get(&format!("/v1/runs/{run}/events?after={after}&limit=500"))
            .await?;
        let events = page["events"].as_array().cloned().unwrap_or_default();
        if events.is_empty() {
            return Ok(ends);
        }
        for e in &events {
            if matches!(e["kind"].as_str(), Some("tool.completed" | "tool.failed")) {
                let op = e["operation_id"].as_str().unwrap_or_default().to_owned();
                *ends.entry(op).or_default() += 1;
            }
        }
        after = page["next_after"]
            .as_i64()
            .filter(|&next| next > after)
            .ok_or_else(|| anyhow::anyhow!("events of {run} do not advance past {after}"))?;
    }
}

/// Fails unless every op in `ops` ended exactly once in the run's journal.
async fn check_ended_once(k: &KernelProcess, run: &str, ops: &[&str]) -> anyhow::Result<()> {
    let ends = op_ends(k, run).await?;
    for op in ops {
        let n = ends.get(*op).copied().unwrap_or(0);
        check(n == 1, || format!("{op} ended {n} times in the journal"))?;
    }
    Ok(())
}

const LONG: Duration = Duration::from_secs(60);
