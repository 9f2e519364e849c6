//! Real kernel processes for drills and end-to-end tests: start
//! `opkernel serve` on a throwaway home, SIGKILL it, restart it.

use crate::store::db::{Row, Value as Cell};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::surfaces::cli::client::Client;

/// An op's durable kill flags (`ops.kill_intent`, `ops.kill_signalled`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KillFlags {
    /// A kill or timeout signal was about to be sent.
    pub intent: bool,
    /// A kill or timeout signal reached the op's processes.
    pub signalled: bool,
}

/// One `opkernel serve` child process and its home.
pub struct KernelProcess {
    bin: PathBuf,
    /// The kernel's throwaway home (its `kernel.db`, operator token and
    /// `kernel.log`).
    pub home: PathBuf,
    env: Vec<(String, String)>,
    child: Option<Child>,
    /// An operator client for the current process (re-made on every start).
    pub client: Client,
    /// How many times it was started.
    pub starts: u32,
    /// The last start's time from spawn to answering health.
    pub last_start: Duration,
}

/// With `OPKERNEL_TEST_STORE=postgres` (and the server's URL in
/// `OPKERNEL_TEST_PG`), a fresh PostgreSQL database for a kernel whose
/// settings name no store of their own: the suite runs on either store.
async fn test_postgres(env: &[(String, String)]) -> anyhow::Result<Option<String>> {
    if std::env::var("OPKERNEL_TEST_STORE").as_deref() != Ok("postgres")
        || env.iter().any(|(k, _)| k == "OPKERNEL_STORE")
    {
        return Ok(None);
    }
    let server = std::env::var("OPKERNEL_TEST_PG")
        .map_err(|_| anyhow::anyhow!("OPKERNEL_TEST_STORE=postgres needs OPKERNEL_TEST_PG"))?;
    #[cfg(feature = "postgres")]
    return Ok(Some(
        crate::store::db::pgpool::create_test_database(&server).await?,
    ));
    #[cfg(not(feature = "postgres"))]
    anyhow::bail!("OPKERNEL_TEST_STORE=postgres ({server}): this build has no `postgres` feature")
}

impl KernelProcess {
    /// Starts a kernel on a fresh home under the temp dir, with drill fault
    /// hooks on and fast safety-net timings; `env` adds or overrides settings.
    pub async fn start(
        bin: &Path,
        tag: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<KernelProcess> {
        let home = std::env::temp_dir().join(format!(
            "opkernel-{tag}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..10]
        ));
        std::fs::create_dir_all(&home)?;
        let mut all: Vec<(String, String)> = vec![
            ("OPKERNEL_PROBE_INTERVAL".into(), "500ms".into()),
            ("OPKERNEL_KILL_GRACE".into(), "1500ms".into()),
            ("OPKERNEL_START_EVIDENCE".into(), "3000ms".into()),
            ("OPKERNEL_HEARTBEAT".into(), "1000ms".into()),
            ("OPKERNEL_REAP_INTERVAL".into(), "3600s".into()),
            // no warm pool unless a test or drill of the pool asks for one:
            // every other test counts and judges its own containers
            ("OPKERNEL_POOL".into(), "0".into()),
        ];
        for (k, v) in env {
            all.retain(|(key, _)| key != k);
            all.push(((*k).to_owned(), (*v).to_owned()));
        }
        if let Some(url) = test_postgres(&all).await? {
            all.push(("OPKERNEL_STORE".into(), url));
        }
        let mut kernel = KernelProcess {
            bin: bin.to_owned(),
            home,
            env: all,
            child: None,
            client: Client::new(String::new(), String::new()),
            starts: 0,
            last_start: Duration::ZERO,
        };
        kernel.spawn().await?;
        Ok(kernel)
    }

    fn log_path(&self) -> PathBuf {
        self.home.join("kernel.log")
    }

    /// Spawns the process and waits until it answers.
    pub async fn spawn(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("kernel already running");
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let seen = log.metadata()?.len();
        let began = Instant::now();
        let mut cmd = Command::new(&self.bin);
        // a cluster node's test gives a fixed address (its advertised URL)
        let listen = self
            .env
            .iter()
            .find(|(k, _)| k == "OPKERNEL_TEST_LISTEN")
            .map_or("127.0.0.1:0".to_owned(), |(_, v)| v.clone());
        cmd.args(["serve", "--drills", "--listen", &listen, "--home"])
            .arg(&self.home)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", self.bin.display()))?;
        self.child = Some(child);
        self.starts += 1;
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = loop {
            let text = std::fs::read(self.log_path()).unwrap_or_default();
            let fresh =
                String::from_utf8_lossy(&text[(seen as usize).min(text.len())..]).into_owned();
            // only a whole line: the log may be read mid-write
            if let Some((line, _)) = fresh
                .split("opkernel listening on ")
                .nth(1)
                .and_then(|rest| rest.split_once('\n'))
            {
                break line
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                bail!(
                    "kernel exited with {status} before serving: {}",
                    fresh.trim()
                );
            }
            if Instant::now() > deadline {
                bail!("kernel did not start within 30s: {}", fresh.trim());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let token = std::fs::read_to_string(self.home.join("operator.token"))?
            .trim()
            .to_owned();
        self.client = Client::new(url, token);
        self.last_start = began.elapsed();
        Ok(())
    }

    /// SIGKILLs the kernel process (no cleanup of any kind runs).
    pub fn sigkill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sets (or, with `None`, removes) a setting for the next start.
    pub fn set_env(&mut self, name: &str, value: Option<&str>) {
        self.env.retain(|(key, _)| key != name);
        if let Some(v) = value {
            self.env.push((name.to_owned(), v.to_owned()));
        }
    }

    /// Waits until the kernel process ends on its own (a drill's crash
    /// point); an error when it still runs after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let ended = match self.child.as_mut() {
                None => true,
                Some(child) => child.try_wait()?.is_some(),
            };
            if ended {
                self.child = None;
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the kernel still runs after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILLs the kernel and starts it again on the same home.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.sigkill();
        self.spawn().await
    }

    /// The rows of a query read straight from the control plane by a
    /// connection of its own (safe while the kernel runs or is down): the
    /// home's SQLite file read-only, or the kernel's PostgreSQL database.
    pub fn offline_rows(&self, sql: &str, params: &[Cell]) -> anyhow::Result<Vec<Row>> {
        let (sql, params) = (sql.to_owned(), params.to_vec());
        self.offline(true, move |tx| tx.query(&sql, &params))
    }

    /// Runs `f` in one transaction on the control plane, by a connection
    /// of its own: the home's SQLite file (read-only when `read_only`), or
    /// the kernel's PostgreSQL database from a thread with a runtime of its
    /// own (so it is callable anywhere, in or out of a runtime).
    fn offline<T, F>(&self, read_only: bool, f: F) -> anyhow::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn crate::store::db::Tx) -> crate::store::StoreResult<T> + Send + 'static,
    {
        #[cfg(feature = "postgres")]
        if let Some(url) = self.postgres_url() {
            let worker = std::thread::spawn(move || -> anyhow::Result<T> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let pool = crate::store::db::pgpool::pool(&url, 1)?;
                    Ok(crate::store::db::pgpool::run(&pool, read_only, f).await?)
                })
            });
            return worker
                .join()
                .map_err(|_| anyhow::anyhow!("the control plane's reader panicked"))?;
        }
        #[cfg(not(feature = "postgres"))]
        if let Some(url) = self.postgres_url() {
            anyhow::bail!("{url}: this build has no `postgres` feature");
        }
        let path = self.home.join("kernel.db");
        let conn = if read_only {
            rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?
        } else {
            rusqlite::Connection::open(path)?
        };
        Ok(f(&mut crate::store::db::sqlite::SqliteTx::new(
            &conn, None,
        ))?)
    }

    /// An op's status and exit code read straight from the control plane
    /// (for when the kernel is down).
    pub fn state_offline(&self, op: &str) -> anyhow::Result<(String, Option<i64>)> {
        let rows = self.offline_rows(
            "SELECT status, exit_code FROM ops WHERE id = ?1",
            &[op.into()],
        )?;
        let row = rows.first().ok_or_else(|| anyhow::anyhow!("no op {op}"))?;
        Ok((row.get("status")?, row.get("exit_code")?))
    }

    /// An op's durable kill flags, read straight from the control plane by
    /// a connection of its own (safe while the kernel runs or is down).
    pub fn kill_flags_offline(&self, op: &str) -> anyhow::Result<KillFlags> {
        let rows = self.offline_rows(
            "SELECT kill_intent, kill_signalled FROM ops WHERE id = ?1",
            &[op.into()],
        )?;
        let row = rows.first().ok_or_else(|| anyhow::anyhow!("no op {op}"))?;
        Ok(KillFlags {
            intent: row.get("kill_intent")?,
            signalled: row.get("kill_signalled")?,
        })
    }

    /// Waits until the control plane records that a kill or timeout signal
    /// reached the op's processes.
    pub async fn wait_signalled(&self, op: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let flags = self.kill_flags_offline(op)?;
            if flags.signalled {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("no signal of {op} recorded as landed within {timeout:?}: {flags:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// One number from the control plane (the first column of the first
    /// row), read by a connection of its own (safe while the kernel runs).
    pub fn sql_offline_query(&self, sql: &str) -> anyhow::Result<i64> {
        let rows = self.offline_rows(sql, &[])?;
        let row = rows
            .first()
            .ok_or_else(|| anyhow::anyhow!("no row for {sql}"))?;
        Ok(row.at(0)?)
    }

    /// Runs one statement against the control plane while the kernel is
    /// down (drills that plant a state on purpose), on either store; how
    /// many rows it changed.
    pub fn sql_offline(&self, sql: &str, params: &[Cell]) -> anyhow::Result<u64> {
        let (sql, params) = (sql.to_owned(), params.to_vec());
        self.offline(false, move |tx| tx.execute(&sql, &params))
    }

    /// The kernel's control plane opened by the drill itself (while the
    /// kernel is down): the home's SQLite file, or its PostgreSQL database.
    pub async fn offline_store(&self) -> anyhow::Result<crate::store::Store> {
        #[cfg(feature = "postgres")]
        if let Some(url) = self.postgres_url() {
            return Ok(crate::store::Store::connect(&url, Default::default()).await?);
        }
        #[cfg(not(feature = "postgres"))]
        if let Some(url) = self.postgres_url() {
            anyhow::bail!("{url}: this build has no `postgres` feature");
        }
        let db = self.home.join("kernel.db");
        Ok(crate::store::Store::open(&db, Default::default())?)
    }

    /// The kernel's PostgreSQL URL (`OPKERNEL_STORE`); `None` on SQLite.
    pub fn postgres_url(&self) -> Option<String> {
        self.env
            .iter()
            .find(|(name, _)| name == "OPKERNEL_STORE")
            .map(|(_, url)| url.clone())
    }

    /// The current process's pid; `None` while it is down.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What the kernel logged to `<home>/kernel.log` so far (empty if
    /// unreadable).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Starts a background op; returns its id.
    pub async fn start_bg(
        &self,
        run: &str,
        command: &[&str],
        timeout: u64,
    ) -> anyhow::Result<String> {
        let (status, body) = self
            .client
            .request(
                reqwest::Method::POST,
                &format!("/v1/runs/{run}/tools/run_command"),
                Some(&json!({"command": command, "background": true, "timeout_sec": timeout})),
                &[],
            )
            .await?;
        if status != 200 {
            bail!("start failed with {status}: {body}");
        }
        Ok(body["operation_id"].as_str().unwrap_or_default().to_owned())
    }

    /// Sends `kill_operation` for `op` without waiting for its answer (the
    /// call waits for the kill to finish) and returns once the kill request
    /// is recorded. The task's result is the kill call's answer.
    pub async fn kill_in_background(
        &self,
        run: &str,
        op: &str,
    ) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<Value>>> {
        let client = self.client.clone();
        let path = format!("/v1/runs/{run}/tools/kill_operation");
        let body = json!({ "operation_id": op });
        let kill = tokio::spawn(async move { client.post(&path, &body).await });
        self.wait_state(op, Duration::from_secs(10), |s| s["kill_requested"] == true)
            .await?;
        Ok(kill)
    }

    /// The op's state as `GET /v1/operations/{id}` returns it.
    pub async fn state(&self, op: &str) -> anyhow::Result<Value> {
        self.client.get(&format!("/v1/operations/{op}")).await
    }

    /// Polls the op until `pred` holds.
    pub async fn wait_state(
        &self,
        op: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let state = self.state(op).await?;
            if pred(&state) {
                return Ok(state);
            }
            if Instant::now() > deadline {
                bail!("op {op} did not reach the expected state in {timeout:?}; last: {state}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the op is terminal (any terminal status, `denied` included).
    pub async fn wait_terminal(&self, op: &str, timeout: Duration) -> anyhow::Result<Value> {
        self.wait_state(op, timeout, |s| {
            matches!(
                s["status"].as_str(),
                Some("completed" | "timed_out" | "lost" | "failed" | "denied")
            )
        })
        .await
    }

    /// The run container's id, from the op's state.
    pub async fn container_of(&self, op: &str) -> anyhow::Result<String> {
        let s = self
            .wait_state(op, Duration::from_secs(30), |s| {
                s["container_id"].is_string() && s["pid"].is_number()
            })
            .await?;
        Ok(s["container_id"].as_str().unwrap_or_default().to_owned())
    }

    /// Drains reports (acking each) until `want` op ids were delivered or
    /// the time is up; returns every delivered op id in delivery order.
    pub async fn collect_deliveries(
        &self,
        run: &str,
        want: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<String>> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        while seen.len() < want && Instant::now() < deadline {
            let report = self
                .client
                .get(&format!("/v1/runs/{run}/report?wait=2"))
                .await?;
            for item in report["resolved"].as_array().into_iter().flatten() {
                seen.push(item["operation_id"].as_str().unwrap_or_default().to_owned());
            }
            if let Some(id) = report["report_id"].as_str() {
                self.client
                    .post(&format!("/v1/runs/{run}/report/{id}/ack"), &json!({}))
                    .await?;
            }
        }
        Ok(seen)
    }

    /// Removes every container of this kernel's runs.
    pub fn remove_containers(&self) {
        let Ok(out) = Command::new("docker")
            .args(["ps", "-aq", "--filter", "label=opkernel.managed=true"])
            .output()
        else {
            return;
        };
        let scratch = self.home.join("scratch");
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let inspect = Command::new("docker")
                .args(["inspect", "-f", "{{range .Mounts}}{{.Source}} {{end}}", id])
                .output();
            if let Ok(m) = inspect {
                if String::from_utf8_lossy(&m.stdout).contains(&scratch.display().to_string()) {
                    let _ = Command::new("docker").args(["rm", "-f", id]).output();
                }
            }
        }
    }
}

impl KernelProcess {
    /// Removes this kernel's egress network (once its containers are
    /// gone) and the firewall rules of its bridge.
    pub fn remove_egress(&self) {
        let name = crate::runtime::egress::network_name(&self.home);
        let removed = Command::new("docker")
            .args(["network", "rm", &name])
            .output();
        if !removed.is_ok_and(|o| o.status.success()) {
            return;
        }
        let bridge = sandbox::egress::bridge_of(&name);
        let rules = Command::new("iptables").args(["-S", "INPUT"]).output();
        let rules = rules
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for rule in rules
            .lines()
            .filter(|r| r.contains(&format!("-i {bridge} ")))
        {
            let args: Vec<&str> = rule.split_whitespace().skip(1).collect();
            let _ = Command::new("iptables").arg("-D").args(&args).output();
        }
    }
}

impl Drop for KernelProcess {
    fn drop(&mut self) {
        self.sigkill();
        self.remove_containers();
        self.remove_egress();
        if std::env::var_os("OPKERNEL_KEEP_HOMES").is_none() {
            let _ = std::fs::remove_dir_all(&self.home);
        }
    }
}

/// `docker exec` as root in a container; returns stdout. An exec that
/// cannot run or whose script exits non-zero is an error (with its status
/// and stderr), never an empty answer.
pub fn docker_exec(container: &str, script: &str) -> anyhow::Result<String> {
    let out = Command::new("docker")
        .args(["exec", container, "sh", "-c", script])
        .output()
        .context("cannot run docker exec")?;
    if !out.status.success() {
        bail!(
            "docker exec in {container} of {script:?} ended with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `docker exec` of a script that ends the container's main process: under
/// gVisor the engine never finishes such an exec (the container stops,
/// the client waits on), so the client is given `limit` and then let go;
/// what the script did is judged by its effects.
pub fn docker_exec_ending(container: &str, script: &str, limit: Duration) -> anyhow::Result<()> {
    let mut child = Command::new("docker")
        .args(["exec", container, "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot run docker exec")?;
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(())
}

/// The `opkernel` binary next to the running executable (for `opkernel
/// drill`), or `OPKERNEL_BIN`, or the workspace's `target/debug/opkernel`.
pub fn kernel_binary() -> anyhow::Result<PathBuf> {
    if let Ok(bin) = std::env::var("OPKERNEL_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe()?;
    if exe.file_name().is_some_and(|n| n == "opkernel") {
        return Ok(exe);
    }
    // test binaries live in target/<profile>/deps/
    let mut dir = exe.parent().map(Path::to_path_buf);
    while let Some(d) = dir {
        let candidate = d.join("opkernel");
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = d.parent().map(Path::to_path_buf);
    }
    bail!("cannot find the opkernel binary: build it (cargo build -p opkernel) or set OPKERNEL_BIN")
}
