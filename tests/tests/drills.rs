#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The recovery drills, run by the test suite through the same code as
//! `opkernel drill` (each drill starts, SIGKILLs and restarts real kernel
//! processes against the real Docker engine), each on both run images.

use opkernel_tests::Image;

async fn drill(name: &str, image: Image) {
    let r = opkernel::drills::run_one_in(name, Some(&image.name())).await;
    assert!(
        r.passed,
        "drill {name} on {image:?} failed after {:.1}s: {}",
        r.seconds, r.detail
    );
}

/// `test => "drill-name" on image_fn: Image, …`: a module of one test per
/// image given.
macro_rules! drill_tests {
    ($test:ident => $name:literal on $($image_fn:ident: $image:ident),+) => {
        mod $test {
            use opkernel_tests::Image;
            $(
                #[tokio::test]
                async fn $image_fn() {
                    super::drill($name, Image::$image).await
                }
            )+
        }
    };
}

/// `test => "drill-name"`: one test per drill and run image.
macro_rules! drills {
    ($($test:ident => $name:literal),+ $(,)?) => {
        $(drill_tests!($test => $name on default_image: Default, debian_image: Debian);)+
    };
}

#[test]
fn every_drill_has_a_test() {
    let tested = include_str!("drills.rs");
    for (name, _) in opkernel::drills::DRILLS {
        assert!(
            tested.contains(&format!("=> \"{name}\"")),
            "drill {name} is not run by the tests"
        );
    }
}

drills!(
    kernel_sigkill_repeated => "kernel-sigkill-repeated",
    stdin_across_restart => "stdin-across-restart",
    tty_ctrl_c => "tty-ctrl-c",
    exit_while_down => "exit-while-down",
    killed_from_inside => "killed-from-inside",
    container_removed => "container-removed",
    container_pause => "container-pause",
    supervisor_lost => "supervisor-lost",
    garbage_code => "garbage-code",
    pid_reused => "pid-reused",
    kill_interrupted => "kill-interrupted",
    timeout_not_extended => "timeout-not-extended",
    daemon_outage_short => "daemon-outage-short",
    daemon_outage_long => "daemon-outage-long",
    daemon_outage_launcher => "daemon-outage-launcher",
    crash_around_create => "crash-around-create",
    unacked_report => "unacked-report",
    observer_crash => "observer-crash",
    slow_start => "slow-start",
    kill_before_start => "kill-before-start",
    clock_step => "clock-step",
    kill_interrupted_term => "kill-interrupted-term",
    launcher_killed_pending => "launcher-killed-pending",
    kernel_killed_after_filing => "kernel-killed-after-filing",
    launcher_killed_after_claim => "launcher-killed-after-claim",
    container_restarted_pending => "container-restarted-pending",
    request_flood => "request-flood",
    cancel_interrupted => "cancel-interrupted",
    scheduler_crash => "scheduler-crash",
    approval_restart => "approval-restart",
    egress_bypass => "egress-bypass",
);

// the store's outage drill crashes a PostgreSQL server of its own whatever
// the suite's store; its subject is the control plane's database, not the
// run image: the default image only
drill_tests!(store_outage => "store-outage" on default_image: Default);
// the pool's adoption does not depend on the image: the default one only
drill_tests!(pool_adopt_crash => "pool-adopt-crash" on default_image: Default);
