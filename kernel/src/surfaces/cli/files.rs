//! `opkernel cp` and `opkernel ls` (SPEC §26): files and directories
//! between this machine and a run's container, `RUN:PATH` on either side
//! (docker cp's convention); streamed both ways through the files API.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use bytes::Bytes;
use futures::StreamExt;
use reqwest::Method;

use super::client::Client;
use crate::surfaces::views::{FileList, FileType};

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Side {
    /// A path of this machine.
    Local(PathBuf),
    /// `RUN:PATH`: a path in a run's container.
    Remote { run: String, path: String },
}

/// `RUN:PATH` (a run id, then an absolute container path) or a local path.
fn side(arg: &str) -> Side {
    match arg.split_once(':') {
        Some((run, path))
            if path.starts_with('/') && sandbox::profile::validate_run_id(run).is_ok() =>
        {
            Side::Remote {
                run: run.to_owned(),
                path: path.to_owned(),
            }
        }
        _ => Side::Local(PathBuf::from(arg)),
    }
}

fn last_name(path: &str) -> String {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// `opkernel cp SRC DST`: a file or a directory, either way. A
/// destination ending in `/` (or an existing local directory) receives
/// the source under its own name.
pub async fn cp(client: &Client, src: &str, dst: &str) -> anyhow::Result<i32> {
    match (side(src), side(dst)) {
        (Side::Remote { run, path }, Side::Local(local)) => {
            download(client, &run, &path, &local).await
        }
        (Side::Local(local), Side::Remote { run, path }) => {
            upload(client, &local, &run, &path).await
        }
        _ => bail!("one side of cp is RUN:/path (a run's container), the other a local path"),
    }
}

fn api_path(path: &str) -> String {
    path.trim_start_matches('/').to_owned()
}

async fn upload(client: &Client, local: &Path, run: &str, path: &str) -> anyhow::Result<i32> {
    let meta = std::fs::metadata(local).with_context(|| format!("{}", local.display()))?;
    let name = local
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let target = if path.ends_with('/') {
        format!("{path}{name}")
    } else {
        path.to_owned()
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(8);
    let local = local.to_path_buf();
    let dir = meta.is_dir();
    tokio::task::spawn_blocking(move || {
        let mut out = sandbox::files::ChannelWriter::new(tx);
        let done = if dir {
            let mut b = tar::Builder::new(&mut out);
            b.follow_symlinks(false);
            b.append_dir_all(".", &local).and_then(|()| b.finish())
        } else {
            std::fs::File::open(&local).and_then(|mut f| std::io::copy(&mut f, &mut out).map(drop))
        };
        match done.and_then(|()| std::io::Write::flush(&mut out)) {
            Ok(()) => {}
            Err(e) => out.fail(e),
        }
    });
    let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let kind = if dir { "archive" } else { "files" };
    let answer: serde_json::Value = client
        .raw(
            Method::PUT,
            &format!("/v1/runs/{run}/{kind}/{}", api_path(&target)),
            Some(body),
        )
        .await?
        .json()
        .await?;
    println!("{} bytes to {run}:{target}", answer["bytes"]);
    Ok(0)
}

async fn download(client: &Client, run: &str, path: &str, local: &Path) -> anyhow::Result<i32> {
    let list = client
        .raw(
            Method::GET,
            &format!(
                "/v1/runs/{run}/files/{}/",
                api_path(path).trim_end_matches('/')
            ),
            None,
        )
        .await;
    let target = if local.is_dir() {
        local.join(last_name(path))
    } else {
        local.to_path_buf()
    };
    let is_dir = list.is_ok();
    let kind = if is_dir { "archive" } else { "files" };
    let answer = client
        .raw(
            Method::GET,
            &format!(
                "/v1/runs/{run}/{kind}/{}",
                api_path(path).trim_end_matches('/')
            ),
            None,
        )
        .await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(8);
    let dest = target.clone();
    let writer = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut input = sandbox::files::ChannelReader::new(rx);
        if is_dir {
            std::fs::create_dir_all(&dest)?;
            tar::Archive::new(input).unpack(&dest)
        } else {
            std::io::copy(&mut input, &mut std::fs::File::create(&dest)?).map(drop)
        }
    });
    let mut stream = answer.bytes_stream();
    while let Some(chunk) = stream.next().await {
        if tx.send(chunk.map_err(std::io::Error::other)).await.is_err() {
            break;
        }
    }
    drop(tx);
    writer
        .await?
        .with_context(|| format!("{}", target.display()))?;
    println!("{run}:{path} to {}", target.display());
    Ok(0)
}

/// `opkernel ls RUN:PATH`: a directory's entries.
pub async fn ls(client: &Client, target: &str, json: bool) -> anyhow::Result<i32> {
    let Side::Remote { run, path } = side(target) else {
        bail!("ls takes RUN:/path");
    };
    let dir = api_path(&path);
    let list: FileList = client
        .get_as(&format!(
            "/v1/runs/{run}/files/{}/",
            dir.trim_end_matches('/')
        ))
        .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    for e in &list.entries {
        let kind = match e.kind {
            FileType::Dir => 'd',
            FileType::Symlink => 'l',
            FileType::File => '-',
            FileType::Other => '?',
        };
        println!("{kind} {:>4} {:>12} {}", e.mode, e.size, e.name);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_follow_docker_cps_convention() {
        assert_eq!(
            side("r1:/scratch/a"),
            Side::Remote {
                run: "r1".into(),
                path: "/scratch/a".into()
            }
        );
        assert_eq!(side("./r1:x"), Side::Local(PathBuf::from("./r1:x")));
        assert_eq!(side("c:relative"), Side::Local(PathBuf::from("c:relative")));
        assert_eq!(last_name("/scratch/dir/"), "dir");
    }
}
