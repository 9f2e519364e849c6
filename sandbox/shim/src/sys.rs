//! The few system calls std does not wrap, each behind a safe function.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use opkernel_shim::Usage;

pub(crate) fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Orphaned descendants of the command are re-parented to this process
/// (not to the container's init), so their usage is counted when reaped.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes one integer argument and touches no memory.
    check(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }).map(drop)
}

/// SIGCHLD back to its default: an ignored SIGCHLD (inherited through
/// exec) would let the kernel reap the command before `wait4` sees it.
pub fn default_sigchld() -> io::Result<()> {
    // SAFETY: installs the default disposition; no handler code is involved.
    if unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) } == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// How a reaped child ended: its exit code, or 128+N when signal N ended it.
pub fn exit_code(status: libc::c_int) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        255
    }
}

/// What one `wait4` for any child found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaped {
    /// This child ended and is reaped now: its pid and wait status.
    Child(u32, libc::c_int),
    /// Children are left, none has ended yet (only with `nohang`).
    Running,
    /// No child is left at all.
    NoChildren,
}

/// Reaps one child (any child), telling "none ended yet" from "none left".
pub fn reap_or_none(nohang: bool) -> io::Result<Reaped> {
    let mut status: libc::c_int = 0;
    let flags = if nohang { libc::WNOHANG } else { 0 };
    loop {
        // SAFETY: `status` is a valid out-pointer; a null rusage pointer is allowed.
        let pid = unsafe { libc::wait4(-1, &mut status, flags, std::ptr::null_mut()) };
        if pid > 0 {
            return Ok(Reaped::Child(pid as u32, status));
        }
        if pid == 0 {
            return Ok(Reaped::Running);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ECHILD) => return Ok(Reaped::NoChildren),
            _ => return Err(err),
        }
    }
}

/// Reaps one child (any child). `Ok(None)`: with `nohang`, none has ended
/// yet; or there is no child left at all.
pub fn reap(nohang: bool) -> io::Result<Option<(u32, libc::c_int)>> {
    Ok(match reap_or_none(nohang)? {
        Reaped::Child(pid, status) => Some((pid, status)),
        Reaped::Running | Reaped::NoChildren => None,
    })
}

/// Usage of every child this process has reaped (and of the children they reaped).
pub fn children_usage() -> Usage {
    // SAFETY: rusage is plain data; zeroed is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid out-pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } != 0 {
        return Usage {
            cpu_ms: 0,
            max_rss_kb: 0,
        };
    }
    let ms = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1000 + (t.tv_usec.max(0) as u64) / 1000;
    Usage {
        cpu_ms: ms(ru.ru_utime) + ms(ru.ru_stime),
        max_rss_kb: ru.ru_maxrss.max(0) as u64,
    }
}

/// For the child between fork and exec (async-signal-safe calls only):
/// a new session, so a signal to the command's process group never reaches
/// this process; then proof that the identity drop took, supplementary
/// groups included.
pub fn enter_session_dropped_to(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: setsid has no arguments.
    check(unsafe { libc::setsid() })?;
    // SAFETY: the id getters have no arguments; getgroups(0, NULL) only counts.
    let (ruid, euid, rgid, egid, groups) = unsafe {
        (
            libc::getuid(),
            libc::geteuid(),
            libc::getgid(),
            libc::getegid(),
            libc::getgroups(0, std::ptr::null_mut()),
        )
    };
    let dropped = ruid == uid && euid == uid && rgid == gid && egid == gid;
    if dropped && (uid == 0 || groups == 0) {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    }
}

/// Blocks every signal that can be blocked (async-signal-safe).
pub fn block_all_signals() -> io::Result<()> {
    set_signal_mask(libc::SIG_BLOCK, true)
}

/// Clears the signal mask (async-signal-safe).
pub fn unblock_all_signals() -> io::Result<()> {
    set_signal_mask(libc::SIG_SETMASK, false)
}

/// `sigprocmask(how)` with the full set (`all`) or the empty one.
fn set_signal_mask(how: libc::c_int, all: bool) -> io::Result<()> {
    // SAFETY: plain data set and passed to the signal calls.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        match all {
            true => libc::sigfillset(&mut set),
            false => libc::sigemptyset(&mut set),
        };
        check(libc::sigprocmask(how, &set, std::ptr::null_mut())).map(drop)
    }
}

/// A handle on exactly one process: a later signal through it can never
/// reach a process that reused the pid.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags; the result is a new fd we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

pub fn pidfd_send_signal(fd: &OwnedFd, signal: i32) -> io::Result<()> {
    // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Plain kill, for kernels without pidfds (before Linux 5.3).
pub fn kill(pid: u32, signal: i32) -> io::Result<()> {
    // SAFETY: kill takes a pid and a signal number.
    check(unsafe { libc::kill(pid as libc::pid_t, signal) }).map(drop)
}

/// Blocks SIGCHLD in this (single-threaded) process and returns a signalfd
/// that becomes readable when a child ends. Children started with std's
/// `Command` get an empty signal mask back.
pub fn sigchld_fd() -> io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data; the calls only fill and read `set`.
    let fd = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK)
    };
    check(fd)?;
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An inotify instance watching `dir` for files renamed or written into it.
pub fn inotify_dir(dir: &std::path::Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: inotify_init1 takes flags only.
    let fd = check(unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) })?;
    // SAFETY: the kernel just returned this fd to us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mask = libc::IN_MOVED_TO | libc::IN_CLOSE_WRITE;
    // SAFETY: a valid inotify fd and a NUL-terminated path.
    check(unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), mask) })?;
    Ok(fd)
}

/// Waits (without a timeout) until one of `fds` is readable; returns which.
pub fn wait_any(fds: &[RawFd]) -> io::Result<Vec<bool>> {
    wait_any_for(fds, -1)
}

/// Waits until one of `fds` is readable or `timeout_ms` passes (negative:
/// no timeout); returns which are readable (none: the time passed).
pub fn wait_any_for(fds: &[RawFd], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `pfds` is a valid array of its length.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
        if n >= 0 {
            return Ok(pfds.iter().map(|p| p.revents != 0).collect());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Reads what a non-blocking fd has now (nothing: an empty buffer).
pub fn read_now(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Ok(0),
            _ => return Err(err),
        }
    }
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`; 100 when it fails).
pub fn clock_ticks_per_sec() -> u64 {
    // sysconf reads a constant of the C library; no memory is passed
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if n > 0 {
        n as u64
    } else {
        100
    }
}
