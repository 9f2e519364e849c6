//! A unix-socket proxy in front of the Docker socket that a drill can cut
//! (the kernel sees the daemon as unreachable) and restore, or that holds
//! chosen requests (a slow daemon), without touching the real daemon.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What happens to a request the proxy holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Requests pass.
    Off,
    /// Requests whose request line contains every one of these substrings
    /// wait (the daemon is slow to answer them).
    Matching(Vec<String>),
    /// Held requests go on to the daemon now.
    Release,
    /// Held requests are dropped with their connection: the daemon never
    /// sees them.
    Drop,
}

/// A listening proxy at `path` that relays each connection to the real Docker
/// socket.
pub struct DockerProxy {
    path: PathBuf,
    upstream: PathBuf,
    tasks: Arc<crate::base::sync::Lock<Vec<JoinHandle<()>>>>,
    hold: watch::Sender<Hold>,
}

impl DockerProxy {
    /// Listens at `path` (replacing any file there) and relays to `upstream`.
    pub fn start(path: &Path, upstream: &Path) -> std::io::Result<DockerProxy> {
        let proxy = DockerProxy {
            path: path.to_owned(),
            upstream: upstream.to_owned(),
            tasks: Arc::default(),
            hold: watch::channel(Hold::Off).0,
        };
        proxy.listen()?;
        Ok(proxy)
    }

    /// The proxy's socket: the kernel's `OPKERNEL_DOCKER_SOCKET` in the drill.
    pub fn socket(&self) -> &Path {
        &self.path
    }

    /// Holds every later request whose request line contains all of `parts`
    /// (e.g. `["/exec/", "/start"]`) until [`Hold::Release`] or [`Hold::Drop`].
    pub fn hold(&self, parts: &[&str]) {
        let parts = parts.iter().map(|p| (*p).to_owned()).collect();
        self.hold.send_replace(Hold::Matching(parts));
    }

    /// Lets held requests go on (`Release`) or drops them (`Drop`); later
    /// requests pass.
    pub fn end_hold(&self, how: Hold) {
        self.hold.send_replace(how);
    }

    fn listen(&self) -> std::io::Result<()> {
        let _ = std::fs::remove_file(&self.path);
        let listener = UnixListener::bind(&self.path)?;
        let upstream = self.upstream.clone();
        let tasks = self.tasks.clone();
        let hold = self.hold.subscribe();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let hold = hold.clone();
                let conn = tokio::spawn(async move {
                    if let Ok(server) = UnixStream::connect(&upstream).await {
                        relay(client, server, hold).await;
                    }
                });
                let mut t = tasks.lock();
                t.retain(|h| !h.is_finished());
                t.push(conn);
            }
        });
        self.tasks.lock().push(accept);
        Ok(())
    }

    /// Cuts every connection and stops answering: connects fail.
    pub fn cut(&self) {
        for h in self.tasks.lock().drain(..) {
            h.abort();
        }
        let _ = std::fs::remove_file(&self.path);
    }

    /// Listens again after a [`DockerProxy::cut`]: new connections reach the
    /// daemon.
    pub fn restore(&self) -> std::io::Result<()> {
        self.listen()
    }
}

/// Copies both ways; a client write that starts a held request waits for
/// the hold to end (HTTP/1.1 clients send one request at a time per
/// connection, each starting with its request line).
async fn relay(client: UnixStream, server: UnixStream, mut hold: watch::Receiver<Hold>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let down = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match client_rx.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let line = String::from_utf8_lossy(&buf[..n.min(512)]);
        let line = line.lines().next().unwrap_or_default().to_owned();
        let held = matches!(&*hold.borrow_and_update(), Hold::Matching(parts) if parts.iter().all(|p| line.contains(p.as_str())));
        if held {
            let ended = hold
                .wait_for(|h| matches!(h, Hold::Release | Hold::Drop | Hold::Off))
                .await
                .map(|h| h.clone());
            if !matches!(ended, Ok(Hold::Release | Hold::Off)) {
                break;
            }
        }
        if server_tx.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    down.abort();
}

impl Drop for DockerProxy {
    fn drop(&mut self) {
        self.cut();
    }
}
