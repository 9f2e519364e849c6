//! The API over TLS (SPEC §29): a listener whose connections are already
//! through their handshake, each made in a task of its own (a slow or
//! silent client holds nobody else up), with the certificate re-read on
//! SIGHUP for new connections while open ones go on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;

use crate::base::tls::ServerTls;

/// How long a client has for its handshake.
const HANDSHAKE: Duration = Duration::from_secs(5);
/// Handshakes under way at once; past it new connections wait in the
/// kernel's accept queue (a client holding this many silent sockets
/// delays others by at most the handshake's bound each time).
const HANDSHAKES: usize = 1024;

/// Connections through their handshake, for `axum::serve`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `tcp` with `tls`'s current certificate from now on.
    pub fn new(tcp: TcpListener, tls: Arc<ServerTls>) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(accept_loop(tcp, tls, tx));
        Ok(TlsListener { ready, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // the accept loop ended (its listener failed for good)
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Accepts connections and hands each to a handshake task; ends when the
/// server side of the channel is gone.
async fn accept_loop(
    tcp: TcpListener,
    tls: Arc<ServerTls>,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let slots = Arc::new(Semaphore::new(HANDSHAKES));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let accepted = tokio::select! {
            accepted = tcp.accept() => accepted,
            // the server is gone: the port goes with this loop
            () = tx.closed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                // e.g. out of descriptors: a pause instead of a busy loop
                tracing::warn!(%e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
        let tx = tx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                Ok(Ok(conn)) => {
                    let _ = tx.send((conn, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, %e, "TLS handshake refused"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// Re-reads the certificate and key on every SIGHUP; a pair that does not
/// load leaves the old one in force (and says why). Without TLS a SIGHUP
/// is only logged: it never stops the kernel.
pub fn reload_on_hangup(tls: Option<Arc<ServerTls>>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hangup) = signal(SignalKind::hangup()) else {
        tracing::warn!("no SIGHUP handler: the certificate is read at start only");
        return;
    };
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            let Some(tls) = &tls else {
                tracing::info!("SIGHUP: no TLS certificate to read again");
                continue;
            };
            match tls.reload() {
                Ok(()) => tracing::info!("SIGHUP: TLS certificate and key read again"),
                Err(e) => {
                    tracing::error!(%e, "SIGHUP: the new certificate does not load; the old one stays")
                }
            }
        }
    });
}
