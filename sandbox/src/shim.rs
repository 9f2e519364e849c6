//! The in-container side of every op, seen from the host: the static
//! `opkernel-shim` binary (built by `build.rs`, embedded here, installed
//! into the kernel home and bind-mounted read-only at [`SHIM_PATH`]) and the
//! argv of each of its verbs, built by pure functions.
//!
//! `launch` runs as root in the container, writes `.pid`, drops the command
//! to the run user in its own session, caps its output into `.log` and
//! renames `.code` (code and usage) into place; `probe` lists the marked
//! processes; `signal` sends TERM/KILL to an op's identity-checked
//! processes. The formats they print and write live in `opkernel_shim`.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Result, SandboxError};

pub use opkernel_shim::{
    marker, parse_probe, parse_signalled, validate_op_id as check_op_id, Io, MarkedProcess,
    Request, RunAs, Signal, MARKER_VAR, OPS_DIR, SHIM_PATH,
};

/// The static shim binary this kernel speaks to.
pub const SHIM_BINARY: &[u8] = include_bytes!(env!("OPKERNEL_SHIM_BINARY"));

/// sha256 of [`SHIM_BINARY`], hex (computed once).
pub fn shim_digest() -> &'static str {
    static DIGEST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DIGEST.get_or_init(|| hex::encode(Sha256::digest(SHIM_BINARY)))
}

/// Installs the shim as `<dir>/opkernel-shim-<digest prefix>` (root's, mode
/// 0755) unless that exact file is there; returns its path. A file name per
/// content means an installed shim is never rewritten under a container
/// that mounts it.
pub fn install_shim(dir: &Path) -> Result<PathBuf> {
    let path = dir.join(format!("opkernel-shim-{}", &shim_digest()[..16]));
    if std::fs::read(&path).is_ok_and(|bytes| bytes == SHIM_BINARY) {
        return Ok(path);
    }
    std::fs::create_dir_all(dir).map_err(|e| SandboxError::io(dir, e))?;
    let tmp = dir.join(format!(".opkernel-shim-{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o755)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        file.write_all(SHIM_BINARY)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o755))?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        SandboxError::io(&path, e)
    })?;
    Ok(path)
}

/// Op ids are UUIDs in their hyphenated lowercase form; nothing else may be
/// spliced into an argv or a path.
pub fn validate_op_id(op_id: &str) -> Result<()> {
    check_op_id(op_id).map_err(SandboxError::Invalid)
}

/// What the launch of one op needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec<'a> {
    /// The op's id, a lowercase UUID (checked before it reaches an argv or a
    /// path).
    pub op_id: &'a str,
    /// `OPKERNEL_RUN_AS` (`uid:gid`, a user name); `None` runs the command as root.
    pub run_as: Option<&'a str>,
    /// Log size cap in bytes; what passes it is dropped (and counted in a mark).
    pub log_cap_bytes: u64,
    /// How its stdin is wired (SPEC §25).
    pub io: Io,
}

/// The launch of an op, validated: what goes into `docker exec` as an argv
/// or, addressed to the container with hostname `host`, into the
/// launcher's inbox as a request.
pub fn launch_request(spec: &LaunchSpec<'_>, command: &[String], host: &str) -> Result<Request> {
    validate_op_id(spec.op_id)?;
    validate_command(command)?;
    let run_as = match spec.run_as {
        Some(user) => RunAs::parse(user).map_err(SandboxError::Invalid)?,
        None => RunAs::Root,
    };
    Ok(Request {
        host: host.to_owned(),
        op_id: spec.op_id.to_owned(),
        run_as: run_as.spec(),
        log_cap: spec.log_cap_bytes.max(1),
        io: spec.io,
        argv: command.to_vec(),
    })
}

/// The exec argv of an op: `/.opkernel/shim launch [--io=<mode>] <id>
/// <run-as> <cap> ARGV...` (the same as the launcher runs for a request).
pub fn launch_argv(spec: &LaunchSpec<'_>, command: &[String]) -> Result<Vec<String>> {
    let req = launch_request(spec, command, "exec")?;
    let mut argv = vec![SHIM_PATH.to_owned(), "launch".to_owned()];
    if req.io != Io::Null {
        argv.push(format!("--io={}", req.io.spec()));
    }
    argv.extend([req.op_id, req.run_as, req.log_cap.to_string()]);
    argv.extend(req.argv);
    Ok(argv)
}

/// The probe's argv: lists every marked process of the container.
pub fn probe_argv() -> Vec<String> {
    vec![SHIM_PATH.to_owned(), "probe".to_owned()]
}

/// The process table's argv: every marked process with its owner, CPU,
/// memory, age and command (the operator's inspect).
pub fn ps_argv() -> Vec<String> {
    vec![SHIM_PATH.to_owned(), "ps".to_owned()]
}

/// The signaller's argv: `signal` to every process of the op except its
/// launcher (with `group`: of its foreground process group only), each
/// checked to carry the op's marker and to have started no earlier than
/// the launcher (a reused pid fails one of the two).
pub fn signal_argv(
    op_id: &str,
    launcher_pid: u32,
    launcher_start_ticks: u64,
    signal: Signal,
    group: bool,
) -> Result<Vec<String>> {
    validate_op_id(op_id)?;
    let mut argv = vec![
        SHIM_PATH.to_owned(),
        "signal".to_owned(),
        op_id.to_owned(),
        launcher_pid.to_string(),
        launcher_start_ticks.to_string(),
        signal.name().to_owned(),
    ];
    if group {
        argv.push("group".to_owned());
    }
    Ok(argv)
}

/// Total argv size bound (bytes, including one separator per argument).
pub const MAX_COMMAND_BYTES: usize = 256 * 1024;

/// A command is a non-empty argv without NUL bytes and of bounded size.
pub fn validate_command(command: &[String]) -> Result<()> {
    if command.is_empty() {
        return Err(SandboxError::Invalid(
            "command must be a non-empty argv array".into(),
        ));
    }
    if command[0].is_empty() {
        return Err(SandboxError::Invalid("command[0] must not be empty".into()));
    }
    if let Some(i) = command.iter().position(|a| a.contains('\0')) {
        return Err(SandboxError::Invalid(format!(
            "command[{i}] contains a NUL byte"
        )));
    }
    let total: usize = command.iter().map(|a| a.len() + 1).sum();
    if total > MAX_COMMAND_BYTES {
        return Err(SandboxError::Invalid(format!(
            "command is {total} bytes, the limit is {MAX_COMMAND_BYTES}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0b6f1c2e-8a47-4c1e-9d3a-5f2b7c9e1a0d";

    #[test]
    fn the_embedded_shim_is_a_static_elf() {
        assert_eq!(&SHIM_BINARY[..4], b"\x7fELF");
        // no PT_INTERP: nothing in the image has to load it
        assert!(!SHIM_BINARY
            .windows(b"/lib64/ld-linux".len())
            .any(|w| w == b"/lib64/ld-linux"));
    }

    #[test]
    fn install_is_idempotent_and_executable() {
        let dir = std::env::temp_dir().join(format!("opkernel-shim-test-{}", std::process::id()));
        let path = install_shim(&dir).unwrap();
        let again = install_shim(&dir).unwrap();
        assert_eq!(path, again);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o755);
        assert_eq!(meta.len(), SHIM_BINARY.len() as u64);
        // a damaged copy is replaced
        std::fs::write(&path, b"broken").unwrap();
        install_shim(&dir).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), SHIM_BINARY);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn launch_argv_passes_the_command_verbatim() {
        let spec = LaunchSpec {
            op_id: ID,
            run_as: Some("1000:1000"),
            log_cap_bytes: 1024,
            io: Io::Null,
        };
        let cmd = vec![
            "bash".to_owned(),
            "-lc".to_owned(),
            "echo 'a b' \"$X\"".to_owned(),
        ];
        let argv = launch_argv(&spec, &cmd).unwrap();
        assert_eq!(argv[..5], [SHIM_PATH, "launch", ID, "1000:1000", "1024"]);
        assert_eq!(&argv[5..], &cmd[..]);
        let root = LaunchSpec {
            run_as: None,
            ..spec.clone()
        };
        assert_eq!(launch_argv(&root, &cmd).unwrap()[3], "root");
        let tty = LaunchSpec {
            io: Io::Tty { rows: 24, cols: 80 },
            ..spec.clone()
        };
        assert_eq!(
            launch_argv(&tty, &cmd).unwrap()[..4],
            [SHIM_PATH, "launch", "--io=tty:24x80", ID]
        );
    }

    #[test]
    fn launch_argv_refuses_odd_users_and_ids() {
        let cmd = vec!["true".to_owned()];
        for (op_id, run_as) in [(ID, Some("a'b")), (ID, Some("0:0")), ("x; rm -rf /", None)] {
            let spec = LaunchSpec {
                op_id,
                run_as,
                log_cap_bytes: 1,
                io: Io::Pipe,
            };
            assert!(launch_argv(&spec, &cmd).is_err(), "{spec:?}");
        }
    }

    #[test]
    fn commands_are_validated() {
        assert!(validate_command(&[]).is_err());
        assert!(validate_command(&["".to_owned()]).is_err());
        assert!(validate_command(&["a\0b".to_owned()]).is_err());
        assert!(validate_command(&["x".repeat(MAX_COMMAND_BYTES)]).is_err());
        assert!(validate_command(&["true".to_owned()]).is_ok());
    }

    #[test]
    fn signal_argv_names_the_launcher_and_its_start() {
        let argv = signal_argv(ID, 42, 1000, Signal::Kill, false).unwrap();
        assert_eq!(argv, [SHIM_PATH, "signal", ID, "42", "1000", "KILL"]);
        let argv = signal_argv(ID, 42, 1000, Signal::Int, true).unwrap();
        assert_eq!(
            argv,
            [SHIM_PATH, "signal", ID, "42", "1000", "INT", "group"]
        );
        assert!(signal_argv("nope", 42, 1000, Signal::Kill, false).is_err());
    }
}
