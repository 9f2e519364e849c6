//! `opkernel serve`: read the settings, take the home, recover, then
//! serve the API and MCP (composed here, above both) until a signal.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

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
    serve(config, |addr| {
        eprintln!(
            "opkernel listening on http://{addr} (home {})",
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
        served = axum::serve(listener, app(kernel.clone())) => served?,
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
