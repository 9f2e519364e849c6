//! A file's bytes as an answer (SPEC §26): streamed from the open file,
//! one `Range` honoured (`206` with `Content-Range`, `416` outside it).

use axum::body::Body as RawBody;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::{ApiError, ApiResult};

/// The byte range `bytes=A-B`, `bytes=A-` or `bytes=-N` of a file of
/// `size` bytes: `Ok(None)` without a header, an error outside the file.
pub(super) fn range(headers: &HeaderMap, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(v) = headers.get(header::RANGE) else {
        return Ok(None);
    };
    let spec = v.to_str().map_err(drop)?.trim();
    let spec = spec.strip_prefix("bytes=").ok_or(())?;
    let (a, b) = spec.split_once('-').ok_or(())?;
    let (start, end) = match (a.trim(), b.trim()) {
        ("", n) => {
            let n: u64 = n.parse().map_err(drop)?;
            if n == 0 {
                return Err(());
            }
            (size.saturating_sub(n), size.saturating_sub(1))
        }
        (a, "") => (a.parse().map_err(drop)?, size.saturating_sub(1)),
        (a, b) => (
            a.parse().map_err(drop)?,
            b.parse::<u64>().map_err(drop)?.min(size.saturating_sub(1)),
        ),
    };
    if size == 0 || start > end || start >= size {
        return Err(());
    }
    Ok(Some((start, end)))
}

/// The answer of an opened file: whole, or the range asked for.
pub(super) async fn respond(
    opened: sandbox::files::Opened,
    headers: &HeaderMap,
) -> ApiResult<Response> {
    let size = opened.size;
    let Ok(asked) = range(headers, size) else {
        let mut answer = ApiError::new(
            StatusCode::RANGE_NOT_SATISFIABLE,
            "range_not_satisfiable",
            format!("the range is outside the file's {size} bytes"),
        )
        .into_response();
        if let Ok(v) = format!("bytes */{size}").parse() {
            answer.headers_mut().insert(header::CONTENT_RANGE, v);
        }
        return Ok(answer);
    };
    let mut file = tokio::fs::File::from_std(opened.file);
    let (start, len) = match asked {
        Some((start, end)) => (start, end - start + 1),
        None => (0, size),
    };
    if start > 0 {
        file.seek(std::io::SeekFrom::Start(start))
            .await
            .map_err(|e| ApiError::internal(format!("seek: {e}")))?;
    }
    let stream = tokio_util_stream(file.take(len));
    let mut answer = Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, len)
        .header(header::ACCEPT_RANGES, "bytes");
    if let Some((start, end)) = asked {
        answer = answer
            .status(StatusCode::PARTIAL_CONTENT)
            .header(header::CONTENT_RANGE, format!("bytes {start}-{end}/{size}"));
    }
    answer
        .body(RawBody::from_stream(stream))
        .map_err(|e| ApiError::internal(format!("file answer: {e}")))
}

/// The reader's bytes as a stream of chunks (256 KiB reads).
fn tokio_util_stream(
    mut reader: impl tokio::io::AsyncRead + Unpin + Send + 'static,
) -> impl futures::Stream<Item = std::io::Result<bytes::Bytes>> + Send {
    async_stream(move |tx| async move {
        let mut buf = vec![0u8; 256 << 10];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => {
                    if tx
                        .send(Ok(bytes::Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
    })
}

/// A stream fed by a task through a small channel.
fn async_stream<F, Fut>(f: F) -> impl futures::Stream<Item = std::io::Result<bytes::Bytes>> + Send
where
    F: FnOnce(tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(v: &str, size: u64) -> Result<Option<(u64, u64)>, ()> {
        let mut h = HeaderMap::new();
        h.insert(header::RANGE, v.parse().unwrap());
        range(&h, size)
    }

    #[test]
    fn ranges_inside_the_file_are_taken_and_others_refused() {
        assert_eq!(range(&HeaderMap::new(), 10), Ok(None));
        assert_eq!(of("bytes=2-4", 10), Ok(Some((2, 4))));
        assert_eq!(of("bytes=2-", 10), Ok(Some((2, 9))));
        assert_eq!(of("bytes=-3", 10), Ok(Some((7, 9))));
        assert_eq!(of("bytes=5-100", 10), Ok(Some((5, 9))));
        for bad in [
            "bytes=10-",
            "bytes=4-2",
            "items=1-2",
            "bytes=-0",
            "bytes=x-1",
        ] {
            assert_eq!(of(bad, 10), Err(()), "{bad}");
        }
        assert_eq!(of("bytes=0-", 0), Err(()));
    }
}
