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
