//! Egress allow-lists (SPEC §27): which host and port a run's connection
//! may reach, how one list narrows another, and what a proxy reads from
//! the head of a request to decide. Values only: the proxy that carries a
//! decision out lives in the kernel.
//!
//! An entry is a host name (`pypi.org`), a wildcard (`*.pythonhosted.org`:
//! every name under it, not the name itself) or an IPv4 address, with an
//! optional port (`deb.debian.org:80`); a bare entry allows every port. A
//! list narrows another when each of its entries lies within one of the
//! other's: the same name, or a name under a wildcard, or a wildcard under
//! a wider one, on the same port or on one port of an any-port entry.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest host name (RFC 1035) and label.
const MAX_NAME: usize = 253;
const MAX_LABEL: usize = 63;

/// Which hosts an entry names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// Exactly this name (lowercase, no trailing dot) or IPv4 address.
    Exact(String),
    /// Every name under this one (`*.suffix`), not the name itself.
    Under(String),
}

/// One allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowEntry {
    /// The hosts it names.
    pub host: HostPattern,
    /// Its one port; `None`: every port.
    pub port: Option<u16>,
}

/// A run's allow-list: the hosts and ports its connections may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<AllowEntry>,
}

/// Why an entry is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("network allow entry {entry:?}: {why}")]
pub struct BadEntry {
    /// The entry as given.
    pub entry: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// Normalizes a host name: lowercase, no trailing dot; `None` when it is
/// not a DNS name of letters, digits and hyphens (or an IPv4 address).
pub fn normalize_host(host: &str) -> Option<String> {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= MAX_LABEL
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    let ok = !host.is_empty() && host.len() <= MAX_NAME && host.split('.').all(label_ok);
    // a name whose last label is all digits is an IPv4 address or nothing
    // (no top-level domain is numeric; `127.1` or `2130706433` would be
    // read as addresses by a resolver)
    let numeric = host
        .rsplit('.')
        .next()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()));
    let address = host.parse::<std::net::Ipv4Addr>().is_ok();
    (ok && (!numeric || address)).then_some(host)
}

impl AllowEntry {
    /// Parses one entry: `name`, `*.name`, `name:port`, `*.name:port`.
    pub fn parse(entry: &str) -> Result<AllowEntry, BadEntry> {
        let bad = |why| BadEntry {
            entry: entry.chars().take(300).collect(),
            why,
        };
        let (host, port) = match entry.rsplit_once(':') {
            Some((host, port)) => {
                let port: u16 = port
                    .parse()
                    .map_err(|_| bad("the port must be a number from 1 to 65535"))?;
                if port == 0 {
                    return Err(bad("the port must be a number from 1 to 65535"));
                }
                (host, Some(port))
            }
            None => (entry, None),
        };
        let pattern = match host.strip_prefix("*.") {
            Some(rest) => {
                let name = normalize_host(rest).ok_or_else(|| bad("not a host name under *."))?;
                if !name.contains('.') || name.parse::<std::net::Ipv4Addr>().is_ok() {
                    return Err(bad(
                        "a wildcard names a domain with a dot, like *.example.org",
                    ));
                }
                HostPattern::Under(name)
            }
            None if host.contains('*') => {
                return Err(bad("a wildcard is only a leading *. before a domain"))
            }
            None => HostPattern::Exact(
                normalize_host(host).ok_or_else(|| bad("not a host name or IPv4 address"))?,
            ),
        };
        Ok(AllowEntry {
            host: pattern,
            port,
        })
    }

    /// Whether it allows a connection to `host` (normalized) on `port`.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
            && match &self.host {
                HostPattern::Exact(h) => h == host,
                HostPattern::Under(s) => is_under(host, s) && !is_address(host),
            }
    }

    /// What both this entry and `other` allow, when anything.
    pub fn intersect(&self, other: &AllowEntry) -> Option<AllowEntry> {
        let port = match (self.port, other.port) {
            (None, p) | (p, None) => p,
            (Some(a), Some(b)) if a == b => Some(a),
            _ => return None,
        };
        let host = match (&self.host, &other.host) {
            (HostPattern::Exact(a), HostPattern::Exact(b)) => (a == b).then(|| self.host.clone()),
            (HostPattern::Exact(h), HostPattern::Under(s))
            | (HostPattern::Under(s), HostPattern::Exact(h)) => {
                (is_under(h, s) && !is_address(h)).then(|| HostPattern::Exact(h.clone()))
            }
            (HostPattern::Under(s), HostPattern::Under(t)) if s == t || is_under(s, t) => {
                Some(self.host.clone())
            }
            (HostPattern::Under(s), HostPattern::Under(t)) => {
                is_under(t, s).then(|| other.host.clone())
            }
        }?;
        Some(AllowEntry { host, port })
    }

    /// Whether everything `other` allows, this entry allows too.
    pub fn covers(&self, other: &AllowEntry) -> bool {
        let ports = match (self.port, other.port) {
            (None, _) => true,
            (Some(a), Some(b)) => a == b,
            (Some(_), None) => false,
        };
        let hosts = match (&self.host, &other.host) {
            (HostPattern::Exact(a), HostPattern::Exact(b)) => a == b,
            (HostPattern::Under(s), HostPattern::Exact(h)) => is_under(h, s),
            (HostPattern::Under(s), HostPattern::Under(t)) => s == t || is_under(t, s),
            (HostPattern::Exact(_), HostPattern::Under(_)) => false,
        };
        ports && hosts
    }
}

/// Whether `host` is an IPv4 address (which no wildcard names).
fn is_address(host: &str) -> bool {
    host.parse::<std::net::Ipv4Addr>().is_ok()
}

/// Whether `host` is a name under `suffix` (not `suffix` itself).
fn is_under(host: &str, suffix: &str) -> bool {
    host.len() > suffix.len() + 1
        && host.ends_with(suffix)
        && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Exact(h) => write!(f, "{h}")?,
            HostPattern::Under(s) => write!(f, "*.{s}")?,
        }
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

impl AllowList {
    /// Parses every entry; the first bad one is the error (at most 256).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<AllowList, BadEntry> {
        if entries.len() > 256 {
            return Err(BadEntry {
                entry: format!("({} entries)", entries.len()),
                why: "an allow list holds at most 256 entries",
            });
        }
        let entries = entries
            .iter()
            .map(|e| AllowEntry::parse(e.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(AllowList { entries })
    }

    /// Its entries.
    pub fn entries(&self) -> &[AllowEntry] {
        &self.entries
    }

    /// Whether a connection to `host` on `port` is allowed (`host` as a
    /// request names it; normalized here).
    pub fn allows(&self, host: &str, port: u16) -> bool {
        normalize_host(host).is_some_and(|h| self.entries.iter().any(|e| e.allows(&h, port)))
    }

    /// The first entry of `narrower` that no entry of this list covers;
    /// `None` when `narrower` only narrows this list.
    pub fn wider_entry<'a>(&self, narrower: &'a AllowList) -> Option<&'a AllowEntry> {
        narrower
            .entries
            .iter()
            .find(|n| !self.entries.iter().any(|e| e.covers(n)))
    }

    /// What both lists allow: each entry of this one cut to each of
    /// `other`'s (a descendant's list when its ancestor's narrows).
    pub fn intersect(&self, other: &AllowList) -> AllowList {
        let mut entries: Vec<AllowEntry> = Vec::new();
        for e in &self.entries {
            for cut in other.entries.iter().filter_map(|o| e.intersect(o)) {
                if !entries.contains(&cut) {
                    entries.push(cut);
                }
            }
        }
        AllowList { entries }
    }

    /// The entries as given back (normalized).
    pub fn to_strings(&self) -> Vec<String> {
        self.entries.iter().map(ToString::to_string).collect()
    }
}

/// Whether `ip` is an address on the public internet: not loopback,
/// private (RFC 1918), shared (100.64/10), link-local (the clouds'
/// metadata service among them), unspecified, broadcast, multicast,
/// documentation, benchmarking or reserved. The proxy connects to a name
/// that resolves elsewhere only where the operator allows it, so a name
/// in an allow list cannot be pointed at the host or its neighbours.
pub fn is_public(ip: std::net::Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let shared = a == 100 && (64..128).contains(&b);
    let special = a == 192 && b == 0 && c == 0;
    let benchmark = a == 198 && (18..20).contains(&b);
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || a >= 240
        || shared
        || special
        || benchmark)
}

/// Whether `ip` is never a proxy's target, whatever the operator allows
/// for private addresses: loopback (the host itself), link-local (the
/// clouds' metadata service), unspecified, broadcast, multicast, reserved.
pub fn is_never_reached(ip: std::net::Ipv4Addr) -> bool {
    let a = ip.octets()[0];
    ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || a == 0
        || a >= 240
}

/// A run's network in its envelope (SPEC §27): `"none"`, `"open"` (the
/// operator's network; resolved to its Docker name when the run is made),
/// a Docker network's name (the operator's choice for a top-level run), or
/// `{"allow": [...]}`: only the listed hosts, through the kernel's proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Network {
    /// `none`, `open`, or a Docker network's name.
    Named(String),
    /// Only these hosts (and ports), through the egress proxy.
    Allow(AllowSpec),
}

/// The allow-list form of [`Network`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AllowSpec {
    /// Host names, `*.` wildcards and IPv4 addresses, each with an
    /// optional `:port` (a bare entry allows every port); empty: nothing.
    pub allow: Vec<String>,
}

impl Network {
    /// No network at all.
    pub fn none() -> Network {
        Network::Named("none".to_owned())
    }

    /// The allow list, when it is one (parsed; its entries were checked
    /// when the envelope was made).
    pub fn allow_list(&self) -> Option<AllowList> {
        match self {
            Network::Allow(spec) => AllowList::parse(&spec.allow).ok(),
            Network::Named(_) => None,
        }
    }

    /// Whether it is a Docker network with a route out (neither `none` nor
    /// an allow list).
    pub fn is_open(&self) -> bool {
        matches!(self, Network::Named(n) if n != "none")
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Network::Named(n) => write!(f, "{n}"),
            Network::Allow(spec) => write!(f, "allow [{}]", spec.allow.join(", ")),
        }
    }
}

impl From<&str> for Network {
    fn from(name: &str) -> Network {
        Network::Named(name.to_owned())
    }
}

/// What a proxy was asked, read from the head of the first request on a
/// connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyAsk {
    /// `CONNECT host:port`: a tunnel (HTTPS and anything else).
    Connect {
        /// The host, normalized.
        host: String,
        /// Its port.
        port: u16,
    },
    /// A plain HTTP request in absolute form (`GET http://host/path`).
    Forward {
        /// The host, normalized.
        host: String,
        /// Its port (80 unless given).
        port: u16,
        /// The request line in origin form (`GET /path HTTP/1.1`), for the
        /// origin server.
        request_line: String,
    },
}

/// Why a head is not a proxy request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadAsk(pub &'static str);

/// Reads a proxy request's first line (`head` up to its first CRLF).
pub fn parse_ask(first_line: &str) -> Result<ProxyAsk, BadAsk> {
    let mut parts = first_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(BadAsk("a request line is METHOD TARGET VERSION"));
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(BadAsk("only HTTP/1.x is proxied"));
    }
    if method == "CONNECT" {
        let (host, port) = host_port(target, None)?;
        return Ok(ProxyAsk::Connect { host, port });
    }
    if !method.bytes().all(|b| b.is_ascii_uppercase()) || method.is_empty() {
        return Err(BadAsk("not an HTTP method"));
    }
    let rest = target.strip_prefix("http://").ok_or(BadAsk(
        "a proxied request names its target as http://host/path (https goes by CONNECT)",
    ))?;
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.contains('@') {
        return Err(BadAsk("user information in the target is refused"));
    }
    let (host, port) = host_port(authority, Some(80))?;
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_owned()
    };
    Ok(ProxyAsk::Forward {
        host,
        port,
        request_line: format!("{method} {path} {version}"),
    })
}

/// `host:port` (the port required unless `default` is given).
fn host_port(authority: &str, default: Option<u16>) -> Result<(String, u16), BadAsk> {
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or(BadAsk("a bad port"))?,
        ),
        None => (authority, default.ok_or(BadAsk("CONNECT names host:port"))?),
    };
    let host = normalize_host(host).ok_or(BadAsk("not a host name or IPv4 address"))?;
    Ok((host, port))
}

#[cfg(test)]
#[path = "egress_tests.rs"]
mod tests;
