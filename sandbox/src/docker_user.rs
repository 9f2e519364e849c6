//! The run user of a profile's commands: `uid:gid` as given, a user name
//! read from the image's `/etc/passwd` without running anything in it, or
//! root only for the explicit `root` (SPEC §12). A child of `docker.rs`.

use futures::StreamExt;

use super::*;

/// The content of the first file in a tar archive (what the archive API
/// returns for one path), bounded by the archive itself.
fn first_tar_file(tar: &[u8]) -> Option<&[u8]> {
    let header = tar.get(..512)?;
    let size_field = std::str::from_utf8(&header[124..136]).ok()?;
    let size =
        usize::from_str_radix(size_field.trim_matches(|c: char| c == '\0' || c == ' '), 8).ok()?;
    if size > MAX_PASSWD_BYTES {
        return None;
    }
    tar.get(512..512 + size)
}

impl Sandbox {
    /// The run-as setting of a profile; a bad spelling is refused.
    pub fn run_as(profile: &Profile) -> Result<RunAs> {
        match profile.run_as.as_deref() {
            None => Ok(RunAs::Root),
            Some(spec) => RunAs::parse(spec).map_err(SandboxError::Invalid),
        }
    }

    /// The uid and gid commands of `profile` run as: `uid:gid` as given, or
    /// a user name read from the container image's `/etc/passwd` without
    /// running anything in it; root only for the explicit `root`. An image
    /// without that user is refused with a clear error: the drop to an
    /// unprivileged user is never turned off silently.
    pub async fn run_user(&self, container_id: &str, profile: &Profile) -> Result<RunUser> {
        let run_as = Self::run_as(profile)?;
        let RunAs::Name(user) = &run_as else {
            return run_as.resolve(None).map_err(SandboxError::Invalid);
        };
        let no_user = |why: String| {
            SandboxError::Invalid(format!(
                "image {} cannot run commands as {user:?}: {why}. Set OPKERNEL_RUN_AS to uid:gid (default 1000:1000) \
                 or a user the image has, or OPKERNEL_RUN_AS=root to run commands as root (a root command can forge its own result)",
                profile.image
            ))
        };
        let options = DownloadFromContainerOptionsBuilder::default()
            .path("/etc/passwd")
            .build();
        let mut stream = self
            .docker
            .download_from_container(container_id, Some(options));
        let mut tar = Vec::new();
        while let Some(chunk) = stream.next().await {
            match chunk.map_err(SandboxError::from) {
                Ok(bytes) if tar.len() < MAX_PASSWD_BYTES + 1024 => tar.extend_from_slice(&bytes),
                Ok(_) => return Err(no_user("its /etc/passwd is too large".into())),
                Err(SandboxError::NotFound(_)) => {
                    return Err(no_user("it has no /etc/passwd".into()))
                }
                Err(e) => return Err(e),
            }
        }
        let passwd =
            first_tar_file(&tar).ok_or_else(|| no_user("its /etc/passwd is unreadable".into()))?;
        run_as
            .resolve(Some(&String::from_utf8_lossy(passwd)))
            .map_err(no_user)
    }

    /// Checks, before any run container exists, that commands of `profile`
    /// can run as its user. For a user name, `profile.image` must have it:
    /// a container of the image is created (never started, not labelled as
    /// managed), its `/etc/passwd` read and the container removed.
    pub async fn check_run_user(&self, profile: &Profile) -> Result<RunUser> {
        let run_as = Self::run_as(profile)?;
        if !matches!(run_as, RunAs::Name(_)) {
            return run_as.resolve(None).map_err(SandboxError::Invalid);
        }
        let config = bollard::models::ContainerCreateBody {
            image: Some(profile.image.clone()),
            cmd: Some(vec!["/opkernel-user-check".to_owned()]),
            network_disabled: Some(true),
            ..Default::default()
        };
        let created = self
            .docker
            .create_container(
                None::<bollard::query_parameters::CreateContainerOptions>,
                config,
            )
            .await?;
        let user = self.run_user(&created.id, profile).await;
        let _ = self.remove(&created.id).await;
        user
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_tar_member_is_read_within_its_size() {
        let mut tar = vec![0u8; 512];
        tar[..6].copy_from_slice(b"passwd");
        tar[124..136].copy_from_slice(b"00000000005\0");
        tar.extend_from_slice(b"hello, and more");
        assert_eq!(first_tar_file(&tar), Some(&b"hello"[..]));
        assert_eq!(first_tar_file(&tar[..100]), None);
        tar[124..136].copy_from_slice(b"77777777777\0");
        assert_eq!(first_tar_file(&tar), None);
    }
}
