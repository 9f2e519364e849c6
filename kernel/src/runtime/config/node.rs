//! A cluster node's settings (SPEC §20): its name, the URL other nodes
//! reach its API at, and its lease's time to live.

use std::time::Duration;

/// How this kernel takes part in a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// The node's name (`serve --node`, `OPKERNEL_NODE`):
    /// `[A-Za-z0-9_.-]{1,64}`, unique in the cluster.
    pub name: String,
    /// Where the other nodes reach this node's API (`serve --advertise`,
    /// `OPKERNEL_ADVERTISE`): an `http://` URL.
    pub advertise_url: String,
    /// The lease's time to live (`OPKERNEL_NODE_TTL`, default 10 s);
    /// renewed every fifth of it.
    pub ttl: Duration,
    /// The longest a connection to the store may take to open (its
    /// hosts in turn, each bounded): set from the store at start.
    pub store_open: Duration,
}

impl NodeConfig {
    /// Checks a node's name and advertised URL; `ttl` must be 2s to 10m.
    pub fn new(name: &str, advertise_url: &str, ttl: Duration) -> Result<NodeConfig, String> {
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !name_ok {
            return Err(format!(
                "a node name matches [A-Za-z0-9_.-]{{1,64}}, got {name:?}"
            ));
        }
        let rest = advertise_url
            .strip_prefix("http://")
            .or_else(|| advertise_url.strip_prefix("https://"))
            .ok_or_else(|| {
                format!("--advertise must be an http:// or https:// URL, got {advertise_url:?}")
            })?;
        if rest.is_empty() || rest.contains(char::is_whitespace) {
            return Err(format!("--advertise names no host: {advertise_url:?}"));
        }
        if !(Duration::from_secs(2)..=Duration::from_secs(600)).contains(&ttl) {
            return Err(format!("OPKERNEL_NODE_TTL must be 2s to 10m, got {ttl:?}"));
        }
        Ok(NodeConfig {
            name: name.to_owned(),
            advertise_url: advertise_url.trim_end_matches('/').to_owned(),
            ttl,
            store_open: Duration::ZERO,
        })
    }

    /// The lease's time to live in milliseconds.
    pub fn ttl_ms(&self) -> i64 {
        self.ttl.as_millis() as i64
    }

    /// How often the lease is renewed (and lapsed nodes swept): TTL/5.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 5
    }

    /// How long a node holds its lease since its last join before it
    /// judges the others (SPEC §20, §31): a whole TTL, plus what another
    /// node may need to reach a store that is back (an open under way when
    /// it returned may wait out a lost host, then a renewal's interval,
    /// then a new open). After a store outage every node joins again, each
    /// as soon as its own connection opens; none is declared dead for
    /// having been the slower to reconnect.
    pub fn judge_hold(&self) -> Duration {
        self.ttl + self.store_open * 2 + self.renew_every()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_urls_and_ttls_are_checked() {
        let n = NodeConfig::new("n1", "http://10.0.0.2:7878/", Duration::from_secs(10)).unwrap();
        assert_eq!(n.advertise_url, "http://10.0.0.2:7878");
        assert_eq!(n.renew_every(), Duration::from_secs(2));
        let slow = NodeConfig {
            store_open: Duration::from_secs(10),
            ..n.clone()
        };
        assert_eq!(slow.judge_hold(), Duration::from_secs(32));
        let tls = NodeConfig::new("n1", "https://n1:7700", Duration::from_secs(10));
        assert_eq!(tls.unwrap().advertise_url, "https://n1:7700");
        for (name, url, ttl) in [
            ("", "http://h:1", 10),
            ("a/b", "http://h:1", 10),
            ("n1", "ftp://h:1", 10),
            ("n1", "https://", 10),
            ("n1", "http://", 10),
            ("n1", "http://h:1", 1),
        ] {
            assert!(
                NodeConfig::new(name, url, Duration::from_secs(ttl)).is_err(),
                "{name} {url} {ttl}"
            );
        }
    }
}
