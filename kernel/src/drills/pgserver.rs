//! A PostgreSQL server of a drill's own (Debian's `postgresql` package):
//! `initdb` into a fresh directory under the temp dir, listening on a free
//! loopback port, stopped and removed when dropped. The `store-outage`
//! drill crashes it (`pg_ctl -m immediate`) and starts it again; no other
//! test shares it, so their stores are never cut.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// A running (or crashed) throwaway server.
pub struct PgServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl PgServer {
    /// Makes and starts a new server; its superuser is `opkernel`.
    pub fn start() -> anyhow::Result<PgServer> {
        let bin = pg_bin()?;
        let dir = std::env::temp_dir().join(format!(
            "opkernel-pg-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..10]
        ));
        std::fs::create_dir_all(&dir)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let server = PgServer { bin, dir, port };
        if as_root() {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&server.dir))?;
        }
        let data = server.data();
        server.pg("initdb", &["-A", "trust", "-U", "opkernel", "-D", &data])?;
        server.resume()?;
        Ok(server)
    }

    /// The URL a kernel is given (`OPKERNEL_STORE`).
    pub fn url(&self) -> String {
        format!("postgres://opkernel@127.0.0.1:{}/postgres", self.port)
    }

    /// Crashes the server: every backend killed at once, no checkpoint
    /// (`pg_ctl -m immediate`); the next start runs crash recovery.
    pub fn kill(&self) -> anyhow::Result<()> {
        let data = self.data();
        self.pg("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"])
    }

    /// Starts the server (again) on its port.
    pub fn resume(&self) -> anyhow::Result<()> {
        let data = self.data();
        let log = self.dir.join("log").display().to_string();
        let options = format!(
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories={} -c max_connections=100",
            self.port,
            self.dir.display()
        );
        self.pg(
            "pg_ctl",
            &[
                "-D", &data, "-l", &log, "-w", "-t", "60", "-o", &options, "start",
            ],
        )
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    /// Runs one of the server's programs, as `postgres` when this is root
    /// (PostgreSQL refuses to run as root).
    fn pg(&self, program: &str, args: &[&str]) -> anyhow::Result<()> {
        let path = self.bin.join(program);
        let mut cmd = if as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        };
        run(cmd.args(args).current_dir(&self.dir))
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The newest installed server's programs (Debian: /usr/lib/postgresql/N/bin).
fn pg_bin() -> anyhow::Result<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            Path::new(&bin).join("initdb").exists().then_some((n, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).context(
        "this drill needs a PostgreSQL server: Debian's `postgresql` package (scripts/pg.sh start installs it)",
    )
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
