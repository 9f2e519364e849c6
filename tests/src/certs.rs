//! Certificates the tests make for themselves with Debian's `openssl`: a
//! CA, and server certificates it signs for the names and addresses a
//! test needs (SPEC §29's TLS, the egress tests' outside server).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `cmd`; its stdout, or an error with its stderr.
pub fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output()?;
    anyhow::ensure!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A CA in `dir`: `<name>.pem` (its certificate) and `<name>.key`.
pub fn ca(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let pem = dir.join(format!("{name}.pem"));
    run(Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", &format!("/CN=opkernel test CA {name}"), "-keyout"])
        .arg(dir.join(format!("{name}.key")))
        .arg("-out")
        .arg(&pem))?;
    Ok(pem)
}

/// A server certificate `<name>.pem` and key `<name>.key` in `dir`,
/// signed by the CA `ca` (made by [`ca`] in the same dir), for `sans`
/// (`DNS:host`, `IP:127.0.0.1`); both readable by anyone (a server in a
/// container may run as another user).
pub fn server(
    dir: &Path,
    ca: &str,
    name: &str,
    sans: &[&str],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let d = |f: String| dir.join(f);
    let (pem, key, csr) = (
        d(format!("{name}.pem")),
        d(format!("{name}.key")),
        d(format!("{name}.csr")),
    );
    run(Command::new("openssl")
        .args(["req", "-newkey", "rsa:2048", "-nodes", "-subj"])
        .arg(format!("/CN={name}"))
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&csr))?;
    let ext = d(format!("{name}.ext"));
    std::fs::write(&ext, format!("subjectAltName={}\n", sans.join(",")))?;
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-in"])
        .arg(&csr)
        .arg("-CA")
        .arg(d(format!("{ca}.pem")))
        .arg("-CAkey")
        .arg(d(format!("{ca}.key")))
        .args(["-CAcreateserial", "-extfile"])
        .arg(&ext)
        .arg("-out")
        .arg(&pem))?;
    run(Command::new("chmod").args(["-R", "a+rX"]).arg(dir))?;
    Ok((pem, key))
}
