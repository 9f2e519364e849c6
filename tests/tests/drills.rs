#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The recovery drills, run by the test suite through the same code as
//! `opkernel drill` (each drill starts, SIGKILLs and restarts real kernel
//! processes against the real Docker engine).

async fn drill(name: &str) {
    let r = opkernel::drills::run_one(name).await;
    assert!(
        r.passed,
        "drill {name} failed after {:.1}s: {}",
        r.seconds, r.detail
    );
}

#[test]
fn every_drill_has_a_test() {
    let tested = include_str!("drills.rs");
    for (name, _) in opkernel::drills::DRILLS {
        assert!(
            tested.contains(&format!("drill(\"{name}\")")),
            "drill {name} is not run by the tests"
        );
    }
}

#[tokio::test]
async fn kernel_sigkill_repeated() {
    drill("kernel-sigkill-repeated").await;
}

#[tokio::test]
async fn exit_while_down() {
    drill("exit-while-down").await;
}

#[tokio::test]
async fn killed_from_inside() {
    drill("killed-from-inside").await;
}

#[tokio::test]
async fn container_removed() {
    drill("container-removed").await;
}

#[tokio::test]
async fn garbage_code() {
    drill("garbage-code").await;
}

#[tokio::test]
async fn pid_reused() {
    drill("pid-reused").await;
}

#[tokio::test]
async fn kill_interrupted() {
    drill("kill-interrupted").await;
}

#[tokio::test]
async fn timeout_not_extended() {
    drill("timeout-not-extended").await;
}

#[tokio::test]
async fn daemon_outage_short() {
    drill("daemon-outage-short").await;
}

#[tokio::test]
async fn daemon_outage_long() {
    drill("daemon-outage-long").await;
}

#[tokio::test]
async fn crash_around_create() {
    drill("crash-around-create").await;
}

#[tokio::test]
async fn unacked_report() {
    drill("unacked-report").await;
}

#[tokio::test]
async fn observer_crash() {
    drill("observer-crash").await;
}

#[tokio::test]
async fn slow_start() {
    drill("slow-start").await;
}

#[tokio::test]
async fn kill_before_start() {
    drill("kill-before-start").await;
}

#[tokio::test]
async fn clock_step() {
    drill("clock-step").await;
}

#[tokio::test]
async fn kill_interrupted_term() {
    drill("kill-interrupted-term").await;
}
