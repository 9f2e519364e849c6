//! `opkernel serve`: the daemon's own verb.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};

use super::client::default_home;

/// How `opkernel serve` was asked to run.
#[derive(Debug)]
pub struct ServeArgs {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Kernel home (default: `$OPKERNEL_HOME` or `~/.opkernel`).
    pub home: Option<PathBuf>,
    /// Whether a non-loopback `listen` is allowed.
    pub allow_remote: bool,
    /// `--store`: overrides `OPKERNEL_STORE`.
    pub store: Option<String>,
    /// `--node NAME --advertise URL`: overrides `OPKERNEL_NODE` and
    /// `OPKERNEL_ADVERTISE`.
    pub node: Option<(String, String)>,
    /// Whether the drills' fault hooks are on.
    pub drills: bool,
}

/// `opkernel serve`.
pub async fn run_serve(args: ServeArgs) -> anyhow::Result<i32> {
    let ServeArgs {
        listen,
        home,
        allow_remote,
        store,
        node,
        drills,
    } = args;
    if !listen.ip().is_loopback() {
        if !allow_remote {
            bail!("refusing to listen on non-loopback address {listen}: pass --allow-remote to expose the kernel");
        }
        tracing::warn!(%listen, "listening on a non-loopback address: anyone who can reach it and holds a token can run commands");
    }
    let home = home.unwrap_or_else(default_home);
    let mut config = crate::config::Config::from_env(home.clone(), listen);
    config.drills |= drills;
    if let Some(store) = store {
        config.store = crate::config::StoreLocation::parse(&store).map_err(anyhow::Error::msg)?;
    }
    if let Some((name, url)) = node {
        // a bad value is in `config.invalid` already: the start is refused
        let ttl = crate::config::node_ttl_sec(&mut Vec::new());
        config.node =
            Some(crate::config::NodeConfig::new(&name, &url, ttl).map_err(anyhow::Error::msg)?);
    }
    crate::runtime::serve::serve(config, |addr| {
        eprintln!(
            "opkernel listening on http://{addr} (home {})",
            home.display()
        );
    })
    .await
    .context("kernel stopped")?;
    Ok(0)
}
