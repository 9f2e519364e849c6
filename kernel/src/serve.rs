//! `opkernel serve`: take the home, recover, then serve HTTP.

use std::net::SocketAddr;

use crate::config::Config;
use crate::kernel::Kernel;

/// Opens the kernel, re-attaches every live op, and serves until the
/// process ends. `on_ready` gets the bound address.
pub async fn serve(config: Config, on_ready: impl FnOnce(SocketAddr)) -> anyhow::Result<()> {
    let listen = config.listen;
    let kernel = Kernel::open(config).await?;
    let started = std::time::Instant::now();
    let attached = crate::observer::recover(&kernel).await?;
    tracing::info!(attached, ms = started.elapsed().as_millis() as u64, kernel = %kernel.id, "recovered live ops");
    kernel.spawn_housekeeping();
    crate::reaper::spawn_periodic(kernel.clone());
    let listener = tokio::net::TcpListener::bind(listen).await?;
    on_ready(listener.local_addr()?);
    axum::serve(listener, crate::api::router(kernel)).await?;
    Ok(())
}
