//! Workspaces (SPEC §26): the operator's images, a new run's image, and a
//! new run's workspace copied from another run or a snapshot (a fork).
//! The files themselves are `files.rs`; snapshots are `snapshots.rs`.

use std::path::PathBuf;

use axum::extract::State;
use axum::Json;

use super::{ApiError, ApiResult, AppState};
use crate::surfaces::auth::Principal;
use crate::surfaces::requests::CreateRun;
use crate::surfaces::views::{ImageList, ImageView};

/// `GET /v1/images`: the images runs may be created with, by name, with
/// their references and the image ids the engine has for them (`null`:
/// the engine has no such image).
#[utoipa::path(
    get,
    path = "/v1/images",
    tag = "runs",
    responses((status = 200, description = "Success", body = ImageList)),
)]
pub async fn images(
    State(k): State<AppState>,
    _principal: Principal,
) -> ApiResult<Json<ImageList>> {
    let mut images = Vec::new();
    for i in &k.config.images.list {
        let digest = k.backend.image_id(&i.reference).await.ok();
        images.push(ImageView {
            name: i.name.clone(),
            reference: i.reference.clone(),
            digest,
            default: i.name == k.config.images.default,
        });
    }
    Ok(Json(ImageList { images }))
}

/// The refusal of an image name the operator does not list.
fn unlisted(k: &AppState, name: &str) -> ApiError {
    ApiError::bad_request(format!(
        "image {name:?} is not one of the operator's images ({}; see GET /v1/images)",
        k.config.images.names().join(", ")
    ))
}

/// The image a new run gets, by name (`None`: the kernel's default), and a
/// check of its envelope's `images`: every name listed by the operator; a
/// child's image is its parent's unless it names one its parent's envelope
/// allows.
pub(super) async fn run_image(
    k: &AppState,
    principal: &Principal,
    req: &CreateRun,
) -> ApiResult<Option<String>> {
    let named = req.envelope.iter().flat_map(|e| e.images.iter().flatten());
    for name in req.image.iter().chain(named) {
        if k.config.images.reference(name).is_none() {
            return Err(unlisted(k, name));
        }
    }
    let Principal::Run(parent) = principal else {
        return Ok(req.image.clone());
    };
    let meta = k
        .run_meta(parent)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no run {parent}")))?;
    match &req.image {
        Some(name) if *name != meta.image && !meta.envelope.allows_image(name) => {
            Err(ApiError::envelope_exceeded(format!(
                "image: {name} is not in the parent's envelope images ({}): a child run may only narrow its parent's envelope",
                meta.envelope.images.clone().unwrap_or_default().join(", ")
            )))
        }
        Some(name) => Ok(Some(name.clone())),
        None => Ok(Some(meta.image.clone())),
    }
}

/// A fork's source: `RUN` or `RUN@SNAPSHOT`, checked against who asks (a
/// run token forks its own run into its child; the operator any run).
#[derive(Debug, Clone)]
pub(super) struct ForkSource {
    /// The run whose workspace is copied.
    pub run: String,
    /// The snapshot, when one is named.
    pub snapshot: Option<String>,
    /// The host directory copied.
    pub dir: PathBuf,
}

impl ForkSource {
    /// As the run's events name it.
    pub fn name(&self) -> String {
        match &self.snapshot {
            Some(s) => format!("{}@{s}", self.run),
            None => self.run.clone(),
        }
    }
}

/// Checks `fork_from` and finds what it names.
pub(super) async fn fork_source(
    k: &AppState,
    principal: &Principal,
    fork_from: &str,
) -> ApiResult<ForkSource> {
    let (run, snapshot) = match fork_from.split_once('@') {
        Some((run, snap)) => (run, Some(snap)),
        None => (fork_from, None),
    };
    sandbox::profile::validate_run_id(run)
        .map_err(|e| ApiError::bad_request(format!("fork_from: {e}")))?;
    if let Principal::Run(own) = principal {
        if own != run {
            return Err(ApiError::forbidden(format!(
                "fork_from: a run token forks its own run ({own}) into its child, not {run}"
            )));
        }
    }
    if k.store.get_run(run).await?.is_none() {
        return Err(ApiError::not_found(format!("fork_from: no run {run}")));
    }
    let dir = match snapshot {
        Some(name) => {
            check_name(name)?;
            if k.store.snapshot(run, name).await?.is_none() {
                return Err(ApiError::not_found(format!(
                    "fork_from: run {run} has no snapshot {name}"
                )));
            }
            crate::runtime::workspace::snapshot_dir(k, run, name)
        }
        None => k
            .config
            .scratch_root()
            .join(sandbox::profile::scratch_key(run)),
    };
    Ok(ForkSource {
        run: run.to_owned(),
        snapshot: snapshot.map(str::to_owned),
        dir,
    })
}

/// In a cluster, a fork is made on the node holding its source's
/// workspace (where the new run is then placed): `Some(answer)` when that
/// is another node, the whole call relayed there with the caller's token.
pub(super) async fn fork_elsewhere(
    k: &AppState,
    principal: &Principal,
    headers: &axum::http::HeaderMap,
    req: &CreateRun,
) -> ApiResult<Option<axum::response::Response>> {
    let Some(from) = &req.fork_from else {
        return Ok(None);
    };
    if k.node.is_none() || super::proxy::is_forwarded(k, headers, "/v1/runs") {
        return Ok(None);
    }
    let source = fork_source(k, principal, from).await?;
    let Some(node) = k.store.workspace_node(&source.run).await? else {
        return Err(ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "node_unavailable",
            format!(
                "no active node can take run {}'s tree (and its workspace) now",
                source.run
            ),
        ));
    };
    if k.runs_here(Some(&node)) {
        return Ok(None);
    }
    let body = serde_json::to_vec(req).map_err(|e| ApiError::internal(e.to_string()))?;
    let hop = super::proxy::Hop {
        node: &node,
        lost: format!(
            "run {}'s workspace was on node {node}, which is dead",
            source.run
        ),
        path: "/v1/runs",
        method: axum::http::Method::POST,
        body: Some((
            body.into(),
            axum::http::HeaderValue::from_static("application/json"),
        )),
    };
    super::proxy::relay(k, headers, hop).await.map(Some)
}

/// Longest a consistent copy keeps its source frozen: well inside the
/// start-evidence window (10 s) and the grace (60 s), so no observer of
/// the source's ops ever takes the pause for a lost op.
const FREEZE_BOUND: std::time::Duration = std::time::Duration::from_secs(4);

/// Copies a fork's source into a new directory beside the scratch dirs
/// (renamed into place by [`place_fork`] once the run exists); a run
/// without a workspace yet gives an empty one. `consistent` freezes the
/// source's containers (a live run, not a snapshot) for at most
/// [`FREEZE_BOUND`], holding the source's reap gate: no launch, files
/// call or reaping of it meanwhile. The copy runs in a task of its own,
/// so a caller that goes away never leaves the source frozen.
pub(super) async fn copy_fork(
    k: &AppState,
    source: &ForkSource,
    consistent: bool,
    max_bytes: Option<u64>,
) -> ApiResult<(PathBuf, sandbox::files::Copied)> {
    let temp = k
        .config
        .scratch_root()
        .join(format!(".fork-{}", uuid::Uuid::new_v4().simple()));
    if let Some(me) = &k.node {
        let there = k.store.workspace_node(&source.run).await?;
        if there.as_deref() != Some(me.config.name.as_str()) {
            return Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "node_unavailable",
                format!(
                    "run {}'s workspace is on node {there:?}, not this one: try again",
                    source.run
                ),
            ));
        }
    }
    let freeze_it = consistent && source.snapshot.is_none();
    // a run that never had a workspace forks into an empty one; a
    // snapshot's files must be here
    let must_exist = source.snapshot.is_some();
    let (k2, run, from, to) = (
        k.clone(),
        source.run.clone(),
        source.dir.clone(),
        temp.clone(),
    );
    let task = tokio::spawn(async move {
        let _gate = match freeze_it {
            true => Some(k2.reap_gate(&run).await),
            false => None,
        };
        let frozen = match freeze_it {
            true => freeze(&k2, &run).await?,
            false => Vec::new(),
        };
        let bounds = sandbox::files::CopyBounds {
            deadline: freeze_it.then(|| std::time::Instant::now() + FREEZE_BOUND),
            max_bytes,
        };
        let copied = tokio::task::spawn_blocking(move || {
            if !must_exist && std::fs::symlink_metadata(&from).is_err() {
                std::fs::create_dir(&to)?;
                return Ok(sandbox::files::Copied::default());
            }
            sandbox::files::copy_tree_within(&from, &to, bounds)
        })
        .await;
        thaw(&k2, &frozen).await;
        Ok::<_, ApiError>(copied)
    });
    let copied = task
        .await
        .map_err(|e| ApiError::internal(format!("fork: {e}")))??
        .map_err(|e| ApiError::internal(format!("fork: {e}")))?;
    copied.map(|c| (temp.clone(), c)).map_err(|e| {
        let _ = std::fs::remove_dir_all(&temp);
        copy_error(source, max_bytes, e)
    })
}

/// A copy's failure as the API answers it.
fn copy_error(source: &ForkSource, max_bytes: Option<u64>, e: std::io::Error) -> ApiError {
    let name = source.name();
    match e.kind() {
        std::io::ErrorKind::TimedOut => ApiError::conflict(format!(
            "fork: {name} is too large to copy within {}s while frozen; fork it without consistent",
            FREEZE_BOUND.as_secs()
        )),
        std::io::ErrorKind::FileTooLarge => ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "disk_exceeded",
            format!(
                "copying {name} would pass the {} bytes its chain's disk_bytes leave",
                max_bytes.unwrap_or(0)
            ),
        ),
        std::io::ErrorKind::NotFound if source.snapshot.is_some() => ApiError::not_found(format!(
            "fork: the files of snapshot {name} are gone (removed, or on a node that is gone)"
        )),
        _ => ApiError::internal(format!("fork: copying {name}: {e}")),
    }
}

/// Moves a fork's copy into place as the new run's scratch dir (one
/// rename); a run that already has one (a retried creation) keeps it.
pub(super) fn place_fork(k: &AppState, run: &str, temp: &std::path::Path) -> bool {
    let dir = k
        .config
        .scratch_root()
        .join(sandbox::profile::scratch_key(run));
    if std::fs::symlink_metadata(&dir).is_ok() {
        let _ = std::fs::remove_dir_all(temp);
        return false;
    }
    match std::fs::rename(temp, &dir) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(%run, %e, "fork: the copy could not be put in place");
            let _ = std::fs::remove_dir_all(temp);
            false
        }
    }
}

/// Records a fork in the new run's journal and, in a cluster, places the
/// new tree on this node (its workspace is on this node's disk).
pub(super) async fn record_fork(
    k: &AppState,
    run: &str,
    source: &ForkSource,
    copied: &sandbox::files::Copied,
    consistent: bool,
) -> ApiResult<()> {
    if let Some(node) = &k.config.node {
        if !k.store.place_fork(run, &node.name).await? {
            return Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "node_unavailable",
                format!(
                    "run {run} was created without the fork's copy: its tree is placed on \
                     another node (or this node's lease lapsed)"
                ),
            ));
        }
    }
    let event = crate::event_kind::EventKind::RunForked(crate::event_kind::RunForked {
        from: source.name(),
        bytes: copied.bytes,
        consistent,
    });
    k.store.record_run_event(run, event).await?;
    tracing::info!(%run, from = %source.name(), bytes = copied.bytes, reflinked = copied.reflinked, copied = copied.copied, "run forked");
    Ok(())
}

/// Checks a snapshot name: `[A-Za-z0-9_.-]{1,64}`, no `..`.
pub(super) fn check_name(name: &str) -> ApiResult<()> {
    sandbox::profile::validate_run_id(name).map_err(|_| {
        ApiError::bad_request(format!(
            "a snapshot name matches [A-Za-z0-9_.-]{{1,64}} (no ..), got {:?}",
            name.chars().take(80).collect::<String>()
        ))
    })
}

/// Pauses the run's running containers (its own, or the pool container it
/// adopted); returns those paused, for [`thaw`].
pub(super) async fn freeze(k: &AppState, run: &str) -> ApiResult<Vec<String>> {
    let mut frozen = Vec::new();
    for c in k.backend.list_managed().await? {
        if c.running && k.backend.owns(&c) && k.run_of(&c).as_deref() == Some(run) {
            let marked = crate::runtime::workspace::mark_frozen(k, &c.id)
                .map_err(|e| ApiError::internal(format!("fork: the freeze's mark: {e}")));
            let paused = match marked {
                Ok(()) => k
                    .backend
                    .set_paused(&c.id, true)
                    .await
                    .map_err(ApiError::from),
                Err(e) => Err(e),
            };
            if let Err(e) = paused {
                crate::runtime::workspace::unmark_frozen(k, &c.id);
                // those already frozen are thawed: all or none
                thaw(k, &frozen).await;
                return Err(e);
            }
            frozen.push(c.id);
        }
    }
    Ok(frozen)
}

/// Unpauses what [`freeze`] paused (a failure is logged and the mark
/// kept, marked failed: the retention pass and the next start retry it).
pub(super) async fn thaw(k: &AppState, frozen: &[String]) {
    for id in frozen {
        match k.backend.set_paused(id, false).await {
            Ok(()) => crate::runtime::workspace::unmark_frozen(k, id),
            Err(e) => {
                // the retention pass tries again
                crate::runtime::workspace::thaw_failed(k, id);
                tracing::error!(container = %id, %e, "a frozen container could not be thawed")
            }
        }
    }
}

/// Creates the run and, for a fork, puts its copy in place as its scratch
/// dir and records the fork; returns what it copied from when it did. The
/// new run admits no launch or files call until then (they wait on its
/// gate), so nothing makes its scratch first.
pub(super) async fn create_placing(
    k: &AppState,
    new: &crate::store::NewRun,
    fork: Option<&(ForkSource, PathBuf, sandbox::files::Copied)>,
    consistent: bool,
) -> ApiResult<(crate::store::CreatedRun, Option<String>)> {
    let placing = match fork {
        Some(_) => Some(k.reap_gate(&new.run_id).await),
        None => None,
    };
    let created = k.store.create_run(new.clone()).await;
    let made = matches!(created, Ok(crate::store::CreatedRun::Created(_)));
    let mut forked_from = None;
    if let Some((source, temp, copied)) = fork {
        if made && place_fork(k, &new.run_id, temp) {
            if let Err(e) = record_fork(k, &new.run_id, source, copied, consistent).await {
                // the copy is not kept where the run's commands will not be
                let key = sandbox::profile::scratch_key(&new.run_id);
                let _ = std::fs::remove_dir_all(k.config.scratch_root().join(key));
                return Err(e);
            }
            forked_from = Some(source.name());
        } else {
            let _ = std::fs::remove_dir_all(temp);
        }
    }
    drop(placing);
    Ok((created?, forked_from))
}
