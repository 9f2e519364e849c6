//! How the proxy finds a name's IPv4 addresses: the host's `/etc/hosts`
//! first (as the system resolver does), else DNS for the name as it is,
//! never completed by the host's search domains (`x.example.org` allowed
//! by `*.example.org` must not become `x.example.org.corp.lan`).

use std::net::{IpAddr, Ipv4Addr};

/// The IPv4 addresses `/etc/hosts` gives `name` (normalized, lowercase).
fn hosts_file(name: &str) -> Vec<Ipv4Addr> {
    let Ok(text) = std::fs::read_to_string("/etc/hosts") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let line = line.split('#').next().unwrap_or_default();
            let mut fields = line.split_whitespace();
            let addr: Ipv4Addr = fields.next()?.parse().ok()?;
            fields
                .any(|alias| alias.trim_end_matches('.').eq_ignore_ascii_case(name))
                .then_some(addr)
        })
        .collect()
}

/// `name`'s IPv4 addresses; an error in words.
pub(super) async fn resolve(name: &str, port: u16) -> Result<Vec<Ipv4Addr>, String> {
    let listed = hosts_file(name);
    if !listed.is_empty() {
        return Ok(listed);
    }
    let found = tokio::net::lookup_host((format!("{name}."), port))
        .await
        .map_err(|e| format!("opkernel egress proxy: {name}: {e}"))?;
    Ok(found
        .filter_map(|a| match a.ip() {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        })
        .collect())
}
