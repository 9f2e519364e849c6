//! The files API as tools for a model (SPEC §26): `read_file` (a bounded
//! slice, text or base64), `write_file` (a whole small file) and
//! `list_dir`, JSON in and out, each a call of the same view as
//! `files.rs` (MCP calls these).

use std::io::{Read, Seek};

use axum::extract::State;
use axum::Json;
use base64::Engine;

use super::files::{entry_view, on_user, open, parse_mode, written};
use super::{ApiError, ApiResult, AppState, Body, Seg};
use crate::surfaces::auth::Principal;
use crate::surfaces::requests::{Encoding, ListDir, ReadFile, WriteFile};
use crate::surfaces::views::{FileContent, FileList, FileWrittenView};

/// Longest slice `read_file` returns.
const MAX_SLICE: u64 = 1 << 20;

/// `POST /v1/runs/{run}/tools/read_file`: at most `length` bytes of a
/// file from `offset`, with where the next slice starts.
#[utoipa::path(
    post,
    path = "/v1/runs/{run}/tools/read_file",
    tag = "files",
    params(super::params::RunPath),
    request_body = ReadFile,
    responses((status = 200, description = "Success", body = FileContent)),
)]
pub async fn read_file(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    Body(req): Body<ReadFile>,
) -> ApiResult<Json<FileContent>> {
    let length = req.length.unwrap_or(64 << 10);
    if !(1..=MAX_SLICE).contains(&length) {
        return Err(ApiError::bad_request(format!(
            "length must be 1 to {MAX_SLICE}"
        )));
    }
    let offset = req.offset.unwrap_or(0);
    let (view, _gate) = open(&k, &principal, &run).await?;
    let path = req.path.clone();
    let (size, bytes) = on_user(view, move |v| {
        let mut opened = sandbox::files::read(v, &path)?;
        let io = |e: std::io::Error| sandbox::files::FileError::Aborted(e.to_string());
        opened
            .file
            .seek(std::io::SeekFrom::Start(offset))
            .map_err(io)?;
        let mut bytes = Vec::new();
        opened
            .file
            .take(length)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        Ok((opened.size, bytes))
    })
    .await?;
    let next_offset = offset.min(size) + bytes.len() as u64;
    let (encoding, content) = match req.encoding.unwrap_or(Encoding::Text) {
        Encoding::Text => ("text", String::from_utf8_lossy(&bytes).into_owned()),
        Encoding::Base64 => (
            "base64",
            base64::engine::general_purpose::STANDARD.encode(&bytes),
        ),
    };
    Ok(Json(FileContent {
        path: format!("/{}", req.path.trim_start_matches('/')),
        size,
        offset,
        next_offset,
        eof: next_offset >= size,
        encoding: encoding.to_owned(),
        content,
    }))
}

/// `POST /v1/runs/{run}/tools/write_file`: writes a whole file from
/// `text` or `data_base64` (within the API's body limit).
#[utoipa::path(
    post,
    path = "/v1/runs/{run}/tools/write_file",
    tag = "files",
    params(super::params::RunPath),
    request_body = WriteFile,
    responses((status = 200, description = "Success", body = FileWrittenView)),
)]
pub async fn write_file(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    Body(req): Body<WriteFile>,
) -> ApiResult<Json<FileWrittenView>> {
    let data = match (&req.text, &req.data_base64) {
        (Some(text), None) => text.clone().into_bytes(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| ApiError::bad_request(format!("data_base64: {e}")))?,
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of text and data_base64",
            ))
        }
    };
    let mode = parse_mode(req.mode.as_deref())?;
    let (view, _gate) = open(&k, &principal, &run).await?;
    let (path, max) = (req.path.clone(), k.config.file_max_bytes);
    let bytes = on_user(view, move |v| {
        sandbox::files::write(v, &path, mode, &mut &data[..], max)
    })
    .await?;
    written(&k, &run, &req.path, bytes, 1).await
}

/// `POST /v1/runs/{run}/tools/list_dir`: a directory's entries (default
/// `/scratch`).
#[utoipa::path(
    post,
    path = "/v1/runs/{run}/tools/list_dir",
    tag = "files",
    params(super::params::RunPath),
    request_body = ListDir,
    responses((status = 200, description = "Success", body = FileList)),
)]
pub async fn list_dir(
    State(k): State<AppState>,
    principal: Principal,
    Seg(run): Seg<String>,
    Body(req): Body<ListDir>,
) -> ApiResult<Json<FileList>> {
    let path = req.path.unwrap_or_else(|| "/scratch".to_owned());
    let (view, _gate) = open(&k, &principal, &run).await?;
    let target = path.clone();
    let entries = on_user(view, move |v| sandbox::files::list(v, &target)).await?;
    Ok(Json(FileList {
        path: format!("/{}", path.trim_start_matches('/')),
        entries: entries.into_iter().map(entry_view).collect(),
    }))
}
