//! The terminal keeper (`opkernel-shim keep`, gVisor's Ctrl-C path) as a
//! process on this host: it ends with its command's very status, ignores
//! the signals meant for the command's processes, and passes a requested
//! signal on (to the command itself when it has no terminal).
#![allow(clippy::unwrap_used, clippy::expect_used, unsafe_code)]

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opkernel_shim::Signal;

fn keep(script: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_opkernel-shim"));
    c.args(["keep", "sh", "-c", script]).stdin(Stdio::null());
    c
}

fn wait_bounded(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the keeper did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_keeper_ends_with_its_commands_code_or_signal() {
    let status = keep("exit 7").status().unwrap();
    assert_eq!(status.code(), Some(7));
    let status = keep("kill -TERM $$; sleep 5").status().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    let out = Command::new(env!("CARGO_BIN_EXE_opkernel-shim"))
        .args(["keep", "/no/such/program"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot run"));
}

#[test]
fn the_keeper_passes_a_requested_signal_on_and_ignores_the_rest() {
    let mut child = keep("trap 'exit 42' USR1; touch \"$READY\"; while :; do sleep 0.05; done")
        .env(
            "READY",
            std::env::temp_dir().join(format!("keep-ready-{}", std::process::id())),
        )
        .spawn()
        .unwrap();
    let ready = std::env::temp_dir().join(format!("keep-ready-{}", std::process::id()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the command did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = child.id() as libc::pid_t;
    // a TERM meant for the command's processes does not end the keeper
    // SAFETY: a plain kill of our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the keeper ended on TERM"
    );
    // the request for USR1 reaches the command (no terminal: the command
    // itself), which exits 42; the keeper ends with that code
    let i = Signal::ALL.iter().position(|s| *s == Signal::Usr1).unwrap() as i32;
    // SAFETY: a plain kill of our own child.
    unsafe { libc::kill(pid, libc::SIGRTMIN() + i) };
    assert_eq!(wait_bounded(&mut child).code(), Some(42));
    let _ = std::fs::remove_file(ready);
}

#[test]
fn a_command_the_keeper_cannot_start_is_reported_not_started() {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let (mut read, write) = std::io::pipe().unwrap();
    let fd = write.as_raw_fd();
    let mut c = Command::new(env!("CARGO_BIN_EXE_opkernel-shim"));
    c.args(["keep", &format!("--report-fd={fd}"), "true"])
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: async-signal-safe calls only: one process for this user at
    // most (the keeper itself), so its fork fails with EAGAIN
    unsafe {
        c.pre_exec(move || {
            let one = libc::rlimit {
                rlim_cur: 1,
                rlim_max: 1,
            };
            libc::fcntl(fd, libc::F_SETFD, 0);
            libc::setrlimit(libc::RLIMIT_NPROC, &one);
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = c.status().unwrap();
    drop(c);
    drop(write);
    let mut report = String::new();
    read.read_to_string(&mut report).unwrap();
    assert_eq!(status.code(), Some(126));
    assert!(report.contains("cannot start \"true\""), "{report:?}");
}
