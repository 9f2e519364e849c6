//! The files API (SPEC §26): a run's files read, written, listed and
//! removed, and directories moved as tar streams, all streamed both ways
//! (memory bounded whatever the size). `{path}` is the container path
//! without its leading `/`; the I/O is `sandbox::files`, acting as the
//! run user inside the run's own view.

use axum::body::Body as RawBody;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures::StreamExt;
use sandbox::files::{self, FileError, View};
use serde::Deserialize;

use super::params::FilePath;
use super::{authorize_run, ApiError, ApiResult, AppState, Params, Scope, Seg};
use crate::event_kind::{EventKind, FileWritten};
use crate::runtime::workspace::{view_of, ViewError};
use crate::surfaces::auth::Principal;
use crate::surfaces::views::{FileEntry, FileList, FileType, FileWrittenView};

/// Chunks in flight between the HTTP body and the file thread.
const IN_FLIGHT: usize = 8;

/// The query of a write or a removal.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct FileQuery {
    /// A written file's permission bits, in octal (`644` unless given).
    #[param(pattern = r"^[0-7]{1,4}$")]
    pub mode: Option<String>,
    /// Remove a directory with everything in it.
    pub recursive: Option<bool>,
}

pub(super) fn file_error(e: FileError) -> ApiError {
    let m = e.to_string();
    match e {
        FileError::NotFound(_) => ApiError::not_found(m),
        FileError::Denied(_) => ApiError::forbidden(m),
        FileError::Refused(_) => ApiError::new(StatusCode::FORBIDDEN, "path_refused", m),
        FileError::WrongType(_) => ApiError::new(StatusCode::CONFLICT, "wrong_type", m),
        FileError::NotEmpty(_) => ApiError::new(StatusCode::CONFLICT, "not_empty", m),
        FileError::TooLarge(_) => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", m),
        FileError::Invalid(_) | FileError::Aborted(_) => ApiError::bad_request(m),
        FileError::Io { .. } => ApiError::internal(m),
    }
}

fn view_error(e: ViewError) -> ApiError {
    match e {
        ViewError::NoRun(run) => ApiError::not_found(format!("no run {run}")),
        e @ ViewError::Elsewhere(..) => ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "node_unavailable",
            format!("{e}: try again (the call is relayed to the run's node)"),
        ),
        ViewError::Store(e) => e.into(),
        ViewError::Sandbox(e) => e.into(),
        ViewError::Files(e) => file_error(e),
    }
}

/// Runs `f` on a thread acting as the view's user.
pub(super) async fn on_user<R, F>(view: View, f: F) -> ApiResult<R>
where
    R: Send + 'static,
    F: FnOnce(&View) -> files::FileResult<R> + Send + 'static,
{
    let handle = files::as_user(view.user, move || f(&view));
    tokio::task::spawn_blocking(move || handle.join())
        .await
        .map_err(|e| ApiError::internal(format!("files: {e}")))?
        .map_err(|_| ApiError::internal("files: the file thread panicked"))?
        .map_err(file_error)
}

/// The view of a run the caller may use, kept from the reaper.
pub(super) async fn open(
    k: &AppState,
    principal: &Principal,
    run: &str,
) -> ApiResult<(View, tokio::sync::OwnedRwLockReadGuard<()>)> {
    authorize_run(k, principal, run, Scope::Own).await?;
    view_of(k, run).await.map_err(view_error)
}

/// The body as a reader's channel: chunks go to the file thread as they
/// come; an error of the body reaches it as a read error.
fn feed(body: RawBody) -> files::ChannelReader {
    let (tx, rx) = tokio::sync::mpsc::channel(IN_FLIGHT);
    tokio::spawn(async move {
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(std::io::Error::other);
            let failed = chunk.is_err();
            if tx.send(chunk).await.is_err() || failed {
                return;
            }
        }
    });
    files::ChannelReader::new(rx)
}

/// A declared length past the limit is refused before anything is read.
fn check_length(k: &AppState, headers: &HeaderMap) -> ApiResult<u64> {
    let max = k.config.file_max_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(file_error(FileError::TooLarge(max)));
    }
    Ok(max)
}

pub(super) fn parse_mode(mode: Option<&str>) -> ApiResult<u32> {
    match mode {
        None => Ok(0o644),
        Some(m) => u32::from_str_radix(m, 8)
            .ok()
            .filter(|n| *n <= 0o7777 && !m.is_empty() && m.len() <= 4)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "mode must be octal permission bits like 644, got {m:?}"
                ))
            }),
    }
}

fn shown(path: &str) -> String {
    format!("/{}", path.trim_start_matches('/'))
}

pub(super) async fn written(
    k: &AppState,
    run: &str,
    path: &str,
    bytes: u64,
    entries: u64,
) -> ApiResult<Json<FileWrittenView>> {
    let event = EventKind::FileWritten(FileWritten {
        path: shown(path),
        bytes,
    });
    k.store.record_run_event(run, event).await?;
    k.bump_run(run);
    Ok(Json(FileWrittenView {
        path: shown(path),
        bytes,
        entries,
    }))
}

/// `PUT /v1/runs/{run}/files/{path}`: writes the raw body as the file
/// (parents made; owned by the command's uid; `?mode=`), whole or not at
/// all, at most `OPKERNEL_FILE_MAX_BYTES`.
#[utoipa::path(
    put,
    path = "/v1/runs/{run}/files/{path}",
    tag = "files",
    params(FilePath, FileQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, description = "Written", body = FileWrittenView)),
)]
pub async fn put_file(
    State(k): State<AppState>,
    principal: Principal,
    Seg(FilePath { run, path }): Seg<FilePath>,
    Params(q): Params<FileQuery>,
    headers: HeaderMap,
    body: RawBody,
) -> ApiResult<Json<FileWrittenView>> {
    let max = check_length(&k, &headers)?;
    let mode = parse_mode(q.mode.as_deref())?;
    let (view, _gate) = open(&k, &principal, &run).await?;
    let mut reader = feed(body);
    let target = path.clone();
    let bytes = on_user(view, move |v| {
        files::write(v, &target, mode, &mut reader, max)
    })
    .await?;
    written(&k, &run, &path, bytes, 1).await
}

/// `GET /v1/runs/{run}/files/{path}`: the file, raw and streamed (`Range`
/// honoured); a trailing `/` lists the directory.
#[utoipa::path(
    get,
    path = "/v1/runs/{run}/files/{path}",
    tag = "files",
    params(FilePath, ("Range" = Option<String>, Header, description = "One byte range: bytes=A-B, bytes=A- or bytes=-N")),
    responses(
        (status = 200, description = "The file's bytes, or a directory's listing", body = FileList),
        (status = 206, description = "The range asked for"),
    ),
)]
pub async fn get_file(
    State(k): State<AppState>,
    principal: Principal,
    Seg(FilePath { run, path }): Seg<FilePath>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (view, _gate) = open(&k, &principal, &run).await?;
    if path.ends_with('/') {
        let target = path.clone();
        let entries = on_user(view, move |v| files::list(v, &target)).await?;
        let entries = entries.into_iter().map(entry_view).collect();
        return Ok(Json(FileList {
            path: shown(&path),
            entries,
        })
        .into_response());
    }
    let target = path.clone();
    let opened = on_user(view, move |v| files::read(v, &target)).await?;
    super::files_range::respond(opened, &headers).await
}

pub(super) fn entry_view(e: files::Entry) -> FileEntry {
    FileEntry {
        name: e.name,
        kind: match e.kind {
            files::EntryType::File => FileType::File,
            files::EntryType::Dir => FileType::Dir,
            files::EntryType::Symlink => FileType::Symlink,
            files::EntryType::Other => FileType::Other,
        },
        size: e.size,
        mode: format!("{:o}", e.mode),
        modified: e.modified,
    }
}

/// `DELETE /v1/runs/{run}/files/{path}`: removes the file or link (never
/// its target), or the directory (`?recursive=true` when not empty).
#[utoipa::path(
    delete,
    path = "/v1/runs/{run}/files/{path}",
    tag = "files",
    params(FilePath, FileQuery),
    responses((status = 204, description = "Removed")),
)]
pub async fn delete_file(
    State(k): State<AppState>,
    principal: Principal,
    Seg(FilePath { run, path }): Seg<FilePath>,
    Params(q): Params<FileQuery>,
) -> ApiResult<StatusCode> {
    let (view, _gate) = open(&k, &principal, &run).await?;
    let recursive = q.recursive.unwrap_or(false);
    on_user(view, move |v| files::remove(v, &path, recursive)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/runs/{run}/archive/{dir}`: the directory as a tar stream
/// (links as links; `.ops` never in it).
#[utoipa::path(
    get,
    path = "/v1/runs/{run}/archive/{path}",
    tag = "files",
    params(FilePath),
    responses((status = 200, description = "A tar stream of the directory", content_type = "application/x-tar")),
)]
pub async fn get_archive(
    State(k): State<AppState>,
    principal: Principal,
    Seg(FilePath { run, path }): Seg<FilePath>,
) -> ApiResult<Response> {
    let (view, gate) = open(&k, &principal, &run).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(IN_FLIGHT);
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let user = view.user;
    std::mem::drop(files::as_user(user, move || {
        // the directory is checked before the answer starts
        match files::list(&view, &path) {
            Ok(_) => {
                let _ = ready_tx.send(Ok(()));
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return Ok(());
            }
        }
        let mut out = files::ChannelWriter::new(tx);
        let _gate = gate;
        match files::pack(&view, &path, &mut out) {
            Ok(_) => std::io::Write::flush(&mut out).map_err(|e| FileError::Aborted(e.to_string())),
            Err(e) => {
                out.fail(std::io::Error::other(e.to_string()));
                Ok(())
            }
        }
    }));
    ready_rx
        .await
        .map_err(|_| ApiError::internal("files: the archive thread ended early"))?
        .map_err(file_error)?;
    let body = RawBody::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok(([(header::CONTENT_TYPE, "application/x-tar")], body).into_response())
}

/// `PUT /v1/runs/{run}/archive/{dir}`: unpacks the tar stream of the body
/// into the directory (made when missing), at most
/// `OPKERNEL_FILE_MAX_BYTES` of file content.
#[utoipa::path(
    put,
    path = "/v1/runs/{run}/archive/{path}",
    tag = "files",
    params(FilePath),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "A tar stream (any content type is taken)"),
    responses((status = 200, description = "Unpacked", body = FileWrittenView)),
)]
pub async fn put_archive(
    State(k): State<AppState>,
    principal: Principal,
    Seg(FilePath { run, path }): Seg<FilePath>,
    headers: HeaderMap,
    body: RawBody,
) -> ApiResult<Json<FileWrittenView>> {
    let max = check_length(&k, &headers)?;
    let (view, _gate) = open(&k, &principal, &run).await?;
    let mut reader = feed(body);
    let target = path.clone();
    let done = on_user(view, move |v| files::unpack(v, &target, &mut reader, max)).await?;
    written(&k, &run, &path, done.bytes, done.entries).await
}
