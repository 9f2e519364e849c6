//! The system calls of an interactive op: its FIFO and its terminal pair.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::sys::check;

/// Makes the FIFO at `path` (mode 0600, root's: the command cannot open it).
pub fn mkfifo(path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated path and a mode.
    check(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }).map(drop)
}

/// A terminal pair: the master (the shim's) and the slave (the command's
/// stdin, stdout and stderr).
pub struct Pair {
    pub master: File,
    pub slave: File,
}

/// A new terminal pair of `rows` by `cols`, the slave owned by `uid`:`gid`
/// where the container may chown (as a login gives it). Both ends close on exec; the command gets the
/// slave as its standard streams only.
pub fn open_pair(rows: u16, cols: u16, uid: u32, gid: u32) -> io::Result<Pair> {
    let ptmx = c"/dev/ptmx";
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated path and flags; the fd is ours.
    let master = check(unsafe { libc::open(ptmx.as_ptr(), flags) })?;
    // SAFETY: the kernel just returned this fd to us.
    let master = unsafe { File::from_raw_fd(master) };
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int through the pointer.
    check(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) })?;
    let slave = open_slave(&master, flags)?;
    // the command's own terminal, as a login gives it; a container
    // without CAP_CHOWN keeps it root's (the command holds it open anyway)
    // SAFETY: fchown takes an fd we own and plain integers.
    if unsafe { libc::fchown(slave.as_raw_fd(), uid, gid) } == 0 {
        // SAFETY: fchmod takes an fd we own and a mode.
        check(unsafe { libc::fchmod(slave.as_raw_fd(), 0o620) })?;
    }
    set_size(&master, rows, cols)?;
    Ok(Pair { master, slave })
}

/// The slave of `master`, opened through the master (no path lookup in
/// /dev/pts); where the kernel has no TIOCGPTPEER (gVisor), by its number
/// in /dev/pts.
fn open_slave(master: &File, flags: libc::c_int) -> io::Result<File> {
    // SAFETY: TIOCGPTPEER takes open flags and returns a new fd.
    let peer = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) };
    if peer >= 0 {
        // SAFETY: the kernel just returned this fd to us.
        return Ok(unsafe { File::from_raw_fd(peer) });
    }
    let err = io::Error::last_os_error();
    if !matches!(err.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) {
        return Err(err);
    }
    let mut number: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes one unsigned int through the pointer.
    check(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTN, &mut number) })?;
    let path = std::ffi::CString::new(format!("/dev/pts/{number}"))
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated path and flags; the fd is ours.
    let slave = check(unsafe { libc::open(path.as_ptr(), flags) })?;
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { File::from_raw_fd(slave) })
}

/// Sets the terminal's size (the foreground job gets SIGWINCH).
pub fn set_size(terminal: &impl AsRawFd, rows: u16, cols: u16) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize through the pointer.
    check(unsafe { libc::ioctl(terminal.as_raw_fd(), libc::TIOCSWINSZ, &size) }).map(drop)
}

/// The terminal's end-of-file character (Ctrl-D unless changed).
pub fn eof_char(terminal: &impl AsRawFd) -> u8 {
    // SAFETY: termios is plain data; tcgetattr fills it.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and out-pointer.
    match unsafe { libc::tcgetattr(terminal.as_raw_fd(), &mut t) } {
        0 if t.c_cc[libc::VEOF] != 0 => t.c_cc[libc::VEOF],
        _ => 4,
    }
}

/// Whether the terminal hides its foreground process group from outside
/// its session: its master refuses `TIOCGPGRP` (gVisor), where Linux
/// answers the slave's group (0 before it has a session).
pub fn foreground_hidden(master: &impl AsRawFd) -> bool {
    let mut group: libc::pid_t = 0;
    // SAFETY: TIOCGPGRP writes one pid through the pointer.
    let rc = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPGRP, &mut group) };
    rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOTTY)
}

/// In the child between fork and exec: the slave (its stdin) becomes the
/// controlling terminal of the new session. Async-signal-safe.
pub fn take_controlling_terminal() -> io::Result<()> {
    // SAFETY: TIOCSCTTY on fd 0 with argument 0 (never steal).
    check(unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) }).map(drop)
}

/// Waits until the FIFO has input (`false`) or the sink hung up (`true`:
/// a pipe's reader closed it, a terminal lost its last slave).
pub fn input_or_hangup(fifo: &impl AsRawFd, sink: std::os::fd::RawFd) -> io::Result<bool> {
    let mut fds = [
        libc::pollfd {
            fd: fifo.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: sink,
            events: 0,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n > 0 {
            return Ok(fds[1].revents & (libc::POLLERR | libc::POLLHUP) != 0
                && fds[0].revents & libc::POLLIN == 0);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// A duplicate of `fd` that closes on exec.
pub fn dup(fd: &impl AsRawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new fd we own.
    let new = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) })?;
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}
