//! Warm-pool containers on the Docker side (SPEC §22): made ahead of any
//! run, each with its own scratch dir (`<root>/pool-<hex>/`) and resident
//! launcher. A run adopts one through a binding file: its scratch path
//! `<root>/<run key>` becomes a root-owned symlink to the pool container's
//! dir, so every op file of the run is found by the run's own key.

use std::path::Path;

use bollard::query_parameters::CreateContainerOptionsBuilder;

use crate::docker::{unix_now, ContainerInfo, Sandbox};
use crate::error::{Result, SandboxError};
use crate::profile::{container_config, is_pool_key, PoolIdentity, Profile};

impl Sandbox {
    /// The id of `image` as the engine has it now (a rebuilt image has a
    /// new one).
    pub async fn image_id(&self, image: &str) -> Result<String> {
        let info = self.docker.inspect_image(image).await?;
        info.id
            .ok_or_else(|| SandboxError::NotFound(format!("image {image} has no id")))
    }

    /// The OCI runtimes the engine has registered (`runc`, and `runsc`
    /// where gVisor is: SPEC §30).
    pub async fn runtimes(&self) -> Result<Vec<String>> {
        let info = self.docker.info().await?;
        let mut names: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
        names.sort();
        Ok(names)
    }

    /// Creates and starts a pool container of `identity` for `profile`,
    /// its scratch dir prepared and handed to the run user. A container
    /// that cannot be started is removed with its dir: a half-made pool
    /// container is never left for adoption.
    pub async fn create_pool_container(
        &self,
        identity: &PoolIdentity,
        profile: &Profile,
    ) -> Result<ContainerInfo> {
        let scratch = self.prepare_scratch(&identity.scratch_key)?;
        let config = container_config(identity.labels(unix_now()), profile, &scratch, &self.shim);
        let options = CreateContainerOptionsBuilder::default()
            .name(&identity.name)
            .build();
        let made = match self.docker.create_container(Some(options), config).await {
            Ok(created) => created,
            Err(e) => {
                let _ = self.remove_scratch(&identity.scratch_key);
                return Err(e.into());
            }
        };
        let started = match self
            .start_as_run(&made.id, &identity.scratch_key, profile)
            .await
        {
            Ok(()) => self.inspect(&made.id).await,
            Err(e) => Err(e),
        };
        if started.is_err() {
            let _ = self.remove(&made.id).await;
            let _ = self.remove_scratch(&identity.scratch_key);
        }
        started
    }

    /// Writes the binding file of a run to a pool container: the run's
    /// scratch path becomes a symlink to the pool container's dir (one
    /// atomic `symlink`, then the scratch root synced). Already bound to
    /// that dir: done. Anything else at the run's path: a conflict, never
    /// overwritten.
    pub fn bind_scratch(&self, run_key: &str, pool_key: &str) -> Result<()> {
        if !is_pool_key(pool_key) {
            return Err(SandboxError::Invalid(format!(
                "{pool_key:?} is not a pool key"
            )));
        }
        let link = self.scratch_dir(run_key);
        match std::os::unix::fs::symlink(pool_key, &link) {
            Ok(()) => sync_dir(link.parent().unwrap_or(Path::new("/"))),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                match self.scratch_binding(run_key)? {
                    Some(bound) if bound == pool_key => Ok(()),
                    other => Err(SandboxError::Conflict(format!(
                        "the scratch of {run_key} exists and is not bound to {pool_key} ({other:?})"
                    ))),
                }
            }
            Err(e) => Err(SandboxError::io(link, e)),
        }
    }

    /// The pool key a run's scratch path is bound to, read from its binding
    /// file; `None` when the path is a plain dir or missing.
    pub fn scratch_binding(&self, run_key: &str) -> Result<Option<String>> {
        let link = self.scratch_dir(run_key);
        match std::fs::read_link(&link) {
            Ok(target) => {
                let target = target.to_string_lossy().into_owned();
                if is_pool_key(&target) {
                    Ok(Some(target))
                } else {
                    Err(SandboxError::Invalid(format!(
                        "{} links to {target:?}, not a pool dir",
                        link.display()
                    )))
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            // a plain dir (EINVAL): not a binding
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(None),
            Err(e) => Err(SandboxError::io(link, e)),
        }
    }

    /// Whether a run's scratch path exists (a dir or a binding): a run
    /// with one has had a container, and keeps its `/scratch`.
    pub fn scratch_exists(&self, scratch_key: &str) -> bool {
        std::fs::symlink_metadata(self.scratch_dir(scratch_key)).is_ok()
    }

    /// Every binding file under the scratch root: (run key, pool key).
    pub fn scratch_bindings(&self) -> Vec<(String, String)> {
        let Ok(entries) = std::fs::read_dir(self.scratch_root()) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter_map(|key| Some((key.clone(), self.scratch_binding(&key).ok()??)))
            .collect()
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| SandboxError::io(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_binding_file_is_written_once_and_read_back() {
        let root = std::env::temp_dir().join(format!("pool-bind-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("scratch")).unwrap();
        let sb = Sandbox::connect(None, root.join("scratch")).await.unwrap();
        sb.prepare_scratch("pool-abc").unwrap();
        assert_eq!(sb.scratch_binding("run1").unwrap(), None);
        assert!(!sb.scratch_exists("run1"));
        sb.bind_scratch("run1", "pool-abc").unwrap();
        sb.bind_scratch("run1", "pool-abc").unwrap();
        assert!(sb.bind_scratch("run1", "pool-def").is_err());
        assert!(sb.bind_scratch("run2", "../etc").is_err());
        assert_eq!(
            sb.scratch_binding("run1").unwrap().as_deref(),
            Some("pool-abc")
        );
        assert!(sb.ops_dir("run1").path().join("inbox").is_dir());
        assert_eq!(
            sb.scratch_bindings(),
            vec![("run1".into(), "pool-abc".into())]
        );
        sb.prepare_scratch("plain").unwrap();
        assert_eq!(sb.scratch_binding("plain").unwrap(), None);
        assert!(sb.bind_scratch("plain", "pool-abc").is_err());
        sb.remove_scratch("run1").unwrap();
        assert!(!sb.scratch_exists("run1"));
        assert!(!sb.scratch_exists("pool-abc"));
        let _ = std::fs::remove_dir_all(&root);
    }
}
