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
    containers: std::sync::Mutex<Vec<String>>,
}

impl SandboxFixture {
    pub async fn new(tag: &str) -> Self {
        let home = temp_home(tag);
        let sandbox = Sandbox::connect(None, home.join("scratch"))
            .await
            .unwrap_or_else(|e| panic!("connect to docker: {e}"));
        SandboxFixture {
            sandbox,
            home,
            containers: std::sync::Mutex::new(Vec::new()),
        }
    }

    pub async fn container(&self, run_id: &str) -> (RunIdentity, sandbox::ContainerInfo) {
        let identity = RunIdentity::new(run_id, &test_profile()).unwrap_or_else(|e| panic!("{e}"));
        let info = self
            .sandbox
            .ensure_container(&identity, &test_profile())
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
