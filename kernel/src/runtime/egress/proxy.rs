//! One connection to the egress proxy: its first request's head read, its
//! run known by its source address, its target judged by the run's allow
//! list as the control plane holds it now, then a tunnel (`CONNECT`) or
//! the request sent on in origin form, bytes counted both ways.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::egress::{parse_ask, ProxyAsk};
use crate::runtime::kernel::Kernel;

/// Longest request head the proxy reads.
const MAX_HEAD: usize = 16 << 10;
/// How long a client has to send its head, and a target to answer.
const HEAD_WAIT: Duration = Duration::from_secs(30);
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// Accepts connections while the kernel lives.
pub(super) async fn serve(k: Weak<Kernel>, listener: TcpListener) {
    loop {
        let accepted = listener.accept().await;
        let Some(kernel) = k.upgrade() else {
            return;
        };
        match accepted {
            Ok((sock, peer)) => {
                tokio::spawn(async move { handle(kernel, sock, peer).await });
            }
            Err(e) => {
                tracing::warn!(%e, "egress proxy: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Reads up to the end of the head; the head and what came after it.
async fn read_head(sock: &mut TcpStream) -> Result<(String, Vec<u8>), &'static str> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            let head = String::from_utf8(buf).map_err(|_| "a request head is text")?;
            return Ok((head, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err("a request head over 16 KiB");
        }
        let n = sock
            .read(&mut chunk)
            .await
            .map_err(|_| "the connection failed")?;
        if n == 0 {
            return Err("the connection closed before its request head");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Answers `status` with a text body and closes.
async fn answer(sock: &mut TcpStream, status: &str, body: &str) {
    let text = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}\n",
        body.len() + 1
    );
    let _ = sock.write_all(text.as_bytes()).await;
    let _ = sock.shutdown().await;
}

async fn handle(k: Arc<Kernel>, mut sock: TcpStream, peer: SocketAddr) {
    let Some(_slot) = k.egress.peers.admit(peer.ip()) else {
        k.store.metrics().egress("busy");
        return;
    };
    let Some(run) = super::peers::run_of(&k, peer.ip()).await else {
        k.store.metrics().egress("unknown");
        let why = format!(
            "opkernel egress proxy: {} is no run container of this kernel",
            peer.ip()
        );
        return answer(&mut sock, "403 Forbidden", &why).await;
    };
    let read = tokio::time::timeout(HEAD_WAIT, read_head(&mut sock)).await;
    let asked = match read {
        Ok(Ok((head, early))) => parse_ask(head.split("\r\n").next().unwrap_or_default())
            .map(|ask| (ask, head, early))
            .map_err(|e| format!("opkernel egress proxy: {e}")),
        Ok(Err(why)) => Err(why.to_owned()),
        Err(_) => Err("no whole request head in 30 s".to_owned()),
    };
    let (ask, head, early) = match asked {
        Ok(asked) => asked,
        Err(why) => {
            k.store.metrics().egress("invalid");
            return answer(&mut sock, "400 Bad Request", &why).await;
        }
    };
    let (host, port) = match &ask {
        ProxyAsk::Connect { host, port } | ProxyAsk::Forward { host, port, .. } => {
            (host.clone(), *port)
        }
    };
    if let Err(why) = allowed(&k, &run, &host, port).await {
        return deny(&k, &mut sock, &run, &host, port, &why).await;
    }
    let mut upstream = match connect(&k, &run, &host, port).await {
        Ok(up) => up,
        Err(Unreached::Policy(why)) => return deny(&k, &mut sock, &run, &host, port, &why).await,
        Err(Unreached::Failed(why)) => {
            k.store.metrics().egress("failed");
            return answer(&mut sock, "502 Bad Gateway", &why).await;
        }
    };
    k.store.metrics().egress("allowed");
    k.egress.tally.connection(&run);
    let count = |i: u64, o: u64| {
        k.egress.tally.bytes(&run, i, o);
        k.store.metrics().egress_bytes(i, o);
    };
    let sent = match &ask {
        ProxyAsk::Connect { .. } => {
            let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
            sock.write_all(established).await
        }
        ProxyAsk::Forward { request_line, .. } => {
            let head = origin_head(request_line, &host, port, &head);
            count(0, head.len() as u64);
            upstream.write_all(head.as_bytes()).await
        }
    };
    if sent.is_err() || (!early.is_empty() && upstream.write_all(&early).await.is_err()) {
        return;
    }
    count(0, early.len() as u64);
    super::relay::relay(sock, upstream, count).await;
}

/// Refuses a connection by the run's policy: counted, its event recorded
/// (at most one a minute per run and host), `403` with the policy's words.
async fn deny(k: &Kernel, sock: &mut TcpStream, run: &str, host: &str, port: u16, why: &str) {
    k.store.metrics().egress("denied");
    if k.egress.tally.record_denial(run, host) {
        let event = crate::event_kind::EventKind::NetDenied(crate::event_kind::NetDenied {
            host: host.to_owned(),
            port,
        });
        if let Err(e) = k.store.record_run_event(run, event).await {
            tracing::warn!(%run, %e, "net.denied not recorded");
        }
    }
    answer(sock, "403 Forbidden", why).await
}

/// Whether the run's allow list, as the control plane has it now, allows
/// `host:port`; else the refusal's text, naming the policy.
async fn allowed(k: &Kernel, run: &str, host: &str, port: u16) -> Result<(), String> {
    let record = k
        .store
        .get_run(run)
        .await
        .map_err(|e| format!("opkernel egress proxy: the control plane did not answer: {e}"))?;
    let list = record
        .and_then(|r| r.envelope)
        .and_then(|e| e.network.allow_list());
    match list {
        Some(list) if list.allows(host, port) => Ok(()),
        Some(list) => Err(format!(
            "opkernel egress policy of run {run}: {host}:{port} is not in its allow list [{}]",
            list.to_strings().join(", ")
        )),
        None => Err(format!(
            "opkernel egress policy of run {run}: the run has no allow list"
        )),
    }
}

/// Why a target was not reached.
enum Unreached {
    /// The policy refuses it (a name resolving to a private address).
    Policy(String),
    /// DNS or the target failed.
    Failed(String),
}

/// The address to connect to for `host`: from the test-only host map or
/// the name itself (the operator's own words, taken as they are), else by
/// DNS done here, a public IPv4 address unless `OPKERNEL_EGRESS_PRIVATE`.
async fn address(k: &Kernel, run: &str, host: &str, port: u16) -> Result<Ipv4Addr, Unreached> {
    if let Some(addr) = k.config.egress.hosts.get(host) {
        return Ok(*addr);
    }
    if let Ok(addr) = host.parse() {
        return Ok(addr);
    }
    let v4 = super::resolve::resolve(host, port)
        .await
        .map_err(Unreached::Failed)?;
    let private = k.config.egress.private;
    let usable = |a: &&Ipv4Addr| {
        crate::egress::is_public(**a) || (private && !crate::egress::is_never_reached(**a))
    };
    match (v4.iter().find(usable), v4.first()) {
        (Some(addr), _) => Ok(*addr),
        (None, Some(addr)) => Err(Unreached::Policy(format!(
            "opkernel egress policy of run {run}: {host} resolves to {addr}, not a public address (an operator allows such names with OPKERNEL_EGRESS_PRIVATE=on, or lists the address itself)"
        ))),
        (None, None) => Err(Unreached::Failed(format!(
            "opkernel egress proxy: {host} has no IPv4 address"
        ))),
    }
}

/// A connection to `host:port` within [`CONNECT_WAIT`].
async fn connect(k: &Kernel, run: &str, host: &str, port: u16) -> Result<TcpStream, Unreached> {
    let addr = address(k, run, host, port).await?;
    tokio::time::timeout(CONNECT_WAIT, TcpStream::connect((addr, port)))
        .await
        .map_err(|_| {
            Unreached::Failed(format!(
                "opkernel egress proxy: {host}:{port} did not answer in 10 s"
            ))
        })?
        .map_err(|e| Unreached::Failed(format!("opkernel egress proxy: {host}:{port}: {e}")))
}

/// The head sent to the origin: the request line in origin form, `Host`
/// as judged, the client's other headers but the proxy's own, and
/// `Connection: close` (one request per judged connection).
fn origin_head(request_line: &str, host: &str, port: u16, head: &str) -> String {
    let mut out = match port {
        80 => format!("{request_line}\r\nHost: {host}\r\n"),
        _ => format!("{request_line}\r\nHost: {host}:{port}\r\n"),
    };
    for line in head.split("\r\n").skip(1).filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim();
        let hop = [
            "host",
            "proxy-connection",
            "proxy-authorization",
            "connection",
            "keep-alive",
        ];
        if !hop.iter().any(|h| name.eq_ignore_ascii_case(h)) {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_origin_head_drops_the_proxys_headers() {
        let head = "GET http://h/x HTTP/1.1\r\nHost: other\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n";
        assert_eq!(
            super::origin_head("GET /x HTTP/1.1", "h", 80, head),
            "GET /x HTTP/1.1\r\nHost: h\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        assert!(super::origin_head("GET / HTTP/1.1", "h", 8080, head).contains("Host: h:8080\r\n"));
    }
}
