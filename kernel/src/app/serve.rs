//! `opkernel serve`: read the settings, take the home, recover, then
//! serve the API and MCP (composed here, above both) until a signal.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::base::tls::ServerTls;
use crate::runtime::config::Config;
use crate::runtime::kernel::Kernel;

/// `opkernel serve` with its flags (by variable name) over the
/// environment.
pub async fn run(flags: BTreeMap<&'static str, String>) -> anyhow::Result<i32> {
    let config = super::settings::load::from_env(flags);
    if !config.listen.ip().is_loopback() && config.invalid.is_empty() {
        tracing::warn!(listen = %config.listen, "listening on a non-loopback address: anyone who can reach it and holds a token can run commands");
    }
    let home = config.home.clone();
    let scheme = if config.tls.server.is_some() {
        "https"
    } else {
        "http"
    };
    serve(config, |addr| {
        eprintln!(
            "opkernel listening on {scheme}://{addr} (home {})",
            home.display()
        );
    })
    .await
    .map_err(|e| e.context("kernel stopped"))?;
    Ok(0)
}

/// Opens the kernel, re-attaches every live op, and serves until the
/// process ends. `on_ready` gets the bound address.
pub async fn serve(config: Config, on_ready: impl FnOnce(SocketAddr)) -> anyhow::Result<()> {
    let listen = config.listen;
    let tls = transport(&config)?;
    let kernel = Kernel::open(config).await?;
    crate::runtime::node::join(&kernel).await?;
    // after the join: two nodes starting together see each other's lease
    // (a refused node drains itself first: nothing is placed on it)
    crate::runtime::node::agree_settings(&kernel).await?;
    // the operator's declared schedules, before any schedule can fire
    if let Err(e) = crate::runtime::scheduler::reconcile_declared(&kernel).await {
        crate::runtime::node::lapse(&kernel).await;
        return Err(e);
    }
    // a node's lease is kept from here on, whatever else is under way
    let (keeping, keep) = crate::base::sync::Stop::new();
    tokio::spawn(crate::runtime::node::keep_lease(kernel.clone(), keep));
    let started = std::time::Instant::now();
    crate::runtime::workspace::thaw_all(&kernel).await;
    // the proxy again for allow-list containers made before this start
    kernel.egress_resume().await;
    let attached = crate::runtime::observer::recover(&kernel).await?;
    tracing::info!(attached, ms = started.elapsed().as_millis() as u64, kernel = %kernel.id, "recovered live ops");
    let housekeeping = crate::runtime::housekeeping::Housekeeping::start(&kernel).await?;
    let listener = tokio::net::TcpListener::bind(listen).await?;
    if let Some(addr) = kernel.config.metrics_listen {
        let open = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("OPKERNEL_METRICS_LISTEN {addr}: {e}"))?;
        tracing::info!(%addr, "metrics listener (no token) serves /metrics");
        let routes = crate::surfaces::api::metrics::open_router(kernel.clone());
        tokio::spawn(async move { axum::serve(open, routes).await });
    }
    on_ready(listener.local_addr()?);
    tokio::select! {
        served = serve_api(listener, tls, app(kernel.clone())) => served?,
        signal = stop_signal() => {
            tracing::info!(signal, "stopping: the scheduler records its batch under way, the other loops stop at once");
        }
        reason = kernel.store_taken() => {
            // at once: nothing of this kernel's may act beside the new owner
            tracing::error!(%reason, "stopping at once: this kernel no longer owns its control plane");
            anyhow::bail!(reason);
        }
    }
    // commands keep running in their containers; the next start re-attaches.
    // The warm pool's free containers go (they serve no run).
    // A second signal ends the wait for the scheduler's batch at once.
    tokio::select! {
        () = housekeeping.stop() => crate::runtime::pool::upkeep::drain(&kernel).await,
        signal = stop_signal() => tracing::warn!(signal, "second signal: stopping now"),
    }
    let _ = keeping.send(true);
    Ok(())
}

/// The TLS of this kernel's own calls (its peers' CA) and of its API (the
/// certificate, re-read on SIGHUP); a warning for a node that others
/// reach in plain text over a network.
fn transport(config: &Config) -> anyhow::Result<Option<Arc<ServerTls>>> {
    if let Some(ca) = &config.tls.ca {
        crate::base::tls::trust(ca)?;
    }
    if let Some(node) = &config.node {
        let https = node.advertise_url.starts_with("https://");
        if https != config.tls.server.is_some() {
            anyhow::bail!(
                "--advertise {} but the API is served over {}: other nodes could not reach this one",
                node.advertise_url,
                if https { "plain http (no OPKERNEL_TLS_CERT)" } else { "TLS" }
            );
        }
        if plain_over_network(&node.advertise_url) {
            tracing::warn!(advertise = %node.advertise_url, "this node is reached over plain http from other hosts: bearer tokens cross the network in clear (serve TLS with OPKERNEL_TLS_CERT and OPKERNEL_TLS_KEY)");
        }
    }
    let tls = match &config.tls.server {
        Some((cert, key)) => Some(Arc::new(ServerTls::load(cert, key)?)),
        None => None,
    };
    super::tls::reload_on_hangup(tls.clone());
    Ok(tls)
}

/// Whether `url` is `http://` to a host other than loopback.
pub fn plain_over_network(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', '?']).next().unwrap_or_default();
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    !loopback
}

/// The API on `listener`, over TLS when the kernel has a certificate.
async fn serve_api(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<ServerTls>>,
    app: axum::Router,
) -> std::io::Result<()> {
    match tls {
        Some(tls) => axum::serve(super::tls::TlsListener::new(listener, tls)?, app).await,
        None => axum::serve(listener, app).await,
    }
}

/// Resolves on SIGTERM or SIGINT, naming it.
async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // no handler: the default action (exit) stays in force
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// Everything served over HTTP: the API, and MCP beside it. MCP calls the
/// API router itself: one definition of every tool.
pub fn app(kernel: Arc<Kernel>) -> axum::Router {
    let api = crate::surfaces::api::router(kernel.clone());
    let mcp = crate::surfaces::mcp::http::routes(kernel, api.clone());
    api.merge(mcp)
}

#[cfg(test)]
mod tests {
    #[test]
    fn plain_http_to_another_host_is_told_apart_from_loopback() {
        for (url, warned) in [
            ("http://10.0.0.2:7878", true),
            ("http://n1:7700/", true),
            ("http://127.0.0.1:7878", false),
            ("http://localhost:7878", false),
            ("http://[::1]:7878", false),
            ("https://10.0.0.2:7878", false),
        ] {
            assert_eq!(super::plain_over_network(url), warned, "{url}");
        }
    }
}
