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
//! CPU. Its identity (pid, start ticks, hostname) is in `.ops/launcher.pid`.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use opkernel_shim::format::MAX_REQUEST;
use opkernel_shim::{
    valid_nonce, validate_op_id, OpResult, Request, INBOX_DIR, LAUNCHER_RECORD, LISTING_SUFFIX,
    MARKER_VAR, OPS_DIR, PROBE_SUFFIX, SCRATCH_DIR, SHIM_PATH,
};

use crate::launch::{own_identity, write_atomic};
use crate::sys;

pub fn main(args: Vec<OsString>) -> i32 {
    if !args.is_empty() {
        eprintln!("opkernel-shim serve: takes no arguments");
        return 2;
    }
    match serve() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("opkernel-shim serve: {e}");
            1
        }
    }
}

fn serve() -> io::Result<()> {
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
    let events = sys::inotify_dir(inbox)?;
    // requests renamed in before the watch existed: found by the first scan
    scan(inbox);
    write_atomic(
        &Path::new(OPS_DIR).join(LAUNCHER_RECORD),
        &own_identity()?.render(),
    )?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let ready = sys::wait_any(&[events.as_raw_fd(), children.as_raw_fd()])?;
        if ready[0] {
            let mut overflow = false;
            let mut pending = Vec::new();
            let mut probes = Vec::new();
            loop {
                let n = sys::read_now(&events, &mut buf)?;
                if n == 0 {
                    break;
                }
                for (mask, name) in inotify_events(&buf[..n]) {
                    overflow |= mask & libc::IN_Q_OVERFLOW != 0;
                    if let Some(id) = name.strip_suffix(".req") {
                        pending.push(id.to_owned());
                    } else if let Some(nonce) = name.strip_suffix(&format!(".{PROBE_SUFFIX}")) {
                        probes.push(nonce.to_owned());
                    }
                }
            }
            if overflow {
                pending.extend(pending_ids(inbox));
                probes.extend(pending_probes(inbox));
            }
            run_all(inbox, &pending);
            answer_probes(inbox, &probes);
        }
        if ready[1] {
            while sys::read_now(&children, &mut buf)? > 0 {}
            while let Ok(Some(_)) = sys::reap(true) {}
        }
    }
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

/// The ids of the requests waiting in the inbox.
fn pending_ids(inbox: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(inbox) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".req").map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

/// The nonces of the probes waiting in the inbox.
fn pending_probes(inbox: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(inbox) else {
        return Vec::new();
    };
    let suffix = format!(".{PROBE_SUFFIX}");
    entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(&suffix).map(str::to_owned))
        .collect()
}

/// Answers probes asked through the inbox: one `/proc` scan serves all of
/// them (no `docker exec` round trip). The listing is renamed into place,
/// then the question removed.
fn answer_probes(inbox: &Path, nonces: &[String]) {
    let nonces: Vec<&String> = nonces.iter().filter(|n| valid_nonce(n)).collect();
    if nonces.is_empty() {
        return;
    }
    let Ok(listing) = crate::scan::listing() else {
        return;
    };
    for nonce in nonces {
        let asked = inbox.join(format!("{nonce}.{PROBE_SUFFIX}"));
        if std::fs::symlink_metadata(&asked).is_err() {
            continue;
        }
        let _ = write_atomic(&inbox.join(format!("{nonce}.{LISTING_SUFFIX}")), &listing);
        let _ = std::fs::remove_file(asked);
    }
}

/// Claims every pending request in the inbox and starts its op.
fn scan(inbox: &Path) {
    run_all(inbox, &pending_ids(inbox));
}

/// Claims all of `ids` first (renames are cheap, so a burst is claimed at
/// once), then starts what it claimed.
fn run_all(inbox: &Path, ids: &[String]) {
    let claimed: Vec<&String> = ids.iter().filter(|id| claim(inbox, id)).collect();
    for id in claimed {
        start_claimed(inbox, id);
    }
}

/// Claims one request: the rename. False when it was withdrawn by the
/// kernel or claimed already.
fn claim(inbox: &Path, id: &str) -> bool {
    validate_op_id(id).is_ok()
        && std::fs::rename(
            inbox.join(format!("{id}.req")),
            inbox.join(format!("{id}.claimed")),
        )
        .is_ok()
}

/// Starts a claimed op. Once claimed, the op either starts or gets a
/// `not-started` record: it is never left silent.
fn start_claimed(inbox: &Path, id: &str) {
    let claimed = inbox.join(format!("{id}.claimed"));
    let started = read_request(&claimed)
        .and_then(|req| {
            if req.op_id == id {
                Ok(req)
            } else {
                Err(format!("request for {} filed as {id}", req.op_id))
            }
        })
        .and_then(|req| start(&req).map_err(|e| format!("the launcher could not start it: {e}")));
    if let Err(reason) = started {
        let code = Path::new(OPS_DIR).join(format!("{id}.code"));
        let _ = write_atomic(&code, &OpResult::not_started(&reason).render());
    }
}

fn read_request(path: &PathBuf) -> Result<Request, String> {
    let mut bytes = Vec::new();
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .and_then(|f| f.take(MAX_REQUEST as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("unreadable request: {e}"))?;
    Request::parse(&bytes).map_err(|e| format!("bad request: {e}"))
}

/// Starts `opkernel-shim launch` for the request, as `docker exec` would.
fn start(req: &Request) -> io::Result<()> {
    Command::new(SHIM_PATH)
        .arg("launch")
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
