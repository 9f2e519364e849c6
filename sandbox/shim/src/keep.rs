//! `opkernel-shim keep <command>...`: the session keeper of a terminal op
//! where the terminal's foreground process group cannot be read from
//! outside its session (gVisor: `/proc` reports no `tpgid`, and the
//! master's `TIOCGPGRP` and `TIOCSIG` are refused).
//!
//! The launcher then runs this in the command's place, as the session's
//! leader on the terminal; it starts the command as its one child, in the
//! same session, and ends with the command's very status (its code, or
//! the signal that ended it, raised on itself). Between the two it waits
//! for a signal request: the signaller sends it `SIGRTMIN + i` for the
//! `i`-th of [`Signal::ALL`], and it sends that signal to the terminal's
//! foreground group, which a process of the session may ask the terminal
//! for (`tcgetpgrp`). Every other signal is left blocked: the signaller
//! reaches the command's processes itself.
#![allow(unsafe_code)]

use std::ffi::OsString;
use std::io::{self, Read};
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

use opkernel_shim::Signal;

use crate::sys::check;

/// The verb.
pub const VERB: &str = "keep";

/// The first argument's prefix naming the fd where the keeper says why it
/// could not start the command (the launcher reads it: the op is then
/// `not-started`, as a command the launcher itself could not start).
pub const REPORT_FD: &str = "--report-fd=";

/// The real-time signal that asks the keeper to send `signal` to the
/// terminal's foreground group.
pub fn request_number(signal: Signal) -> i32 {
    let i = Signal::ALL.iter().position(|s| *s == signal).unwrap_or(0);
    libc::SIGRTMIN() + i as i32
}

pub fn main(args: Vec<OsString>) -> i32 {
    let (report, args) = report_fd(&args);
    let Some((program, rest)) = args.split_first() else {
        eprintln!("usage: opkernel-shim keep [--report-fd=N] <command>...");
        return 2;
    };
    if let Err(e) = block_all() {
        return never(
            report,
            &format!("its terminal's keeper cannot block signals: {e}"),
        );
    }
    let mut command = Command::new(program);
    command.args(rest);
    // SAFETY: the closure only makes an async-signal-safe system call.
    unsafe {
        // the command starts with no signal blocked
        command.pre_exec(crate::sys::unblock_all_signals);
    }
    let child = match command.spawn() {
        Ok(child) => child.id() as libc::pid_t,
        Err(e) => {
            let name = program.to_string_lossy();
            return match crate::launch::exec_refusal(&e) {
                Some(code) => {
                    eprintln!("opkernel: cannot run {name:?}: {e}");
                    code
                }
                None => never(report, &format!("cannot start {name:?}: {e}")),
            };
        }
    };
    loop {
        match next_signal() {
            Ok(libc::SIGCHLD) => {
                if let Some(status) = reaped(child) {
                    mirror(status);
                }
            }
            Ok(number) => forward(number, child),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => {
                // cannot wait for signals: wait for the command alone
                eprintln!("opkernel: the terminal's keeper stops forwarding: {e}");
                let mut status = 0;
                // SAFETY: a pid of our own child and an out-pointer.
                unsafe { libc::waitpid(child, &mut status, 0) };
                mirror(status);
            }
        }
    }
}

// the launcher's side

/// The command, or the keeper that runs it (see above) with `report`
/// (the write end of a pipe) as the fd where it says why it could not
/// start the command.
pub(crate) fn command_for(
    launch: &crate::launch::Launch,
    report: Option<RawFd>,
) -> io::Result<Command> {
    let Some(report) = report else {
        let mut command = Command::new(&launch.command[0]);
        command.args(&launch.command[1..]);
        return Ok(command);
    };
    let mut command = Command::new(std::env::current_exe()?);
    command
        .arg(VERB)
        .arg(format!("{}{report}", REPORT_FD))
        .args(&launch.command);
    // SAFETY: the closure only makes async-signal-safe system calls.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            // a keeper is born with every signal blocked (a request that
            // comes before it runs can never end it) and keeps `report`
            crate::sys::block_all_signals()?;
            crate::sys::check(libc::fcntl(report, libc::F_SETFD, 0)).map(drop)
        });
    }
    Ok(command)
}

/// What a keeper reported, once it ended: why it could not start the
/// command (nothing when it started it).
pub(crate) fn read_report(pipe: io::PipeReader) -> Option<String> {
    let mut text = String::new();
    pipe.take(4096).read_to_string(&mut text).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

// the keeper's side

/// The report fd the first argument names (made close-on-exec, so the
/// command never holds it), and the rest.
fn report_fd(args: &[OsString]) -> (Option<i32>, &[OsString]) {
    let first = args.first().and_then(|a| a.to_str());
    let Some(fd) = first.and_then(|a| a.strip_prefix(REPORT_FD)) else {
        return (None, args);
    };
    let fd = fd.parse::<i32>().ok().filter(|fd| *fd > 2);
    if let Some(fd) = fd {
        // SAFETY: sets a flag on an fd of ours.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    (fd, &args[1..])
}

/// Says why the command was not started (on the report fd, else on
/// stderr) and gives the code of a start that failed.
fn never(report: Option<i32>, reason: &str) -> i32 {
    match report {
        Some(fd) => {
            use std::io::Write;
            // SAFETY: the fd is ours, given by the launcher; ManuallyDrop
            // keeps it open for the process's end.
            let mut file = std::mem::ManuallyDrop::new(unsafe {
                <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd)
            });
            let _ = file.write_all(reason.as_bytes());
        }
        None => eprintln!("opkernel: {reason}"),
    }
    126
}

/// Blocks every signal that can be (already so when the launcher started
/// this; again for a keeper started by hand) and makes sure SIGCHLD is
/// not ignored, so it stays pending for `sigwaitinfo`.
fn block_all() -> std::io::Result<()> {
    crate::sys::block_all_signals()?;
    // SAFETY: resets one signal's disposition.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
    Ok(())
}

/// The next pending signal.
fn next_signal() -> std::io::Result<i32> {
    // SAFETY: plain data filled by the calls.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        let mut info: libc::siginfo_t = std::mem::zeroed();
        check(libc::sigwaitinfo(&all, &mut info))
    }
}

/// The command's status once it ended.
fn reaped(child: libc::pid_t) -> Option<i32> {
    let mut status = 0;
    // SAFETY: a pid of our own child and an out-pointer.
    let pid = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
    (pid == child).then_some(status)
}

/// Sends the signal a request names to the terminal's foreground group
/// (the command's own process when the terminal names none).
fn forward(number: i32, child: libc::pid_t) {
    let Some(i) = number.checked_sub(libc::SIGRTMIN()) else {
        return;
    };
    let Some(signal) = Signal::ALL.get(i as usize) else {
        return;
    };
    // SAFETY: fd 0 is the terminal; tcgetpgrp and getsid only read.
    let (group, same_session) = unsafe {
        let group = libc::tcgetpgrp(0);
        (group, group > 0 && libc::getsid(group) == libc::getsid(0))
    };
    // SAFETY: plain kill calls.
    unsafe {
        // a group of this session only (a stale id never reaches another)
        if same_session {
            libc::kill(-group, signal.number());
        } else {
            libc::kill(child, signal.number());
        }
    }
}

/// Ends this process with the command's status: its code, or the signal
/// that ended it raised here (no core file).
fn mirror(status: i32) -> ! {
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        // SAFETY: plain calls on this process's own limits and signals.
        unsafe {
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            libc::signal(signal, libc::SIG_DFL);
            let mut one: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut one);
            libc::sigaddset(&mut one, signal);
            libc::kill(libc::getpid(), signal);
            libc::sigprocmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
        }
        std::process::exit(128 + signal);
    }
    std::process::exit(libc::WEXITSTATUS(status));
}
