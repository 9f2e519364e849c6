//! A kernel's home and identity: the checks before serving (settings,
//! the run image's user), the home's lock, operator token, control plane
//! file and scratch root with their modes, and the kernel's identity.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use sandbox::OpBackend;

use crate::runtime::config::Config;
use crate::store::Store;

/// Why the kernel refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Another `opkernel serve` holds the home's lock; the home's path.
    #[error("another opkernel serve owns {0} (its lock is held); stop it first")]
    HomeLocked(String),
    /// The home, a file in it or its modes could not be set up.
    #[error("cannot prepare home {path}: {source}")]
    Home {
        /// The path that failed.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A setting could not be read (a typo never silently means a default).
    #[error("invalid setting: {0}")]
    Config(String),
    /// The control plane could not be opened, migrated or recovered.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The sandbox refused a start-up check (the run image lacks the run
    /// user) or could not be set up.
    #[error(transparent)]
    Sandbox(#[from] sandbox::SandboxError),
}

pub(crate) fn kernel_identity() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let start = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.split(' ').nth(19))
        .unwrap_or("0")
        .to_owned();
    format!("{}:{}:{}", boot.trim(), std::process::id(), start)
}

/// Creates `path` as an empty 0600 file unless it exists, and makes it 0600.
fn private_file(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    match File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        }
        Err(e) => Err(e),
    }
}

/// Refuses to start when the run image lacks the user commands are dropped
/// to (the drop is never turned off silently). An engine that cannot answer
/// now defers the check to the first container, which makes it again.
pub(crate) async fn check_run_user(
    backend: &dyn OpBackend,
    config: &Config,
) -> Result<(), StartError> {
    match backend.check_run_user(&config.profile).await {
        Ok(user) => {
            tracing::info!(image = %config.profile.image, uid = user.uid, gid = user.gid, "run user checked");
            Ok(())
        }
        Err(e @ sandbox::SandboxError::Invalid(_)) => Err(StartError::Sandbox(e)),
        Err(e) => {
            tracing::warn!(%e, image = %config.profile.image, "cannot check the run user now; each run container checks it");
            Ok(())
        }
    }
}

/// Refuses to start when an image the operator lists (`OPKERNEL_IMAGE`,
/// `OPKERNEL_IMAGES`) is missing from the engine, naming each (SPEC §26):
/// a run never learns of it at its first op. An engine that cannot answer
/// now defers the question to each container.
pub(crate) async fn check_images(
    backend: &dyn OpBackend,
    config: &Config,
) -> Result<(), StartError> {
    let mut missing = Vec::new();
    for image in &config.images.list {
        match backend.image_id(&image.reference).await {
            Ok(_) => {}
            Err(sandbox::SandboxError::NotFound(_)) => {
                missing.push(format!("{}={}", image.name, image.reference))
            }
            Err(e) => tracing::warn!(%e, image = %image.reference, "cannot check the image now"),
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(StartError::Config(format!(
        "the engine has no image for {} (build or load it, or take it off OPKERNEL_IMAGE / OPKERNEL_IMAGES)",
        missing.join(", ")
    )))
}

/// Refuses a start whose profiles (the default one, the pooled ones) ask
/// for a runtime the engine has not registered, naming it and how to
/// register it (SPEC §30). An engine that cannot answer now defers the
/// question to each container.
pub(crate) async fn check_runtimes(
    backend: &dyn OpBackend,
    config: &Config,
) -> Result<(), StartError> {
    let asked = std::iter::once(&config.profile)
        .chain(&config.pool.profiles)
        .map(|p| p.runtime)
        .filter(|r| !r.is_runc());
    let mut asked: Vec<sandbox::Runtime> = asked.collect();
    if asked.is_empty() {
        return Ok(());
    }
    asked.dedup();
    let known = match backend.runtimes().await {
        Ok(known) => known,
        Err(e) => {
            tracing::warn!(%e, "cannot ask the engine for its runtimes now");
            return Ok(());
        }
    };
    match asked
        .iter()
        .find(|r| !known.iter().any(|k| k == r.as_str()))
    {
        None => Ok(()),
        Some(missing) => Err(StartError::Config(missing_runtime(*missing, &known))),
    }
}

/// Why a runtime cannot be used: the engine does not know it.
pub(crate) fn missing_runtime(runtime: sandbox::Runtime, known: &[String]) -> String {
    format!(
        "runtime {} is not registered with this host's Docker engine (it has: {}); \
         scripts/docker-up.sh --runsc installs Debian's runsc and registers it",
        runtime.as_str(),
        known.join(", ")
    )
}

fn home_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> StartError + '_ {
    move |source| StartError::Home {
        path: path.display().to_string(),
        source,
    }
}

/// Makes the home (0700), takes its lock, and prepares the control plane
/// file (0600) and the scratch root (0711).
pub(crate) fn prepare_home(config: &Config) -> Result<(File, String), StartError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !config.invalid.is_empty() {
        return Err(StartError::Config(config.invalid.join("; ")));
    }
    let home = &config.home;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(home)
        .map_err(home_error(home))?;
    // the home holds the control plane, tokens and every run's files
    std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o700))
        .map_err(home_error(home))?;
    let lock_path = home.join("kernel.lock");
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(home_error(&lock_path))?;
    if lock.try_lock().is_err() {
        return Err(StartError::HomeLocked(home.display().to_string()));
    }
    let operator_token = load_or_create_operator_token(home).map_err(home_error(home))?;
    let scratch = config.scratch_root();
    std::fs::create_dir_all(&scratch).map_err(home_error(&scratch))?;
    std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o711))
        .map_err(home_error(&scratch))?;
    Ok((lock, operator_token))
}

/// What a kernel holds for as long as it serves: the home's lock, and on
/// PostgreSQL the control plane's ownership lock too (one kernel per
/// database, as one per home).
pub(crate) struct Ownership {
    _home: File,
    #[cfg(feature = "postgres")]
    store: Option<crate::store::db::pgowner::Owner>,
}

impl Ownership {
    /// Resolves, with the reason, once another kernel took the control
    /// plane (PostgreSQL only, after a lost connection); never on SQLite.
    pub(crate) async fn lost(&self) -> String {
        #[cfg(feature = "postgres")]
        if let Some(owner) = &self.store {
            return owner.lost().await;
        }
        std::future::pending().await
    }
}

/// Opens the control plane the config names: the home's SQLite file
/// (`kernel.db`, 0600 with its -wal and -shm), or a PostgreSQL server (the
/// home then holds no database, only the lock, tokens and run files),
/// whose ownership lock is taken first.
pub(crate) async fn open_store(
    config: &Config,
    home_lock: File,
) -> Result<(Ownership, Store), StartError> {
    use std::os::unix::fs::PermissionsExt;
    if let crate::store::StoreLocation::Postgres(url) = &config.store {
        return open_postgres(config, url, home_lock).await;
    }
    if config.node.is_some() {
        return Err(StartError::Config(
            "a cluster node (--node) needs a PostgreSQL control plane its nodes share (--store postgres://…)".into(),
        ));
    }
    let home = &config.home;
    let db = home.join("kernel.db");
    // SQLite gives its -wal and -shm files the database file's mode
    private_file(&db).map_err(home_error(&db))?;
    for file in [home.join("kernel.db-wal"), home.join("kernel.db-shm")] {
        if file.exists() {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .map_err(home_error(&file))?;
        }
    }
    let ownership = Ownership {
        _home: home_lock,
        #[cfg(feature = "postgres")]
        store: None,
    };
    Ok((ownership, Store::open(&db, config.store_options())?))
}

/// Takes a PostgreSQL control plane's ownership lock (one single kernel
/// per database, or any number of nodes, each name once), then connects.
#[cfg(feature = "postgres")]
async fn open_postgres(
    config: &Config,
    url: &str,
    home_lock: File,
) -> Result<(Ownership, Store), StartError> {
    use crate::store::db::pgowner::{lock_key, Keys, Owner, START_PATIENCE};
    tracing::info!(store = %config.store.shown(), "control plane on PostgreSQL");
    let keys = match &config.node {
        None => Keys::from(lock_key("kernel")),
        Some(node) => Keys {
            own: lock_key(&format!("node:{}", node.name)),
            shared: Some(lock_key("kernel")),
        },
    };
    let owner = Owner::take(url, keys, START_PATIENCE).await?;
    let ownership = Ownership {
        _home: home_lock,
        store: Some(owner),
    };
    let store = Store::connect(url, config.store_options()).await?;
    Ok((ownership, store))
}

/// A build without PostgreSQL refuses a postgres:// store at start.
#[cfg(not(feature = "postgres"))]
async fn open_postgres(
    _config: &Config,
    _url: &str,
    _home_lock: File,
) -> Result<(Ownership, Store), StartError> {
    Err(StartError::Config(
        "OPKERNEL_STORE names a PostgreSQL server, but this opkernel was built without the \
         `postgres` feature: build it with default features, or use the home's SQLite store"
            .into(),
    ))
}

/// Reads `<home>/operator.token`, creating it (mode 0600) on first start.
fn load_or_create_operator_token(home: &std::path::Path) -> std::io::Result<String> {
    let path = home.join("operator.token");
    match std::fs::read_to_string(&path) {
        Ok(token) if token.trim().len() >= 64 => return Ok(token.trim().to_owned()),
        Ok(_) => {
            return Err(std::io::Error::other(format!(
                "{} is too short to be an operator token; remove it to get a new one",
                path.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let token = crate::base::tokens::new_token();
    let tmp = home.join("operator.token.tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(format!("{token}\n").as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn operator_token_is_created_once_with_mode_0600() {
        let home = std::env::temp_dir().join(format!("opk-auth-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&home).unwrap();
        let a = load_or_create_operator_token(&home).unwrap();
        let b = load_or_create_operator_token(&home).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
        let mode = std::fs::metadata(home.join("operator.token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(home).unwrap();
    }

    #[tokio::test]
    async fn a_runtime_the_engine_lacks_stops_the_start_and_says_how() {
        use crate::runtime::fake_backend::{Fake, Launcher, OnStart};
        let home = std::env::temp_dir().join(format!("opk-rt-{}", uuid::Uuid::new_v4()));
        let mut config = crate::app::settings::load::defaults(home.clone());
        // the fake engine knows runc only
        let fake = Fake::new(config.scratch_root(), OnStart::Exit(0), Launcher::None);
        assert!(check_runtimes(&fake, &config).await.is_ok());
        config.pool.profiles.push(sandbox::Profile {
            runtime: sandbox::Runtime::Runsc,
            ..config.profile.clone()
        });
        match check_runtimes(&fake, &config).await {
            Err(StartError::Config(why)) => {
                assert!(why.contains("runtime runsc is not registered"), "{why}");
                assert!(why.contains("docker-up.sh --runsc"), "{why}");
            }
            other => panic!("a pooled runsc profile on a runc-only engine: {other:?}"),
        }
    }
}
