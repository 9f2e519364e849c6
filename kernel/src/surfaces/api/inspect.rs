//! `GET /v1/containers/{id}` (SPEC §23): one managed container, inside
//! and out: labels, profile, state, its run's ops, its marked processes
//! (the shim's `ps`), its scratch use and the reaper's verdict. The
//! operator token only. `{id}` is a container id (or a prefix of at least
//! 4 characters naming one), a container name, or a run id.

use std::path::Path;
use std::time::Duration;

use axum::extract::State;
use axum::Json;

use super::{require_operator, ApiError, ApiResult, AppState, Seg};
use crate::store::{now_ms, Op};
use crate::surfaces::auth::Principal;
use crate::surfaces::views::{
    ContainerInspect, InspectOp, InspectProcess, ProfileView, ReaperVerdict,
};

/// How long the process table may take by exec.
const PS_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the launcher has to answer before the table is read by exec.
const LAUNCHER_TIMEOUT: Duration = Duration::from_secs(2);
/// Entries counted under a scratch dir at most (a bound on the walk).
const MAX_SCRATCH_ENTRIES: usize = 200_000;
/// Recent ops shown beside the live ones.
const RECENT_OPS: u32 = 20;

/// The one container `wanted` names: its id, a unique id prefix, its name
/// or its run.
fn pick<'a>(
    k: &AppState,
    list: &'a [sandbox::ContainerInfo],
    wanted: &str,
) -> ApiResult<&'a sandbox::ContainerInfo> {
    let run_of = |c: &sandbox::ContainerInfo| k.run_of(c);
    let exact = list
        .iter()
        .find(|c| c.id == wanted || c.name == wanted)
        .or_else(|| list.iter().find(|c| run_of(c).as_deref() == Some(wanted)));
    if let Some(c) = exact {
        return Ok(c);
    }
    let by_prefix: Vec<_> = list
        .iter()
        .filter(|c| wanted.len() >= 4 && c.id.starts_with(wanted))
        .collect();
    match by_prefix[..] {
        [one] => Ok(one),
        [] => Err(ApiError::not_found(format!(
            "no managed container or run container named {wanted:?}"
        ))),
        _ => Err(ApiError::bad_request(format!(
            "{wanted:?} is the start of {} container ids: give more of it",
            by_prefix.len()
        ))),
    }
}

/// Whether `wanted` is a plain id, name or run id (`[A-Za-z0-9_.-]`): the
/// only kind sent on to other nodes, as a path of theirs.
fn plain(wanted: &str) -> bool {
    wanted
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && wanted.bytes().any(|b| b != b'.')
}

/// The container `wanted` names on another cluster node: the first node
/// that knows it answers; none does: `missing` (a node that could not
/// answer is named in it).
async fn elsewhere(
    k: &AppState,
    headers: &axum::http::HeaderMap,
    wanted: &str,
    missing: ApiError,
) -> ApiResult<ContainerInspect> {
    let path = format!("/v1/containers/{wanted}");
    let get = reqwest::Method::GET;
    let (answers, unreachable) =
        super::fanout::others::<ContainerInspect>(k, headers, get, &path).await?;
    if let Some((_, found)) = answers.into_iter().next() {
        return Ok(found);
    }
    match unreachable.is_empty() {
        true => Err(missing),
        false => Err(ApiError::not_found(format!(
            "no managed container or run container named {wanted:?} on the nodes that answered; \
             not asked: {}",
            unreachable
                .iter()
                .map(|u| format!("{} ({})", u.node, u.reason))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

#[utoipa::path(
    get,
    path = "/v1/containers/{id}",
    tag = "operators",
    params(("id" = String, Path, description = "A container id (or a unique prefix of at least 4 characters), a container name, or a run id")),
    responses((status = 200, description = "Success", body = crate::surfaces::views::ContainerInspect)),
)]
pub async fn inspect(
    State(k): State<AppState>,
    principal: Principal,
    headers: axum::http::HeaderMap,
    Seg(wanted): Seg<String>,
) -> ApiResult<Json<ContainerInspect>> {
    require_operator(&principal)?;
    if wanted.is_empty() || wanted.len() > 128 {
        return Err(ApiError::bad_request("a container id, name or run id"));
    }
    let list = k.backend.list_managed().await?;
    let picked = match pick(&k, &list, &wanted) {
        Ok(c) => c,
        // in a cluster, the container may be another node's (SPEC §24):
        // asked of the others only for a plain name (it is their path)
        Err(e) if e.status == axum::http::StatusCode::NOT_FOUND && plain(&wanted) => {
            return elsewhere(&k, &headers, &wanted, e).await.map(Json)
        }
        Err(e) => return Err(e),
    };
    // inspected whole: a listing carries no hostname (the launcher's key)
    let c = &k.backend.inspect(&picked.id).await?;
    let run_id = k.run_of(c);
    let valid_run = run_id
        .clone()
        .filter(|r| sandbox::profile::validate_run_id(r).is_ok());
    let (profile, ops) = match &valid_run {
        Some(run) => (
            k.run_meta(run)
                .await?
                .map(|m| ProfileView::from(&m.profile)),
            run_ops(&k, run).await?,
        ),
        None => (None, Vec::new()),
    };
    let scratch_key = valid_run.as_deref().map(sandbox::profile::scratch_key);
    let (processes, processes_error, processes_source) =
        processes(&k, c, scratch_key.as_deref()).await;
    let scratch_bytes = match valid_run.as_deref().filter(|_| k.backend.owns(c)) {
        Some(run) => {
            let dir = k
                .config
                .scratch_root()
                .join(sandbox::profile::scratch_key(run));
            tokio::task::spawn_blocking(move || dir_bytes(&dir))
                .await
                .ok()
        }
        None => None,
    };
    let decision = crate::runtime::reaper::verdict_on(&k, c).await?;
    Ok(Json(ContainerInspect {
        container_id: c.id.clone(),
        name: c.name.clone(),
        state: c.state.clone(),
        labels: c.labels.clone().into_iter().collect(),
        fingerprint: c.labels.get(sandbox::profile::LABEL_FINGERPRINT).cloned(),
        profile,
        run_id,
        ops,
        processes,
        processes_error,
        processes_source,
        scratch_bytes,
        reaper: ReaperVerdict {
            verdict: decision.action,
            reason: decision.reason,
        },
    }))
}

/// The run's live ops, then its latest others, newest first.
async fn run_ops(k: &AppState, run: &str) -> ApiResult<Vec<InspectOp>> {
    let mut ops = k.store.list_live_ops(Some(run.to_owned()), 100).await?;
    for op in k.store.list_ops(Some(run.to_owned()), RECENT_OPS).await? {
        if !ops.iter().any(|o| o.id == op.id) {
            ops.push(op);
        }
    }
    ops.sort_by_key(|op| std::cmp::Reverse(op.created_at));
    let now = now_ms();
    Ok(ops.iter().map(|op| inspect_op(op, now)).collect())
}

fn inspect_op(op: &Op, now: i64) -> InspectOp {
    let command: String = op.command.join(" ").chars().take(200).collect();
    InspectOp {
        operation_id: op.id.clone(),
        status: op.status,
        age_ms: (now - op.created_at).max(0),
        exit_code: op.exit_code.map(i64::from),
        command,
    }
}

/// One table row as the view shows it.
fn process_view(r: sandbox::ProcessRow) -> InspectProcess {
    InspectProcess {
        pid: r.pid,
        operation_id: r.op_id,
        user: r.user,
        cpu: r.cpu_ms as f64 / 1000.0,
        rss: r.rss_kb * 1024,
        age: r.age_ms as f64 / 1000.0,
        command: r.command,
    }
}

/// What inspect shows of the processes: the table, why it is missing, who
/// read it.
type Processes = (Option<Vec<InspectProcess>>, Option<String>, Option<String>);

/// The container's marked processes: asked of its resident launcher
/// through the run's inbox, else read by `docker exec` of the shim's `ps`.
async fn processes(
    k: &AppState,
    c: &sandbox::ContainerInfo,
    scratch_key: Option<&str>,
) -> Processes {
    let table = |rows: Vec<sandbox::ProcessRow>, source: &str| {
        let rows = rows.into_iter().map(process_view).collect();
        (Some(rows), None, Some(source.to_owned()))
    };
    if !c.running {
        return (Some(Vec::new()), None, None);
    }
    if !c.has_shim {
        let why = "a container made before the shim has no process table";
        return (None, Some(why.into()), None);
    }
    // OPKERNEL_LAUNCHER=off: every probe goes by exec, this one too
    let ask = k.config.ops.launcher && c.has_launcher && k.backend.owns(c);
    if let (true, Some(key)) = (ask, scratch_key) {
        let asked = k
            .backend
            .process_table_by_launcher(key, &c.hostname, LAUNCHER_TIMEOUT);
        match asked.await {
            Ok(Some(rows)) => return table(rows, "launcher"),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(container = %c.name, %e, "the launcher's process table did not parse; reading it by exec")
            }
        }
    }
    match tokio::time::timeout(PS_TIMEOUT, k.backend.process_table(&c.id)).await {
        Ok(Ok(rows)) => table(rows, "exec"),
        Ok(Err(e)) => (None, Some(e.to_string()), None),
        Err(_) => {
            let why = format!("no process table in {}s", PS_TIMEOUT.as_secs());
            (None, Some(why), None)
        }
    }
}

/// Bytes of the regular files under `dir` (symlinks not followed; at most
/// [`MAX_SCRATCH_ENTRIES`] entries counted).
fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut seen = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > MAX_SCRATCH_ENTRIES {
                return total;
            }
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map_or(0, |m| m.len()),
                _ => {}
            }
        }
    }
    total
}
