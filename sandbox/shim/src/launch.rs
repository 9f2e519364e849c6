//! `opkernel-shim launch [--io=<mode>] <op id> <run-as> <log cap bytes> <command>...`:
//! runs one op's command and writes its files in `/scratch/.ops/`.
//!
//! 1. for an op with stdin (`--io=pipe` or `--io=tty:<rows>x<cols>`), its
//!    FIFO `<id>.in`, held open from here on (see `input.rs`);
//!    `<id>.pid` (this process's pid, start ticks, hostname), renamed into
//!    place before the command starts;
//! 2. the command, in its own session, dropped to the run user (groups
//!    cleared, `HOME=/scratch`), stdin from `/dev/null` (or a pipe the
//!    FIFO's frames go to), stdout and stderr into one pipe that this
//!    process copies into `<id>.log` up to the cap; on a terminal, stdin,
//!    stdout and stderr are the slave, the terminal is the session's
//!    controlling one, and the master's stream is what goes to the log;
//! 3. once the command ends: the rest of its output (at most 2 s more, from
//!    processes it left behind); then those processes are stopped (TERM, a
//!    grace, KILL, each identity-checked: see `tree.rs`) and reaped; then
//!    `<id>.code` (code, CPU ms and max RSS of every process of the tree
//!    reaped here, and how many leftovers were stopped), renamed into place.
//!    An op's process tree ends with the op: a command that must keep
//!    running is started as its own background op.
//!
//! When nothing could be executed (the run user cannot be resolved, fork or
//! the identity drop fails), `.code` says `not-started <reason>` and the op
//! is `failed`; `exec` refusing the program gives 127/126 as a shell would.
//! The exit status of this process is the command's code (125: not started,
//! or the op files could not be written). Nothing here ever runs the
//! command twice.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use opkernel_shim::procfs::stat_start_ticks;
use opkernel_shim::{
    validate_op_id, ExitRecord, Io, OpResult, PidRecord, RunAs, RunUser, OPS_DIR, SCRATCH_DIR,
};

use crate::input::{self, Fifo, Sink};
use crate::tree::{self, Owner};
use crate::{pty, sys};

/// How long output from processes the command left behind is still
/// captured after the command itself ended.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);
/// Exit status of a launch that did not start the command, or could not
/// record its op.
pub const SHIM_FAILED: i32 = 125;

pub(crate) struct Launch {
    io: Io,
    op: String,
    run_as: RunAs,
    cap: u64,
    pub(crate) command: Vec<OsString>,
}

fn parse(args: Vec<OsString>) -> Result<Launch, String> {
    let mut args = args.into_iter().peekable();
    let io = match args.peek().and_then(|a| a.to_str()?.strip_prefix("--io=")) {
        Some(mode) => {
            let io = Io::parse(mode)?;
            args.next();
            io
        }
        None => Io::Null,
    };
    let mut text = |what: &str| -> Result<String, String> {
        args.next()
            .ok_or_else(|| format!("missing {what}"))?
            .into_string()
            .map_err(|_| format!("{what} is not utf-8"))
    };
    let op = text("operation id")?;
    validate_op_id(&op)?;
    let run_as = RunAs::parse(&text("run-as")?)?;
    let cap_text = text("log cap")?;
    let cap = cap_text
        .parse::<u64>()
        .ok()
        .filter(|&c| c > 0)
        .ok_or_else(|| format!("log cap {cap_text:?} is not a positive number of bytes"))?;
    let command: Vec<OsString> = args.collect();
    if command.first().is_none_or(|c| c.is_empty()) {
        return Err("missing command".into());
    }
    Ok(Launch {
        io,
        op,
        run_as,
        cap,
        command,
    })
}

pub fn main(args: Vec<OsString>) -> i32 {
    let launch = match parse(args) {
        Ok(launch) => launch,
        Err(e) => {
            eprintln!("opkernel-shim launch: {e}");
            return 2;
        }
    };
    match run(&launch) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("opkernel-shim launch {}: {e}", launch.op);
            SHIM_FAILED
        }
    }
}

fn op_file(op: &str, ext: &str) -> PathBuf {
    Path::new(OPS_DIR).join(format!("{op}.{ext}"))
}

/// Writes `text` to a temp file and renames it over `path`: a reader sees
/// the old content or the new, never a part.
pub(crate) fn write_atomic(path: &Path, text: &str) -> io::Result<()> {
    write_renamed(path, text, false)
}

/// [`write_atomic`], durably: the file is synced before the rename and the
/// directory after it (SPEC §28), so a result the kernel has read (and
/// maybe reported) survives a host crash. For `.code` records.
pub(crate) fn write_durable(path: &Path, text: &str) -> io::Result<()> {
    write_renamed(path, text, true)
}

fn write_renamed(path: &Path, text: &str, durable: bool) -> io::Result<()> {
    let tmp = path.with_extension(format!(
        "{}.tmp",
        path.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    file.write_all(text.as_bytes())?;
    if durable {
        file.sync_all()?;
    }
    drop(file);
    std::fs::rename(&tmp, path)?;
    if durable {
        sync_parent(path)?;
    }
    Ok(())
}

/// Syncs the directory holding `path` (its entries: a rename is durable
/// once its directory is).
pub(crate) fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

pub(crate) fn own_identity() -> io::Result<PidRecord> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let start_ticks = stat_start_ticks(&stat)
        .ok_or_else(|| io::Error::other(format!("unreadable /proc/self/stat: {stat:?}")))?;
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    Ok(PidRecord {
        pid: std::process::id(),
        start_ticks,
        hostname,
    })
}

fn run(launch: &Launch) -> io::Result<i32> {
    sys::default_sigchld()?;
    let me = own_identity()?;
    // the FIFO exists before `.pid` does: a kernel that sees the op
    // running can write to it
    let fifo = match launch.io.has_stdin() {
        true => Some(Fifo::create(&launch.op).map_err(|e| format!("cannot make its stdin: {e}"))),
        false => None,
    };
    let fifo_path = fifo.as_ref().and_then(|f| f.as_ref().ok()).map(Fifo::path);
    write_atomic(&op_file(&launch.op, "pid"), &me.render())?;
    let mut log = OpenOptions::new()
        .append(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(op_file(&launch.op, "log"))?;
    log.set_len(0)?;
    let owner = Owner {
        op: &launch.op,
        pid: me.pid,
        since: me.start_ticks,
    };
    let (result, status) = match start(launch, &log, fifo.transpose()) {
        Ok(running) => match running.finish(&mut log, launch.cap, &owner)? {
            (ended, None) => (OpResult::Exited(ended), ended.code),
            // its keeper could not start it (see `keep.rs`)
            (_, Some(reason)) => {
                let _ = writeln!(log, "opkernel: the command was not started: {reason}");
                (OpResult::not_started(&reason), SHIM_FAILED)
            }
        },
        Err(Unstarted::Exec { code, message }) => {
            let _ = writeln!(log, "opkernel: {message}");
            let ended = ExitRecord {
                code,
                usage: Some(sys::children_usage()),
                leftovers: 0,
            };
            (OpResult::Exited(ended), code)
        }
        Err(Unstarted::Never(reason)) => {
            let _ = writeln!(log, "opkernel: the command was not started: {reason}");
            (OpResult::not_started(&reason), SHIM_FAILED)
        }
    };
    drop(log);
    if let Some(path) = &fifo_path {
        input::close(path);
    }
    write_durable(&op_file(&launch.op, "code"), &result.render())?;
    Ok(status)
}

struct Running {
    child: u32,
    /// A keeper's report: why it could not start the command, if so.
    report: Option<io::PipeReader>,
    /// The op's FIFO, unlinked as soon as the command ends.
    fifo: Option<PathBuf>,
    copied: mpsc::Receiver<io::Result<Copied>>,
    /// Closing it (dropping) tells the copier to stop.
    stop: io::PipeWriter,
}

/// Why the command did not run.
enum Unstarted {
    /// `exec` itself refused it, with the code a shell gives (127: not
    /// found; 126: found but not runnable). The op completes with it.
    Exec { code: i32, message: String },
    /// Nothing was executed at all (user lookup, setup, fork or identity
    /// drop failed): the op is `failed`.
    Never(String),
}

/// `exec` errors a shell reports as 127 or 126; any other spawn error
/// (fork, setuid, the drop check) means nothing was executed.
pub(crate) fn exec_refusal(e: &io::Error) -> Option<i32> {
    match e.raw_os_error()? {
        libc::ENOENT => Some(127),
        libc::EACCES
        | libc::ENOEXEC
        | libc::ENOTDIR
        | libc::EISDIR
        | libc::ELOOP
        | libc::ENAMETOOLONG
        | libc::ETXTBSY => Some(126),
        _ => None,
    }
}

/// How the command's standard streams are wired, and what this process
/// keeps: the output's read end and the input's sink.
struct Wiring {
    stdin: Stdio,
    stdout: Stdio,
    stderr: Stdio,
    output: File,
    sink: Option<Sink>,
    tty: bool,
}

/// The streams for `io`: `/dev/null` or a pipe as stdin and one pipe for
/// stdout and stderr, or the three on a new terminal's slave.
fn wire(io: Io, user: RunUser) -> io::Result<Wiring> {
    if let Io::Tty { rows, cols } = io {
        let pair = pty::open_pair(rows, cols, user.uid, user.gid)?;
        return Ok(Wiring {
            stdin: pair.slave.try_clone()?.into(),
            stdout: pair.slave.try_clone()?.into(),
            stderr: pair.slave.into(),
            sink: Some(input::master_sink(&pair.master)?),
            output: pair.master,
            tty: true,
        });
    }
    let (reader, writer) = io::pipe()?;
    let stderr = writer.try_clone()?;
    let (stdin, sink) = match io {
        Io::Pipe => {
            let (r, w) = io::pipe()?;
            (Stdio::from(r), Some(Sink::Pipe(w)))
        }
        _ => (Stdio::null(), None),
    };
    Ok(Wiring {
        stdin,
        stdout: writer.into(),
        stderr: stderr.into(),
        output: File::from(std::os::fd::OwnedFd::from(reader)),
        sink,
        tty: false,
    })
}

/// Starts the copier, then the command with its output going into the
/// copier's pipe (or terminal), then the input (when it has stdin).
fn start(
    launch: &Launch,
    log: &File,
    fifo: Result<Option<Fifo>, String>,
) -> Result<Running, Unstarted> {
    // only a name is looked up: each open in the image's file system may
    // be a round trip to its storage driver (fuse-overlayfs)
    let passwd = match launch.run_as {
        RunAs::Name(_) => std::fs::read_to_string("/etc/passwd").ok(),
        RunAs::Root | RunAs::Ids(_) => None,
    };
    let user = launch
        .run_as
        .resolve(passwd.as_deref())
        .map_err(Unstarted::Never)?;
    let fifo = fifo.map_err(Unstarted::Never)?;
    let setup = |what: &str, e: io::Error| Unstarted::Never(format!("cannot {what}: {e}"));
    subreaper().map_err(|e| setup("become a subreaper", e))?;
    let wiring = wire(launch.io, user).map_err(|e| setup("wire its streams", e))?;
    let log = log.try_clone().map_err(|e| setup("share the log", e))?;
    // the copier blocks until output, the pipe's end, or this pipe's end:
    // no timer, so thousands of waiting ops cost no CPU
    let (copier_stop, stop) = io::pipe().map_err(|e| setup("make a pipe", e))?;
    let (done, copied) = mpsc::channel();
    let cap = launch.cap;
    // the terminal's foreground group is read inside its session where
    // it cannot be from outside (gVisor): a keeper leads the session
    let keeper = wiring.tty && pty::foreground_hidden(&wiring.output);
    let output = wiring.output;
    // the copier exists before the command does: a command never writes
    // into a pipe nobody reads
    std::thread::Builder::new()
        .name("copier".into())
        .spawn(move || {
            let _ = done.send(copy_capped(output, log, cap, &copier_stop));
        })
        .map_err(|e| setup("start the output copier", e))?;
    let report = keeper
        .then(io::pipe)
        .transpose()
        .map_err(|e| setup("make a pipe", e))?;
    let report_fd = report.as_ref().map(|(_, w)| w.as_raw_fd());
    let mut command =
        crate::keep::command_for(launch, report_fd).map_err(|e| setup("find the shim", e))?;
    command
        .env("HOME", SCRATCH_DIR)
        .stdin(wiring.stdin)
        .stdout(wiring.stdout)
        .stderr(wiring.stderr);
    if user != RunUser::ROOT {
        command.uid(user.uid).gid(user.gid);
    }
    let RunUser { uid, gid } = user;
    let tty = wiring.tty;
    // SAFETY: the closure only makes async-signal-safe system calls.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            sys::enter_session_dropped_to(uid, gid)?;
            if tty {
                pty::take_controlling_terminal()?;
            }
            Ok(())
        });
    }
    let spawned = command.spawn();
    // the parent's copies of the streams (the pipe's write end, the
    // slave) go with `command`: on a failed spawn the copier sees the end
    drop(command);
    let child = spawned.map_err(|e| spawn_refusal(launch, uid, gid, e))?;
    // only the keeper holds the report's write end now
    let report = report.map(|(read, _)| read);
    Ok(Running {
        child: child.id(),
        report,
        fifo: start_input(&launch.op, fifo, wiring.sink),
        copied,
        stop,
    })
}

/// Starts feeding the running command's stdin from its FIFO; returns the
/// FIFO's path. An input that cannot start closes its stdin (writes are
/// refused), never the op.
fn start_input(op: &str, fifo: Option<Fifo>, sink: Option<Sink>) -> Option<PathBuf> {
    let fifo_path = fifo.as_ref().map(Fifo::path);
    if let (Some(fifo), Some(sink)) = (fifo, sink) {
        if let Err(e) = input::start(fifo, sink) {
            eprintln!("opkernel-shim launch {op}: stdin not wired: {e}");
            if let Some(path) = &fifo_path {
                input::close(path);
            }
        }
    }
    fifo_path
}

fn spawn_refusal(launch: &Launch, uid: u32, gid: u32, e: io::Error) -> Unstarted {
    let name = launch.command[0].to_string_lossy();
    match exec_refusal(&e) {
        Some(code) => Unstarted::Exec {
            code,
            message: format!("cannot run {name:?}: {e}"),
        },
        None => Unstarted::Never(format!("cannot start {name:?} as uid {uid} gid {gid}: {e}")),
    }
}

impl Running {
    /// Waits for the command, then for the rest of its output, stops what
    /// it left behind, and counts the usage of everything reaped here. An
    /// error (the command could not be waited for) leaves no code: the op is
    /// then judged by the kernel, never given a made-up one.
    fn finish(
        self,
        log: &mut File,
        cap: u64,
        owner: &Owner<'_>,
    ) -> io::Result<(ExitRecord, Option<String>)> {
        let code = loop {
            match sys::reap(false)? {
                Some((pid, status)) if pid == self.child => {
                    if let Some(path) = &self.fifo {
                        input::close(path);
                    }
                    break sys::exit_code(status);
                }
                Some(_orphan) => continue,
                None => {
                    return Err(io::Error::other(
                        "the command's process was not ours to wait for",
                    ))
                }
            }
        };
        let copied = match self.copied.recv_timeout(DRAIN_AFTER_EXIT) {
            Ok(copied) => Some(copied),
            Err(_) => {
                // processes the command left behind still hold the pipe
                drop(self.stop);
                self.copied.recv().ok()
            }
        };
        let leftovers = tree::stop_leftovers(owner).unwrap_or_else(|e| {
            let _ = write!(
                log,
                "\n[opkernel: cannot stop what the command left behind: {e}]\n"
            );
            tree::reap_ended();
            0
        });
        match copied {
            Some(Ok(c)) => {
                if c.dropped > 0 {
                    let _ = write!(
                        log,
                        "\n[opkernel: output truncated: {} bytes over the {cap} byte cap dropped]\n",
                        c.dropped
                    );
                }
                if c.cut_off {
                    let _ = write!(
                        log,
                        "\n[opkernel: output written after the command exited is not captured]\n"
                    );
                }
            }
            Some(Err(e)) => {
                let _ = write!(log, "\n[opkernel: output copy failed: {e}]\n");
            }
            None => {
                let _ = write!(log, "\n[opkernel: output copy failed]\n");
            }
        }
        let ended = ExitRecord {
            code,
            usage: Some(sys::children_usage()),
            leftovers,
        };
        Ok((ended, self.report.and_then(crate::keep::read_report)))
    }
}

struct Copied {
    dropped: u64,
    /// Stopped while some process still held the pipe open.
    cut_off: bool,
}

/// Copies the command's output into the log, at most `cap` bytes of it;
/// the rest is counted, not written. Ends at the pipe's end, or when the
/// `stop` pipe ends (its writer dropped).
fn copy_capped(
    mut reader: File,
    mut log: File,
    cap: u64,
    stop: &io::PipeReader,
) -> io::Result<Copied> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut written = 0u64;
    let mut dropped = 0u64;
    loop {
        let ready = sys::wait_any(&[reader.as_raw_fd(), stop.as_raw_fd()])?;
        let stopping = ready[1];
        if stopping && !ready[0] {
            return Ok(Copied {
                dropped,
                cut_off: true,
            });
        }
        let n = match reader.read(&mut buf) {
            Ok(0) => {
                return Ok(Copied {
                    dropped,
                    cut_off: false,
                })
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // a terminal's master reads EIO once no process holds the slave
            Err(e) if e.raw_os_error() == Some(libc::EIO) => {
                return Ok(Copied {
                    dropped,
                    cut_off: false,
                })
            }
            Err(e) => return Err(e),
        };
        let room = cap.saturating_sub(written).min(n as u64) as usize;
        if room > 0 {
            log.write_all(&buf[..room])?;
            written += room as u64;
        }
        dropped += (n - room) as u64;
        if stopping {
            // what was there when told to stop is copied; no more
            return Ok(Copied {
                dropped,
                cut_off: true,
            });
        }
    }
}

/// Orphans of the command come to this process. gVisor (runsc) refuses
/// it (EINVAL): orphans then go to the container's init, and the op's
/// processes are found by their marker alone.
fn subreaper() -> io::Result<()> {
    match sys::become_subreaper() {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn launch_arguments_are_strict() {
        let id = "0b6f1c2e-8a47-4c1e-9d3a-5f2b7c9e1a0d";
        let ok = parse(args(&[id, "1000:1000", "65536", "sh", "-c", "x"])).unwrap();
        assert_eq!(ok.cap, 65536);
        assert_eq!(ok.command, args(&["sh", "-c", "x"]));
        for bad in [
            vec!["x", "1000:1000", "1", "true"],
            vec![id, "0:0", "1", "true"],
            vec![id, "1000:1000", "0", "true"],
            vec![id, "1000:1000", "-1", "true"],
            vec![id, "1000:1000", "1"],
            vec![id, "1000:1000", "1", ""],
        ] {
            assert!(parse(args(&bad)).is_err(), "{bad:?}");
        }
    }
}
