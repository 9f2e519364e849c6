//! Shared helpers of the end-to-end tests: a sandbox on a throwaway home,
//! unique run ids, and polling with a deadline instead of fixed sleeps.

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

pub fn test_profile() -> Profile {
    Profile {
        image: image(),
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

    pub fn profile(self) -> Profile {
        Profile {
            image: self.name(),
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

/// Whether a process is one of a run container's own: Docker's init (whose
/// argv names the shim's resident launcher) or the launcher itself.
pub fn is_container_own(row: &TopRow) -> bool {
    row.args == "/.opkernel/shim serve"
        || row.args.ends_with("docker-init -- /.opkernel/shim serve")
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

/// The `docker exec` runs that ended in one container, counted from Docker's
/// event stream (`docker events`, `exec_die`): a test tells from them how
/// far the kernel got in a sequence of Docker calls (the reaper's probes
/// are execs).
pub struct ExecWatch {
    child: std::process::Child,
    ended: std::sync::mpsc::Receiver<()>,
    container: String,
}

impl ExecWatch {
    /// Subscribes, then proves the subscription live with an exec of its own
    /// (not counted).
    pub async fn start(container: &str) -> ExecWatch {
        use std::io::BufRead;
        let mut child = std::process::Command::new("docker")
            .args(["events", "--format", "{{.Action}}", "--filter"])
            .arg(format!("container={container}"))
            .args(["--filter", "event=exec_die"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run docker events: {e}"));
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
        let (tx, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                match line {
                    Ok(l) if l.starts_with("exec_die") => {
                        if tx.send(()).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        });
        let watch = ExecWatch {
            child,
            ended,
            container: container.to_owned(),
        };
        // the stream is live once an exec of ours shows in it
        let deadline = Instant::now() + Duration::from_secs(30);
        'live: loop {
            let ran = std::process::Command::new("docker")
                .args(["exec", container, "/.opkernel/shim", "--version"])
                .output();
            assert!(ran.is_ok(), "docker exec in {container}");
            let until = Instant::now() + Duration::from_millis(500);
            while Instant::now() < until {
                if watch.ended.try_recv().is_ok() {
                    break 'live;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(
                Instant::now() < deadline,
                "docker events never showed an exec in {container}"
            );
        }
        // an exec of ours may have been seen twice (a late first one)
        tokio::time::sleep(Duration::from_millis(200)).await;
        while watch.ended.try_recv().is_ok() {}
        watch
    }

    /// Waits until `n` more execs ended in the container.
    pub async fn wait_ended(&mut self, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut seen = 0;
        while seen < n {
            if self.ended.try_recv().is_ok() {
                seen += 1;
                continue;
            }
            assert!(
                Instant::now() < deadline,
                "{seen} of {n} execs ended in {} within {timeout:?}",
                self.container
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// How many execs ended since the last look (without waiting).
    pub fn ended_since(&mut self) -> usize {
        std::iter::from_fn(|| self.ended.try_recv().ok()).count()
    }
}

impl Drop for ExecWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
