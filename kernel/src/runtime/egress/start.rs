//! Starting the egress proxy from the kernel: at the first allow-list
//! container, or at start when the network exists from before; and the
//! profile such a container is made with.

use std::sync::Arc;

use super::{network_name, Active, PLACEHOLDER};
use crate::runtime::kernel::Kernel;

impl Kernel {
    /// The proxy, started now if it is not yet: the network made or found,
    /// the firewall rule in place, the listener bound. An error says why
    /// allow-list runs cannot be served (they are refused, never opened).
    pub async fn egress_active(&self) -> Result<Arc<Active>, String> {
        let e = &self.egress;
        if let Some(a) = e.current() {
            return Ok(a);
        }
        let _one = e.starting.lock().await;
        if let Some(a) = e.current() {
            return Ok(a);
        }
        let k = &self.arc().ok_or("the kernel is stopping")?;
        if !k.config.egress.on {
            return Err("this kernel serves no allow-list network (OPKERNEL_EGRESS=off)".into());
        }
        let name = network_name(&k.config.home);
        let net = k
            .backend
            .ensure_egress_network(&name, k.config.egress.port)
            .await
            .map_err(|e| format!("the egress network {name}: {e}"))?;
        // the port the network was made for: its containers' commands name it
        let port = net.port.unwrap_or(k.config.egress.port);
        if port != k.config.egress.port {
            tracing::warn!(network = %name, port, setting = k.config.egress.port,
                "the egress network was made for another proxy port: kept while it exists (remove the network for OPKERNEL_EGRESS_PORT to apply)");
        }
        super::firewall::confine(&net, port)
            .map_err(|e| format!("the egress firewall rule: {e}"))?;
        let listener = tokio::net::TcpListener::bind((net.gateway, port))
            .await
            .map_err(|e| format!("the egress proxy on {}:{port}: {e}", net.gateway))?;
        let url = format!("http://{}:{port}", net.gateway);
        tracing::info!(network = %name, %url, "egress proxy listening");
        let active = Arc::new(Active { net, url, port });
        let serving = tokio::spawn(super::proxy::serve(Arc::downgrade(k), listener));
        *e.active.lock() = Some((active.clone(), serving.abort_handle()));
        if !e.flushing.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tokio::spawn(super::tally::flush_loop(Arc::downgrade(k)));
        }
        Ok(active)
    }

    /// At start: the proxy again when the network exists from before (its
    /// containers' commands still name it); a warning when the test-only
    /// host map is set.
    pub async fn egress_resume(&self) {
        let k = self;
        if !k.config.egress.hosts.is_empty() {
            tracing::warn!(
                hosts = k.config.egress.hosts.len(),
                "OPKERNEL_EGRESS_HOSTS is set: the egress proxy resolves those names without DNS (meant for tests)"
            );
        }
        let name = network_name(&k.config.home);
        if k.config.egress.on && k.backend.network_peers(&name).await.is_ok() {
            if let Err(e) = self.egress_active().await {
                tracing::error!(%e, "the egress proxy could not start: allow-list runs are refused");
            }
        }
    }

    /// Before a container is made or started on the egress network: it
    /// may get an address a removed one held, so the proxy forgets which
    /// run each address was.
    pub fn egress_forget_peers(&self) {
        self.egress.peers.forget_all();
    }

    /// The profile an allow-list run's container is made with: the
    /// egress network, and the proxy in every command's environment.
    /// Other profiles as they are.
    pub async fn egress_profile(
        &self,
        profile: &sandbox::Profile,
    ) -> sandbox::Result<sandbox::Profile> {
        if profile.network != PLACEHOLDER {
            return Ok(profile.clone());
        }
        let active = self
            .egress_active()
            .await
            .map_err(sandbox::SandboxError::Invalid)?;
        let mut out = profile.clone();
        out.network = active.net.name.clone();
        for var in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            out.env.push(format!("{var}={}", active.url));
        }
        for var in ["NO_PROXY", "no_proxy"] {
            out.env.push(format!("{var}=localhost,127.0.0.1"));
        }
        out.env.sort();
        Ok(out)
    }
}
