//! Snapshots of a run's workspace (SPEC §26): named copies kept under the
//! home's `snapshots/<run>/<name>/`, counted against the tree's
//! `disk_bytes`, forked from with `"fork_from": "RUN@NAME"`, gone with
//! their tree's purge.

use axum::extract::State;
use axum::Json;

use super::{authorize_run, ApiError, ApiResult, AppState, Body, Scope, Seg};
use crate::runtime::workspace::{run_snapshots_dir, snapshot_dir};
use crate::store::SnapshotRecorded;
use crate::surfaces::auth::Principal;
use crate::surfaces::requests::MakeSnapshot;
use crate::surfaces::views::{SnapshotList, SnapshotView};

/// `POST /v1/runs/{run}/snapshots`: keeps a named copy of the run's
/// workspace (`/scratch`, never `.ops`); `consistent` freezes the run's
/// container during the copy. Counted against every `disk_bytes` on the
/// run's chain (403 `disk_exceeded`).
#[utoipa::path(
    post,
    path = "/v1/runs/{run}/snapshots",
    tag = "runs",
    params(super::params::RunPath),
    request_body = MakeSnapshot,
    responses((status = 200, description = "Success", body = SnapshotView)),
)]
pub async fn make(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    Body(req): Body<MakeSnapshot>,
) -> ApiResult<Json<SnapshotView>> {
    authorize_run(&k, &principal, &run, Scope::Own).await?;
    super::workspaces::check_name(&req.name)?;
    if k.store.snapshot(&run, &req.name).await?.is_some() {
        return Err(ApiError::conflict(format!(
            "run {run} has a snapshot {} already",
            req.name
        )));
    }
    let source = super::workspaces::fork_source(&k, &Principal::Operator, &run).await?;
    let room = k.store.snapshot_room(&run).await?;
    let (temp, copied) = super::workspaces::copy_fork(&k, &source, req.consistent, room).await?;
    let dir = snapshot_dir(&k, &run, &req.name);
    let placed = std::fs::create_dir_all(run_snapshots_dir(&k, &run))
        .and_then(|()| std::fs::rename(&temp, &dir));
    if let Err(e) = placed {
        let _ = std::fs::remove_dir_all(&temp);
        return Err(ApiError::internal(format!("snapshot {}: {e}", req.name)));
    }
    let refused = |m: String| ApiError::new(axum::http::StatusCode::FORBIDDEN, "disk_exceeded", m);
    match k
        .store
        .record_snapshot(&run, &req.name, copied.bytes)
        .await?
    {
        SnapshotRecorded::Made => {}
        other => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(match other {
                SnapshotRecorded::DiskExceeded { run_id, limit, used } => refused(format!(
                    "a snapshot of {} bytes would take run {run_id}'s tree past its disk_bytes ({used} of {limit} used)",
                    copied.bytes
                )),
                SnapshotRecorded::Exists => ApiError::conflict(format!("run {run} has a snapshot {} already", req.name)),
                _ => ApiError::not_found(format!("no run {run}")),
            });
        }
    }
    k.bump_run(&run);
    let snap = k
        .store
        .snapshot(&run, &req.name)
        .await?
        .ok_or_else(|| ApiError::internal("snapshot vanished"))?;
    Ok(Json(view(snap)))
}

fn view(s: crate::store::Snapshot) -> SnapshotView {
    SnapshotView {
        name: s.name,
        bytes: s.bytes,
        created_at: s.created_at,
    }
}

/// `GET /v1/runs/{run}/snapshots`: the run's snapshots with their sizes,
/// oldest first.
#[utoipa::path(
    get,
    path = "/v1/runs/{run}/snapshots",
    tag = "runs",
    params(super::params::RunPath),
    responses((status = 200, description = "Success", body = SnapshotList)),
)]
pub async fn list(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
) -> ApiResult<Json<SnapshotList>> {
    authorize_run(&k, &principal, &run, Scope::Own).await?;
    let snapshots = k
        .store
        .snapshots(&run)
        .await?
        .into_iter()
        .map(view)
        .collect();
    Ok(Json(SnapshotList { snapshots }))
}
