//! `opkernel-shim serve`: the resident launcher, the run container's main
//! process (under Docker's init, as root). It starts ops without a
//! `docker exec` round trip.
//!
//! The kernel, after winning an op's exec claim, renames
//! `.ops/inbox/<id>.req` into place. The launcher sees it by inotify,
//! **claims it by renaming it to `<id>.claimed`**, and starts
//! `opkernel-shim launch` for it exactly as `docker exec` would (same argv,
//! the op's marker, `/scratch` as working dir). A request the kernel took
//! back first (`<id>.withdrawn`) is gone for the launcher: the rename is the
//! one door, so exactly one of the two paths runs the command. A claimed
//! request is never started again, not even by a launcher restarted with
//! its container.
//!
//! Idle, it blocks in `poll` on its inotify and SIGCHLD fds: no timer, no
//! CPU. With `--poll-ms=N` (gVisor, where the host's renames raise no
//! inotify event), or with no inotify instance to be had, it looks at the
//! inbox instead: 2 ms after a look that found work, doubling up to N ms.
//! Its identity (pid, start ticks, hostname) is in `.ops/launcher.pid`.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use opkernel_shim::format::MAX_REQUEST;
use opkernel_shim::{
    valid_nonce, validate_op_id, OpResult, Request, INBOX_DIR, LAUNCHER_RECORD, LISTING_SUFFIX,
    MARKER_VAR, OPS_DIR, PROBE_SUFFIX, PS_QUESTION, SCRATCH_DIR, SHIM_PATH, STDIN_SUFFIX,
};

use crate::launch::{own_identity, write_atomic, write_durable};
use crate::sys;

pub fn main(args: Vec<OsString>) -> i32 {
    let poll_ms = match parse_args(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("opkernel-shim serve: {e}");
            return 2;
        }
    };
    match serve(poll_ms) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("opkernel-shim serve: {e}");
            1
        }
    }
}

/// The longest pause between two looks at the inbox when polling, unless
/// `--poll-ms` says otherwise.
const DEFAULT_POLL_MS: i32 = 25;
/// The pause after a look that found work: a burst is taken at once.
const POLL_FLOOR_MS: i32 = 2;

/// `serve` or `serve --poll-ms=N` (1..=1000): poll the inbox at most every
/// N ms instead of waiting on inotify.
fn parse_args(args: &[OsString]) -> Result<Option<i32>, String> {
    match args {
        [] => Ok(None),
        [one] => one
            .to_str()
            .and_then(|a| a.strip_prefix("--poll-ms="))
            .and_then(|n| n.parse::<i32>().ok())
            .filter(|n| (1..=1000).contains(n))
            .map(Some)
            .ok_or_else(|| format!("expected --poll-ms=1..1000, got {one:?}")),
        _ => Err("takes at most one argument (--poll-ms=N)".to_owned()),
    }
}

/// How the launcher learns of new requests: inotify where it sees the
/// kernel's writes (runc), else a look at the inbox every few ms: under
/// gVisor the host's renames into a bind mount raise no inotify event, and
/// a host out of inotify instances gives none.
enum Watch {
    Inotify(std::os::fd::OwnedFd),
    /// The pause doubles after each look that finds nothing, from
    /// [`POLL_FLOOR_MS`] up to `max_ms`.
    Poll {
        max_ms: i32,
        next_ms: i32,
    },
}

impl Watch {
    fn new(inbox: &Path, poll_ms: Option<i32>) -> io::Result<Watch> {
        let poll = |max_ms| Watch::Poll {
            max_ms,
            next_ms: POLL_FLOOR_MS,
        };
        if let Some(max_ms) = poll_ms {
            return Ok(poll(max_ms));
        }
        match sys::inotify_dir(inbox) {
            Ok(fd) => Ok(Watch::Inotify(fd)),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENOSPC | libc::ENOSYS)
                ) =>
            {
                eprintln!("opkernel-shim serve: no inotify ({e}): looking at the inbox every {DEFAULT_POLL_MS} ms");
                Ok(poll(DEFAULT_POLL_MS))
            }
            Err(e) => Err(e),
        }
    }
}

fn serve(poll_ms: Option<i32>) -> io::Result<()> {
    // launches inherit it (no per-spawn chdir keeps spawning on the cheap
    // posix_spawn path)
    std::env::set_current_dir(SCRATCH_DIR)?;
    let children = sys::sigchld_fd()?;
    let inbox = Path::new(INBOX_DIR);
    match std::fs::DirBuilder::new().mode(0o700).create(inbox) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let mut watch = Watch::new(inbox, poll_ms)?;
    let me = own_identity()?;
    // every container of a run shares `.ops`: this launcher takes only
    // what names its own container's hostname
    let host = me.hostname.clone();
    // requests renamed in before the watch existed: found by the first scan
    run_all(inbox, &inbox_entries(inbox).requests, &host);
    write_atomic(&Path::new(OPS_DIR).join(LAUNCHER_RECORD), &me.render())?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // the container lives as long as this loop: an error is logged and
        // the loop goes on (after a pause, so it cannot spin)
        if let Err(e) = step(inbox, &host, &mut watch, &children, &mut buf) {
            eprintln!("opkernel-shim serve: {e}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// One wake-up: claims and starts the requests that arrived, answers the
/// probes asked, reaps ended launches.
fn step(
    inbox: &Path,
    host: &str,
    watch: &mut Watch,
    children: &std::os::fd::OwnedFd,
    buf: &mut [u8],
) -> io::Result<()> {
    match watch {
        Watch::Inotify(events) => {
            let ready = sys::wait_any(&[events.as_raw_fd(), children.as_raw_fd()])?;
            reap(ready[1], children, buf)?;
            if ready[0] {
                read_events(inbox, events, buf)?.serve(inbox, host);
            }
        }
        Watch::Poll { max_ms, next_ms } => {
            let ready = sys::wait_any_for(&[children.as_raw_fd()], *next_ms)?;
            reap(ready[0], children, buf)?;
            let worked = inbox_entries(inbox).serve(inbox, host);
            *next_ms = if worked > 0 {
                POLL_FLOOR_MS
            } else {
                (*next_ms * 2).min(*max_ms)
            };
        }
    }
    Ok(())
}

/// Reaps the ended launches when the SIGCHLD fd is `ready`.
fn reap(ready: bool, children: &std::os::fd::OwnedFd, buf: &mut [u8]) -> io::Result<()> {
    if ready {
        while sys::read_now(children, buf)? > 0 {}
        while let Ok(Some(_)) = sys::reap(true) {}
    }
    Ok(())
}

/// What the inotify events name (all of the inbox after an overflow).
fn read_events(inbox: &Path, events: &std::os::fd::OwnedFd, buf: &mut [u8]) -> io::Result<Waiting> {
    let mut overflow = false;
    let mut waiting = Waiting::default();
    loop {
        let n = sys::read_now(events, buf)?;
        if n == 0 {
            break;
        }
        for (mask, name) in inotify_events(&buf[..n]) {
            overflow |= mask & libc::IN_Q_OVERFLOW != 0;
            waiting.add(&name);
        }
    }
    if overflow {
        return Ok(inbox_entries(inbox));
    }
    Ok(waiting)
}

/// `(mask, name)` of each event in an inotify read.
fn inotify_events(mut bytes: &[u8]) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    while bytes.len() >= 16 {
        let word = |at: usize| {
            u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let (mask, len) = (word(4), word(12) as usize);
        let Some(name) = bytes.get(16..16 + len) else {
            break;
        };
        let name = name.split(|&b| b == 0).next().unwrap_or_default();
        out.push((mask, String::from_utf8_lossy(name).into_owned()));
        bytes = &bytes[16 + len..];
    }
    out
}

/// What waits in the inbox: request ids, probe nonces, stdin nonces.
#[derive(Default)]
struct Waiting {
    requests: Vec<String>,
    probes: Vec<String>,
    stdin: Vec<String>,
}

impl Waiting {
    /// Files one inbox entry by its name.
    fn add(&mut self, name: &str) {
        if let Some(id) = name.strip_suffix(".req") {
            self.requests.push(id.to_owned());
        } else if let Some(nonce) = name.strip_suffix(&format!(".{PROBE_SUFFIX}")) {
            self.probes.push(nonce.to_owned());
        } else if let Some(nonce) = name.strip_suffix(&format!(".{STDIN_SUFFIX}")) {
            self.stdin.push(nonce.to_owned());
        }
    }

    /// Answers the questions and starts the requests; how many it took.
    fn serve(self, inbox: &Path, host: &str) -> usize {
        // an op's writes come one at a time (the kernel waits for each
        // answer), so their order among questions does not matter
        answer_probes(inbox, &self.probes, host)
            + crate::relay::relay_all(inbox, &self.stdin, host)
            + run_all(inbox, &self.requests, host)
    }
}

/// Everything waiting in the inbox, from one read of the directory.
fn inbox_entries(inbox: &Path) -> Waiting {
    let mut waiting = Waiting::default();
    let Ok(entries) = std::fs::read_dir(inbox) else {
        return waiting;
    };
    for name in entries.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
        waiting.add(&name);
    }
    waiting.requests.sort();
    waiting
}

/// Answers probes asked through the inbox: one `/proc` scan serves all of
/// them (no `docker exec` round trip), and one process table all the `ps`
/// questions. The answer is renamed into place, then the question removed.
fn answer_probes(inbox: &Path, nonces: &[String], host: &str) -> usize {
    // a probe names the container it asks about (its content: the
    // hostname, then a tab and `ps` for the process table)
    let ps_question = format!("{host}\t{PS_QUESTION}");
    let mut asked: Vec<(&String, bool)> = Vec::new();
    for n in nonces.iter().filter(|n| valid_nonce(n)) {
        match std::fs::read_to_string(inbox.join(format!("{n}.{PROBE_SUFFIX}"))) {
            Ok(q) if q == host => asked.push((n, false)),
            Ok(q) if q == ps_question => asked.push((n, true)),
            _ => {}
        }
    }
    let listing = asked
        .iter()
        .any(|(_, ps)| !ps)
        .then(crate::scan::listing)
        .and_then(Result::ok);
    let table = asked
        .iter()
        .any(|(_, ps)| *ps)
        .then(crate::ps::table)
        .and_then(Result::ok);
    let mut answered = 0;
    for (nonce, ps) in asked {
        let Some(answer) = (if ps { &table } else { &listing }) else {
            continue;
        };
        if write_atomic(&inbox.join(format!("{nonce}.{LISTING_SUFFIX}")), answer).is_ok() {
            answered += 1;
        }
        let _ = std::fs::remove_file(inbox.join(format!("{nonce}.{PROBE_SUFFIX}")));
    }
    answered
}

/// How long a burst's starts may go on before the launcher looks at its
/// inbox again (slow starts, as under gVisor, would otherwise leave later
/// requests unclaimed past the kernel's claim window and probes
/// unanswered).
const RELOOK: Duration = Duration::from_millis(100);

/// How much starting a launcher queues up: it claims only as many
/// requests as it can start within this, by the time a start has been
/// taking. The rest stay in the inbox for its next look, or for the
/// kernel to take back and start by `docker exec`. So a claim starts
/// within the kernel's claim window plus this (30 s with the defaults),
/// well inside the window in which the kernel waits for a claimed op's
/// evidence (60 s, the grace): it never gives up on a start that then
/// happens.
const QUEUE_BUDGET: Duration = Duration::from_secs(20);

/// The time a start has been taking, in microseconds (a moving average),
/// first taken to be 50 ms.
static PER_START_US: AtomicU64 = AtomicU64::new(50_000);

/// How many more requests fit the queue budget after `queued`.
fn room(queued: usize) -> usize {
    let per = PER_START_US.load(Ordering::Relaxed).max(1);
    let fits = (QUEUE_BUDGET.as_micros() as u64 / per) as usize;
    // an empty queue always takes one: the launcher never stalls
    fits.saturating_sub(queued).max(usize::from(queued == 0))
}

/// Starts a claimed request, timing it into [`PER_START_US`].
fn start_timed(id: &str, req: Result<Request, String>) {
    let began = Instant::now();
    start_claimed(id, req);
    let took = began.elapsed().as_micros() as u64;
    let old = PER_START_US.load(Ordering::Relaxed);
    PER_START_US.store((old * 7 + took) / 8, Ordering::Relaxed);
}

/// Claims the requests of `ids` meant for this container (as many as fit
/// [`QUEUE_BUDGET`]), makes the claims durable with one sync of the inbox,
/// then starts what it claimed. It looks at the inbox again every
/// [`RELOOK`] of starting (claims, probes, stdin, ended launches), and at
/// once when its queue ran dry with requests left for want of room.
/// Returns how many it claimed.
fn run_all(inbox: &Path, ids: &[String], host: &str) -> usize {
    let first = room(0);
    let mut queue: VecDeque<_> = claim_burst(inbox, ids, host, first).into();
    let mut left = queue.len() == first;
    let mut count = queue.len();
    let mut looked = Instant::now();
    loop {
        if let Some((id, req)) = queue.pop_front() {
            start_timed(&id, req);
        }
        if queue.is_empty() && !left {
            return count;
        }
        if queue.is_empty() || looked.elapsed() >= RELOOK {
            crate::tree::reap_ended();
            let waiting = inbox_entries(inbox);
            answer_probes(inbox, &waiting.probes, host);
            crate::relay::relay_all(inbox, &waiting.stdin, host);
            let fits = room(queue.len());
            let more = claim_burst(inbox, &waiting.requests, host, fits);
            left = more.len() == fits;
            if queue.is_empty() && more.is_empty() {
                return count;
            }
            count += more.len();
            queue.extend(more);
            looked = Instant::now();
        }
    }
}

/// Claims the requests of `ids` meant for this container (at most
/// `room` of them) and makes the
/// claims durable with one sync of the inbox (SPEC §28: before any command
/// can start; one sync for the burst, not one per request). When the sync
/// fails none of them starts: a claim that may not survive a host crash
/// could be claimed and run again after it.
fn claim_burst(
    inbox: &Path,
    ids: &[String],
    host: &str,
    room: usize,
) -> Vec<(String, Result<Request, String>)> {
    let claimed: Vec<(String, Result<Request, String>)> = ids
        .iter()
        .filter_map(|id| claim(inbox, id, host).map(|req| (id.clone(), req)))
        .take(room)
        .collect();
    if claimed.is_empty() {
        return claimed;
    }
    match std::fs::File::open(inbox).and_then(|dir| dir.sync_all()) {
        Ok(()) => claimed,
        Err(e) => {
            let reason = format!("the launcher could not make its claim durable: {e}");
            claimed
                .into_iter()
                .map(|(id, _)| (id, Err(reason.clone())))
                .collect()
        }
    }
}

/// Claims one request meant for this container: reads it once, then the
/// rename (made durable by the caller, with the burst's). `None` when it names another container, was withdrawn by the
/// kernel or claimed already; a request that cannot be read or is filed
/// under another op's id is claimed too (and answered not-started).
fn claim(inbox: &Path, id: &str, host: &str) -> Option<Result<Request, String>> {
    validate_op_id(id).ok()?;
    let pending = inbox.join(format!("{id}.req"));
    let req = read_request(&pending).and_then(|req| {
        if req.op_id == id {
            Ok(req)
        } else {
            Err(format!("request for {} filed as {id}", req.op_id))
        }
    });
    if req.as_ref().is_ok_and(|req| req.host != host) {
        return None;
    }
    std::fs::rename(&pending, inbox.join(format!("{id}.claimed"))).ok()?;
    Some(req)
}

/// Starts a claimed op. Once claimed, the op either starts or gets a
/// `not-started` record: it is never left silent.
fn start_claimed(id: &str, req: Result<Request, String>) {
    let started = req
        .and_then(|req| start(&req).map_err(|e| format!("the launcher could not start it: {e}")));
    if let Err(reason) = started {
        let code = Path::new(OPS_DIR).join(format!("{id}.code"));
        let _ = write_durable(&code, &OpResult::not_started(&reason).render());
    }
}

fn read_request(path: &Path) -> Result<Request, String> {
    let mut bytes = Vec::new();
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .and_then(|f| f.take(MAX_REQUEST as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("unreadable request: {e}"))?;
    Request::parse(&bytes).map_err(|e| format!("bad request: {e}"))
}

/// Starts `opkernel-shim launch` for the request, as `docker exec` would.
fn start(req: &Request) -> io::Result<()> {
    let mut launch = Command::new(SHIM_PATH);
    launch.arg("launch");
    if req.io != opkernel_shim::Io::Null {
        launch.arg(format!("--io={}", req.io.spec()));
    }
    launch
        .arg(&req.op_id)
        .arg(&req.run_as)
        .arg(req.log_cap.to_string())
        .args(&req.argv)
        .env(MARKER_VAR, &req.op_id)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inotify_events_parse_names_and_masks() {
        let mut bytes = Vec::new();
        for (mask, name) in [(libc::IN_MOVED_TO, "a.req"), (libc::IN_Q_OVERFLOW, "")] {
            let padded = if name.is_empty() { 0 } else { 16 };
            bytes.extend_from_slice(&1i32.to_ne_bytes());
            bytes.extend_from_slice(&mask.to_ne_bytes());
            bytes.extend_from_slice(&0u32.to_ne_bytes());
            bytes.extend_from_slice(&(padded as u32).to_ne_bytes());
            let mut field = name.as_bytes().to_vec();
            field.resize(padded, 0);
            bytes.extend_from_slice(&field);
        }
        assert_eq!(
            inotify_events(&bytes),
            vec![
                (libc::IN_MOVED_TO, "a.req".to_owned()),
                (libc::IN_Q_OVERFLOW, String::new())
            ]
        );
        assert_eq!(inotify_events(&bytes[..20]), vec![]);
    }
}
