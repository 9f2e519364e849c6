//! Shared helpers of the end-to-end tests: a sandbox on a throwaway home,
//! unique run ids, and polling with a deadline instead of fixed sleeps.

pub mod certs;
pub mod cluster;
pub mod outside;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sandbox::{Profile, RunIdentity, Sandbox};

/// A throwaway home directory under the system temp dir.
pub fn temp_home(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "opkernel-test-{tag}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

pub fn unique_run(tag: &str) -> String {
    format!(
        "t-{tag}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

pub fn image() -> String {
    std::env::var("OPKERNEL_IMAGE").unwrap_or_else(|_| Profile::default().image)
}

/// The runtime the tests' containers run under: `OPKERNEL_RUNTIME` (the
/// kernels they start read it too), `runc` when unset.
pub fn runtime() -> sandbox::Runtime {
    opkernel::drills::env_runtime()
}

pub fn test_profile() -> Profile {
    Profile {
        image: image(),
        runtime: runtime(),
        ..Profile::default()
    }
}

/// The run images the lifecycle tests and drills run against: the
/// project's busybox image and a real Debian (`scripts/build-image.sh
/// --debian`). Both must exist; a missing one fails its tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Image {
    Default,
    Debian,
}

impl Image {
    pub fn name(self) -> String {
        match self {
            Image::Default => image(),
            Image::Debian => "opkernel-sandbox:debian".to_owned(),
        }
    }

    /// A kernel whose run containers are made from this image.
    pub async fn kernel(
        self,
        tag: &str,
    ) -> anyhow::Result<opkernel::drills::harness::KernelProcess> {
        let bin = opkernel::drills::harness::kernel_binary()?;
        let name = self.name();
        opkernel::drills::harness::KernelProcess::start(&bin, tag, &[("OPKERNEL_IMAGE", &name)])
            .await
    }

    pub fn profile(self) -> Profile {
        Profile {
            image: self.name(),
            runtime: runtime(),
            ..Profile::default()
        }
    }
}

/// Runs each named `async fn(Image)` test once per run image:
/// `image_tests!(a, b)` makes `a::default_image`, `a::debian_image`, ...
#[macro_export]
macro_rules! image_tests {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test]
                async fn default_image() {
                    super::$name($crate::Image::Default).await
                }
                #[tokio::test]
                async fn debian_image() {
                    super::$name($crate::Image::Debian).await
                }
            }
        )+
    };
}

/// Polls `check` until it returns `Some` or the deadline passes.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A sandbox on a fresh home; removes its containers and home on drop.
pub struct SandboxFixture {
    pub sandbox: Sandbox,
    pub home: PathBuf,
    /// The profile its run containers are made with.
    pub profile: Profile,
    containers: std::sync::Mutex<Vec<String>>,
}

impl SandboxFixture {
    pub async fn new(tag: &str) -> Self {
        Self::with_profile(tag, test_profile()).await
    }

    pub async fn with_profile(tag: &str, profile: Profile) -> Self {
        let home = temp_home(tag);
        let sandbox = Sandbox::connect(None, home.join("scratch"))
            .await
            .unwrap_or_else(|e| panic!("connect to docker: {e}"));
        SandboxFixture {
            sandbox,
            home,
            profile,
            containers: std::sync::Mutex::new(Vec::new()),
        }
    }

    pub fn identity(&self, run_id: &str) -> RunIdentity {
        RunIdentity::new(run_id, &self.profile).unwrap_or_else(|e| panic!("{e}"))
    }

    pub async fn container(&self, run_id: &str) -> (RunIdentity, sandbox::ContainerInfo) {
        let identity = self.identity(run_id);
        let info = self
            .sandbox
            .ensure_container(&identity, &self.profile)
            .await
            .unwrap_or_else(|e| panic!("ensure container: {e}"));
        self.track(&info.id);
        (identity, info)
    }

    pub fn track(&self, id: &str) {
        if let Ok(mut list) = self.containers.lock() {
            list.push(id.to_owned());
        }
    }
}

impl Drop for SandboxFixture {
    fn drop(&mut self) {
        let ids = self
            .containers
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default();
        for id in ids {
            let _ = std::process::Command::new("docker")
                .args(["rm", "-f", &id])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// One process of a container's full process table.
#[derive(Debug, Clone)]
pub struct TopRow {
    pub pid: String,
    pub user: String,
    pub args: String,
}

/// A container's whole process table, every user's processes (`docker top
/// <container> -eo pid,user,args`, read by the engine from the host). A
/// failed `docker top` fails the test: it never reads as an empty table.
pub fn docker_top(container: &str) -> Vec<TopRow> {
    if runs_gvisor(container) {
        return top_inside(container);
    }
    let out = std::process::Command::new("docker")
        .args(["top", container, "-eo", "pid,user,args"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run docker top: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "docker top {container} ended with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.split_whitespace().collect::<Vec<_>>() == ["PID", "USER", "COMMAND"],
        "docker top {container}: unexpected header {header:?}"
    );
    let rows: Vec<TopRow> = lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut parts = l.split_whitespace();
            let pid = parts.next().unwrap_or_default().to_owned();
            let user = parts.next().unwrap_or_default().to_owned();
            TopRow {
                pid,
                user,
                args: parts.collect::<Vec<_>>().join(" "),
            }
        })
        .collect();
    assert!(
        !rows.is_empty(),
        "docker top {container} listed nothing: {text}"
    );
    rows
}

/// Whether the container runs under gVisor (`runsc`).
pub fn runs_gvisor(container: &str) -> bool {
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.HostConfig.Runtime}}", container])
        .output()
        .unwrap_or_else(|e| panic!("cannot run docker inspect: {e}"));
    String::from_utf8_lossy(&out.stdout).trim() == "runsc"
}

/// Under gVisor, `docker top` lists the host's processes: the table is
/// read from the container's own `/proc` by the shim (`ps --all`), as the
/// kernel's reaper does.
fn top_inside(container: &str) -> Vec<TopRow> {
    let out = std::process::Command::new("docker")
        .args(["exec", container, "/.opkernel/shim", "ps", "--all"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run docker exec: {e}"));
    assert!(
        out.status.success(),
        "shim ps --all in {container}: {}",
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows = opkernel_shim::table::parse_table(&text)
        .unwrap_or_else(|e| panic!("shim ps --all in {container}: {e}"));
    rows.into_iter()
        .map(|r| TopRow {
            pid: r.pid.to_string(),
            user: r.user,
            args: r.command,
        })
        .collect()
}

/// Whether a process is one of a run container's own: Docker's init (whose
/// argv names the shim's resident launcher) or the launcher itself.
pub fn is_container_own(row: &TopRow) -> bool {
    let launcher = |args: &str| {
        args.strip_prefix("/.opkernel/shim serve")
            .is_some_and(|poll| poll.is_empty() || poll.starts_with(" --poll-ms="))
    };
    launcher(&row.args)
        || row
            .args
            .split_once("docker-init -- ")
            .is_some_and(|(_, rest)| launcher(rest))
}

/// Waits until the container's process table holds only its init and
/// `/.opkernel/shim serve`, one of each. An op's own `shim launch` may
/// still be on its way out (it exits right after renaming `.code`): it is
/// given `grace`; any other process fails at once.
pub async fn assert_only_init_and_launcher(container: &str, grace: Duration) {
    let deadline = Instant::now() + grace;
    loop {
        let table = docker_top(container);
        let others: Vec<&TopRow> = table.iter().filter(|r| !is_container_own(r)).collect();
        let strangers: Vec<&&TopRow> = others
            .iter()
            .filter(|r| !r.args.starts_with("/.opkernel/shim launch "))
            .collect();
        assert!(
            strangers.is_empty(),
            "processes left in {container} besides its init and launcher: {table:#?}"
        );
        if others.is_empty() {
            assert_eq!(
                table.len(),
                2,
                "{container} must hold one init and one launcher: {table:#?}"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "an op's shim outlived its op in {container} by {grace:?}: {table:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A relay in front of a Docker socket that keeps the request line of every
/// request it passes on (in front of the drills' `DockerProxy`, it tells a
/// test that a request has reached the proxy, where it may be held).
pub struct RequestWatch {
    path: PathBuf,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    tasks: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl RequestWatch {
    /// Listens on `path`, relaying to `upstream` (within a tokio runtime).
    pub fn start(path: &std::path::Path, upstream: &std::path::Path) -> RequestWatch {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path)
            .unwrap_or_else(|e| panic!("bind {}: {e}", path.display()));
        let watch = RequestWatch {
            path: path.to_owned(),
            lines: Default::default(),
            tasks: Default::default(),
        };
        let (lines, tasks, upstream) = (
            watch.lines.clone(),
            watch.tasks.clone(),
            upstream.to_owned(),
        );
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (lines, upstream) = (lines.clone(), upstream.clone());
                let conn = tokio::spawn(async move {
                    let Ok(server) = tokio::net::UnixStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut client_rx, mut client_tx) = client.into_split();
                    let (mut server_rx, mut server_tx) = server.into_split();
                    let down = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
                    });
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match client_rx.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let head = String::from_utf8_lossy(&buf[..n.min(1024)]);
                        let first = head.lines().next().unwrap_or_default();
                        if first.ends_with(" HTTP/1.1") || first.ends_with(" HTTP/1.0") {
                            if let Ok(mut l) = lines.lock() {
                                l.push(first.to_owned());
                            }
                        }
                        if server_tx.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    down.abort();
                });
                if let Ok(mut t) = tasks.lock() {
                    t.retain(|h| !h.is_finished());
                    t.push(conn);
                }
            }
        });
        if let Ok(mut t) = watch.tasks.lock() {
            t.push(accept);
        }
        watch
    }

    /// How many requests passed whose request line contains all of `parts`.
    pub fn count(&self, parts: &[&str]) -> usize {
        self.lines
            .lock()
            .map(|l| {
                l.iter()
                    .filter(|line| parts.iter().all(|p| line.contains(p)))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Waits until `n` requests matching `parts` passed.
    pub async fn wait_for(&self, parts: &[&str], n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.count(parts) < n {
            assert!(
                Instant::now() < deadline,
                "{} of {n} requests with {parts:?} passed within {timeout:?}",
                self.count(parts)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for RequestWatch {
    fn drop(&mut self) {
        if let Ok(mut t) = self.tasks.lock() {
            for h in t.drain(..) {
                h.abort();
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The control plane's tables of a kernel on PostgreSQL (its own
/// database's, in the current schema).
pub fn pg_tables(k: &opkernel::drills::harness::KernelProcess) -> Vec<String> {
    k.offline_rows(
        "SELECT CAST(table_name AS TEXT) AS name FROM information_schema.tables \
         WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY 1",
        &[],
    )
    .unwrap_or_else(|e| panic!("the control plane's tables: {e:#}"))
    .iter()
    .map(|r| r.get::<String>("name").unwrap_or_else(|e| panic!("{e}")))
    .collect()
}

/// How many rows of the control plane's tables (on PostgreSQL) hold
/// `needle` anywhere in their text: each row read whole as JSON.
pub fn pg_rows_holding(k: &opkernel::drills::harness::KernelProcess, needle: &str) -> i64 {
    assert!(
        needle
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-'),
        "a plain needle"
    );
    pg_tables(k)
        .iter()
        .map(|t| {
            let sql = format!(
                "SELECT COUNT(*) FROM \"{t}\" x WHERE CAST(row_to_json(x) AS TEXT) LIKE '%{needle}%'"
            );
            k.sql_offline_query(&sql)
                .unwrap_or_else(|e| panic!("{sql}: {e:#}"))
        })
        .sum()
}

/// The rows of every control-plane table (on PostgreSQL), summed: every
/// table read through (a corrupt one fails the read).
pub fn pg_rows(k: &opkernel::drills::harness::KernelProcess) -> i64 {
    pg_tables(k)
        .iter()
        .map(|t| {
            k.sql_offline_query(&format!("SELECT COUNT(*) FROM \"{t}\""))
                .unwrap_or_else(|e| panic!("{t}: {e:#}"))
        })
        .sum()
}

/// What the tests and the bench ask of a kernel process beyond what the
/// drills need (kept out of the kernel's library).
pub trait KernelProcessExt {
    /// Whether its control plane is on PostgreSQL (`OPKERNEL_STORE` set):
    /// the home then holds no `kernel.db`.
    fn on_postgres(&self) -> bool;
    /// How many ops the control plane records as running with their
    /// process identity, read by a connection of its own: costs the kernel
    /// nothing, so a benchmark can poll it.
    fn running_with_pid(&self) -> anyhow::Result<usize>;
}

impl KernelProcessExt for opkernel::drills::harness::KernelProcess {
    fn on_postgres(&self) -> bool {
        self.postgres_url().is_some()
    }

    fn running_with_pid(&self) -> anyhow::Result<usize> {
        Ok(self.sql_offline_query(
            "SELECT COUNT(*) FROM ops WHERE status = 'running' AND pid IS NOT NULL",
        )? as usize)
    }
}
