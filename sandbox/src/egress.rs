//! The Docker side of egress allow-lists (SPEC §27): the kernel's internal
//! network (no route out; containers on it cannot reach one another), its
//! gateway (the host's address on it, where the kernel's proxy listens)
//! and the containers on it with their addresses (how the proxy knows
//! which container a connection comes from).

use std::collections::HashMap;
use std::net::Ipv4Addr;

use bollard::models::NetworkCreateRequest;

use crate::error::{Result, SandboxError};
use crate::Sandbox;

/// The kernel's egress network as the engine has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressNetwork {
    /// Its name.
    pub name: String,
    /// The host's address on it: the proxy's.
    pub gateway: Ipv4Addr,
    /// The host's interface for it (`com.docker.network.bridge.name`).
    pub bridge: String,
    /// The proxy port it was made for (its `opkernel.egress.port` label):
    /// the commands of its containers name it in their environment.
    pub port: Option<u16>,
}

/// The bridge interface name of egress network `name` (at most 15 bytes,
/// Linux's limit): `opk` and the name's last 12 characters.
pub fn bridge_of(name: &str) -> String {
    let tail: String = name
        .chars()
        .rev()
        .take(12)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("opk{tail}")
}

impl Sandbox {
    /// Finds or makes the internal network `name` (labelled as this
    /// kernel's and with the proxy's `port`, inter-container traffic off),
    /// and reads its gateway.
    pub async fn ensure_egress_network(&self, name: &str, port: u16) -> Result<EgressNetwork> {
        let found = self.docker.inspect_network(name, None).await;
        let net = match found.map_err(SandboxError::from) {
            Ok(net) => net,
            Err(SandboxError::NotFound(_)) => {
                let options = HashMap::from([
                    (
                        "com.docker.network.bridge.enable_icc".to_owned(),
                        "false".to_owned(),
                    ),
                    ("com.docker.network.bridge.name".to_owned(), bridge_of(name)),
                ]);
                let create = NetworkCreateRequest {
                    name: name.to_owned(),
                    driver: Some("bridge".to_owned()),
                    internal: Some(true),
                    enable_ipv6: Some(false),
                    options: Some(options),
                    labels: Some(HashMap::from([
                        ("opkernel.egress".to_owned(), "1".to_owned()),
                        ("opkernel.egress.port".to_owned(), port.to_string()),
                    ])),
                    ..Default::default()
                };
                match self
                    .docker
                    .create_network(create)
                    .await
                    .map_err(SandboxError::from)
                {
                    // made by another caller meanwhile: Conflict
                    Ok(_) | Err(SandboxError::Conflict(_)) => {}
                    Err(e) => return Err(e),
                }
                self.docker.inspect_network(name, None).await?
            }
            Err(e) => return Err(e),
        };
        if net.internal != Some(true) {
            return Err(SandboxError::Invalid(format!(
                "network {name} exists and is not internal: it would give a route out; remove it"
            )));
        }
        let gateway = net
            .ipam
            .and_then(|i| i.config)
            .unwrap_or_default()
            .into_iter()
            .find_map(|c| c.gateway?.parse::<Ipv4Addr>().ok())
            .ok_or_else(|| SandboxError::Invalid(format!("network {name} has no IPv4 gateway")))?;
        let port = net
            .labels
            .as_ref()
            .and_then(|l| l.get("opkernel.egress.port"))
            .and_then(|p| p.parse().ok());
        let bridge = net
            .options
            .and_then(|o| o.get("com.docker.network.bridge.name").cloned())
            .unwrap_or_else(|| bridge_of(name));
        Ok(EgressNetwork {
            name: name.to_owned(),
            gateway,
            bridge,
            port,
        })
    }

    /// The containers on network `name`, with their IPv4 addresses.
    pub async fn network_peers(&self, name: &str) -> Result<Vec<(String, Ipv4Addr)>> {
        let net = self.docker.inspect_network(name, None).await?;
        Ok(net
            .containers
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(id, e)| {
                let addr = e.ipv4_address?;
                let ip = addr.split('/').next()?.parse().ok()?;
                Some((id, ip))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bridge_name_fits_linux_limit() {
        let b = super::bridge_of("opkernel-egress-0123456789abcdef");
        assert!(b.len() <= 15, "{b}");
        assert_eq!(b, "opk456789abcdef");
    }
}
