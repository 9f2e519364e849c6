//! The cluster harness from the tests' side: `scripts/cluster.sh up N`
//! (Docker-in-Docker nodes sharing one PostgreSQL container), a client per
//! node, and the faults the drills inject with the host's own `docker`
//! (kill, pause, network cut, store stop) on the harness's containers only.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use opkernel::surfaces::cli::client::Client;
use serde_json::{json, Value};

/// Each node's kernel home inside its container.
const NODE_HOME: &str = "/var/lib/opkernel";

/// One node of the harness.
pub struct Node {
    pub name: String,
    pub container: String,
    pub client: Client,
}

/// A running harness cluster; `down` (or drop) removes it.
pub struct Cluster {
    pub store: String,
    pub token: String,
    pub network: String,
    pub nodes: Vec<Node>,
    /// The replicated store's data nodes at `up` (`--store ha`), with
    /// their roles then; empty for a single store.
    pub store_nodes: Vec<(String, String)>,
    script: PathBuf,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/cluster.sh")
}

/// Runs `docker` with `args`; its stdout, or an error with its stderr.
pub fn docker(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("docker").args(args).output()?;
    if !out.status.success() {
        bail!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Cluster {
    /// `scripts/cluster.sh up n` with `env` (e.g. a short lease), parsed
    /// from its last line.
    pub fn up(n: usize, env: &[(&str, &str)]) -> anyhow::Result<Cluster> {
        Cluster::up_with(n, env, &[])
    }

    /// `up n` on a replicated store (`--store ha`, SPEC §31).
    pub fn up_replicated(n: usize, env: &[(&str, &str)]) -> anyhow::Result<Cluster> {
        Cluster::up_with(n, env, &["--store", "ha"])
    }

    fn up_with(n: usize, env: &[(&str, &str)], extra: &[&str]) -> anyhow::Result<Cluster> {
        let out = Command::new(script())
            .args(["up", &n.to_string()])
            .args(extra)
            .envs(env.iter().copied())
            .stderr(std::process::Stdio::inherit())
            .output()
            .context("run scripts/cluster.sh")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("scripts/cluster.sh up {n} failed: {stdout}");
        }
        let last = stdout.lines().last().unwrap_or_default();
        let v: Value = serde_json::from_str(last).with_context(|| format!("last line: {last}"))?;
        let token = v["operator_token"].as_str().unwrap_or_default().to_owned();
        // the nodes serve TLS with the harness's CA (SPEC §29)
        let ca = v["ca"].as_str().context("no ca in the harness's line")?;
        opkernel::base::tls::trust(std::path::Path::new(ca))?;
        let nodes = v["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| Node {
                name: n["name"].as_str().unwrap_or_default().to_owned(),
                container: n["container"].as_str().unwrap_or_default().to_owned(),
                client: Client::new(
                    n["url"].as_str().unwrap_or_default().to_owned(),
                    token.clone(),
                ),
            })
            .collect();
        Ok(Cluster {
            store: v["store"].as_str().unwrap_or_default().to_owned(),
            token,
            network: v["network"].as_str().unwrap_or_default().to_owned(),
            nodes,
            store_nodes: roles(&v["store_nodes"]),
            script: script(),
        })
    }

    /// The replicated store's data nodes now, with their roles as its
    /// monitor has them (`primary`, `secondary`, or a state between).
    pub fn store_roles(&self) -> anyhow::Result<Vec<(String, String)>> {
        let out = Command::new(&self.script).arg("store-nodes").output()?;
        if !out.status.success() {
            bail!(
                "scripts/cluster.sh store-nodes: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let v: Value = serde_json::from_slice(&out.stdout)?;
        Ok(roles(&v))
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// The PostgreSQL container's name.
    pub fn store_container(&self) -> String {
        format!("{}-pg", self.network)
    }

    /// `GET /v1/nodes` through `via`.
    pub async fn members(&self, via: &str) -> anyhow::Result<Vec<Value>> {
        let list = timed(self.node(via).client.get("/v1/nodes")).await?;
        Ok(list["nodes"].as_array().cloned().unwrap_or_default())
    }

    /// Waits until `via` lists `node` in `state`; the member row.
    pub async fn wait_member(
        &self,
        via: &str,
        node: &str,
        pred: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> anyhow::Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.members(via).await {
                Ok(list) => {
                    let row = list.into_iter().find(|m| m["name"] == node);
                    match row {
                        Some(row) if pred(&row) => return Ok(row),
                        other => format!("{other:?}"),
                    }
                }
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!("node {node} (seen through {via}) not as expected after {timeout:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A shell command run as root on the node `name` itself (not in a run
    /// container); its stdout.
    pub fn on_node(&self, name: &str, script: &str) -> anyhow::Result<String> {
        docker(&["exec", &self.node(name).container, "sh", "-c", script])
    }

    /// Creates the file `go` in the scratch dir of each of `runs` on node
    /// `name` (a gated op ends when it appears).
    pub fn release(&self, name: &str, runs: &[&str]) -> anyhow::Result<()> {
        let mut script = String::new();
        for run in runs {
            let key = sandbox::profile::scratch_key(run);
            script.push_str(&format!(
                "[ -d {NODE_HOME}/scratch/{key}/ ] && touch {NODE_HOME}/scratch/{key}/go; "
            ));
        }
        script.push_str("true");
        self.on_node(name, &script).map(|_| ())
    }

    /// The lines of `run`'s side-effect file `ran` on every node (each
    /// gated op appends its tag first). Read with `docker cp`, so a stopped
    /// node counts too.
    pub fn ran_lines(&self, run: &str) -> anyhow::Result<Vec<String>> {
        let key = sandbox::profile::scratch_key(run);
        let mut lines = Vec::new();
        for node in &self.nodes {
            let dir = std::env::temp_dir().join(format!("opkernel-ran-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&dir)?;
            let source = format!("{}:{NODE_HOME}/scratch/{key}/ran", node.container);
            let copied = Command::new("docker")
                .args(["cp", "-L", &source])
                .arg(dir.join("ran"))
                .output()?;
            if copied.status.success() {
                let text = std::fs::read_to_string(dir.join("ran")).unwrap_or_default();
                lines.extend(text.lines().map(str::to_owned));
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(lines)
    }

    /// Stops and starts the kernel of `name` (SIGTERM: a graceful stop;
    /// the node's entry starts it again) and waits until it answers.
    pub async fn restart_kernel(&self, name: &str) -> anyhow::Result<()> {
        let before = self.on_node(name, "pgrep -x opkernel || true")?;
        self.on_node(name, "pkill -TERM -x opkernel || true")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        // the old process answers until it has stopped: wait for a new pid
        while self.on_node(name, "pgrep -x opkernel || true")? == before {
            if Instant::now() > deadline {
                bail!("the kernel of {name} did not stop");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.wait_answers(name).await
    }

    /// Waits until the kernel of `name` answers its health check.
    pub async fn wait_answers(&self, name: &str) -> anyhow::Result<()> {
        let node = self.node(name);
        let deadline = Instant::now() + Duration::from_secs(120);
        while timed(node.client.get("/v1/health")).await.is_err() {
            if Instant::now() > deadline {
                bail!("the kernel of {name} does not answer");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// `scripts/cluster.sh down`.
    pub fn down(&self) {
        let _ = Command::new(&self.script).arg("down").output();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::env::var_os("OPKERNEL_KEEP_CLUSTER").is_none() {
            self.down();
        }
    }
}

/// `[{"container", "role"}]` as pairs.
fn roles(v: &Value) -> Vec<(String, String)> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    v.as_array()
        .into_iter()
        .flatten()
        .map(|n| (text(&n["container"]), text(&n["role"])))
        .collect()
}

/// `fut` with a 10 s limit (a paused or cut-off node never answers).
pub async fn timed<T>(
    fut: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .unwrap_or_else(|_| bail!("no answer in 10 s"))
}

/// The command of a gated op: appends `tag` to the run's `ran` file (its
/// side effect, read by `Cluster::ran_lines`), then waits for `go` and
/// exits 7.
pub fn gated(tag: &str) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "echo {tag} >> /scratch/ran; while [ ! -e /scratch/go ]; do sleep 0.2; done; exit 7"
        ),
    ]
}

/// Starts a background op through `client`; its id.
pub async fn start(client: &Client, run: &str, command: &[String]) -> anyhow::Result<String> {
    let body = json!({"command": command, "background": true, "timeout_sec": 600});
    let answer = timed(client.post(&format!("/v1/runs/{run}/tools/run_command"), &body)).await?;
    Ok(answer["operation_id"]
        .as_str()
        .context("no operation_id")?
        .to_owned())
}
