//! Bytes both ways between a container's connection and its target, each
//! chunk counted for the run as it passes (so a long tunnel's usage is
//! recorded while it lasts), and the pair closed once nothing moved
//! either way for [`IDLE`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a connection may move nothing either way.
pub(super) const IDLE: Duration = Duration::from_secs(600);

/// One direction until its end: returns the bytes moved.
async fn pump<R, W>(
    mut from: R,
    mut to: W,
    began: Instant,
    last: &AtomicU64,
    count: impl Fn(u64),
) -> u64
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 64 << 10];
    let mut moved = 0;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        moved += n as u64;
        count(n as u64);
        last.store(began.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    // the other side learns this one ended; the other direction goes on
    let _ = to.shutdown().await;
    moved
}

/// Relays until both directions end or the pair is idle for [`IDLE`]:
/// `count(in, out)` is told of each chunk (in: to the container).
pub(super) async fn relay(client: TcpStream, target: TcpStream, count: impl Fn(u64, u64)) {
    let (client_read, client_write) = client.into_split();
    let (target_read, target_write) = target.into_split();
    let began = Instant::now();
    let last = AtomicU64::new(0);
    let out = pump(client_read, target_write, began, &last, |n| count(0, n));
    let back = pump(target_read, client_write, began, &last, |n| count(n, 0));
    let idle = async {
        loop {
            let quiet = began
                .elapsed()
                .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
            if quiet >= IDLE {
                return;
            }
            tokio::time::sleep(IDLE - quiet).await;
        }
    };
    tokio::select! {
        _ = async { tokio::join!(out, back) } => {}
        () = idle => {}
    }
}
