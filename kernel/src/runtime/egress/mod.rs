//! The egress proxy (SPEC §27). A run whose envelope's network is an
//! allow list gets its container on the kernel's internal Docker network
//! (no route out, no container-to-container traffic, no DNS out); the one
//! way out is this proxy, listening in the kernel process on the host's
//! address on that network. It knows the run by the connection's source
//! address (the container Docker put there), reads the run's list from
//! the control plane at each connection, and reaches only what the list
//! allows: `CONNECT host:port` tunnels and plain `http://` requests, the
//! host read from the request and resolved by the kernel, never by the
//! container. A firewall rule keeps every other port of the host out of
//! the network's reach.
//!
//! In the kernel, not a container of its own: the kernel already knows
//! each container's run and reads the policy where it is kept, and a
//! restarted kernel listens again on the same address (the network and
//! its containers outlive it): connections in flight drop, new ones work.

mod firewall;
mod peers;
mod proxy;
mod relay;
mod resolve;
mod start;
mod tally;

use std::path::Path;
use std::sync::Arc;

/// The network an allow-list run's profile names until its container is
/// made: then it is the kernel's egress network, with the proxy's address
/// in the command environment (`Kernel::egress_profile`).
pub const PLACEHOLDER: &str = "opkernel-egress";

/// The proxy as it runs: its network and the URL commands use.
#[derive(Debug)]
pub struct Active {
    /// The kernel's internal network.
    pub net: sandbox::egress::EgressNetwork,
    /// `http://<gateway>:<port>`.
    pub url: String,
    /// The proxy's port.
    pub port: u16,
}

/// The kernel's egress state: started at the first allow-list container
/// (or at start, when the network exists from before).
#[derive(Default)]
pub struct Egress {
    /// The running proxy and its accept loop (reset when its network was
    /// removed from under it: the next allow-list container starts it
    /// again).
    active: crate::base::sync::Lock<Option<(Arc<Active>, tokio::task::AbortHandle)>>,
    /// The usage flush loop runs (once for the kernel's life).
    flushing: std::sync::atomic::AtomicBool,
    starting: tokio::sync::Mutex<()>,
    tally: tally::Tally,
    peers: peers::Peers,
}

/// The name of the egress network of the kernel home `home` (one engine
/// may serve several kernels).
pub fn network_name(home: &Path) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(home.display().to_string().as_bytes());
    format!("opkernel-egress-{}", &hex::encode(digest)[..12])
}

impl Egress {
    /// The running proxy, when there is one.
    fn current(&self) -> Option<Arc<Active>> {
        self.active.lock().as_ref().map(|(a, _)| a.clone())
    }

    /// Stops the proxy whose network is gone.
    fn reset(&self) {
        if let Some((_, serving)) = self.active.lock().take() {
            serving.abort();
        }
    }

    /// What the proxy counted for `run` and not yet recorded: connections,
    /// bytes in, bytes out (the flush loop records them).
    pub fn pending(&self, run: &str) -> (u64, u64, u64) {
        self.tally.pending(run)
    }
}
