//! A unix-socket proxy in front of the Docker socket that a drill can cut
//! (the kernel sees the daemon as unreachable) and restore, without touching
//! the real daemon.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;

pub struct DockerProxy {
    path: PathBuf,
    upstream: PathBuf,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl DockerProxy {
    pub fn start(path: &Path, upstream: &Path) -> std::io::Result<DockerProxy> {
        let proxy = DockerProxy {
            path: path.to_owned(),
            upstream: upstream.to_owned(),
            tasks: Arc::default(),
        };
        proxy.listen()?;
        Ok(proxy)
    }

    pub fn socket(&self) -> &Path {
        &self.path
    }

    fn listen(&self) -> std::io::Result<()> {
        let _ = std::fs::remove_file(&self.path);
        let listener = UnixListener::bind(&self.path)?;
        let upstream = self.upstream.clone();
        let tasks = self.tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let conn = tokio::spawn(async move {
                    if let Ok(mut server) = UnixStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                if let Ok(mut t) = tasks.lock() {
                    t.retain(|h| !h.is_finished());
                    t.push(conn);
                }
            }
        });
        if let Ok(mut t) = self.tasks.lock() {
            t.push(accept);
        }
        Ok(())
    }

    /// Cuts every connection and stops answering: connects fail.
    pub fn cut(&self) {
        if let Ok(mut t) = self.tasks.lock() {
            for h in t.drain(..) {
                h.abort();
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }

    pub fn restore(&self) -> std::io::Result<()> {
        self.listen()
    }
}

impl Drop for DockerProxy {
    fn drop(&mut self) {
        self.cut();
    }
}
