//! A replicated store's hosts (SPEC §31), tried one at a time. A
//! multi-host URL (`postgres://u:p@pg1:5432,pg2:5432/db?target_session_attrs=read-write`)
//! becomes one connection setting per host. Each new connection tries the
//! host that answered last first (one that stayed silent loses that
//! place), then the others, each bounded as a whole
//! (name lookup, TCP, TLS, authentication, the read-write check), so a
//! host that accepts connections and then hangs (a frozen primary) costs
//! one bound, not the whole open: tokio-postgres bounds only the TCP
//! connect of each host and would wait on the first for ever.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, Connection, Socket};

use super::pgtls::PgTls;
use crate::store::{StoreError, StoreResult};

/// A connection's stream, plain or TLS.
pub type Stream = <PgTls as MakeTlsConnect<Socket>>::Stream;

/// The hosts of one store URL, each with its own settings.
pub struct Hosts {
    each: Vec<(Config, PgTls)>,
    /// The host that answered last: tried first.
    first: AtomicUsize,
    bound: Duration,
}

impl Hosts {
    /// The hosts of `url`, each set up by `config` (timeouts, TLS of its
    /// own name); each open bounded by `bound`.
    pub fn new(
        url: &str,
        bound: Duration,
        config: impl Fn(&str) -> StoreResult<(Config, PgTls)>,
    ) -> StoreResult<Hosts> {
        let each = split(url)
            .iter()
            .map(|u| config(u))
            .collect::<StoreResult<Vec<_>>>()?;
        if each.len() > 1 {
            check_split(url, &each, &config)?;
        }
        Ok(Hosts {
            each,
            first: AtomicUsize::new(0),
            bound,
        })
    }

    /// The longest an open may take: every host's bound.
    pub fn open_bound(&self) -> Duration {
        let hosts: usize = self
            .each
            .iter()
            .map(|(c, _)| c.get_hosts().len().max(1))
            .sum();
        self.bound * hosts as u32
    }

    /// The first host's settings (all share database, user and options).
    pub fn config(&self) -> &Config {
        &self.each[0].0
    }

    /// [`Hosts::connect`] bounded as a whole: no host answering in time,
    /// or none taking the connection, is the store unavailable.
    pub async fn open(&self) -> StoreResult<(Client, Connection<Socket, Stream>)> {
        let bound = self.open_bound();
        tokio::time::timeout(bound, self.connect())
            .await
            .map_err(|_| StoreError::Unavailable(format!("no host answered within {bound:?}")))?
            .map_err(super::postgres::pg_error)
    }

    /// A connection to the first host that takes it, trying the one that
    /// answered last first; every host but the last tried is bounded, the
    /// caller bounds the whole ([`Hosts::open_bound`]). The last host's
    /// error when none takes it.
    pub async fn connect(
        &self,
    ) -> Result<(Client, Connection<Socket, Stream>), tokio_postgres::Error> {
        let n = self.each.len();
        let start = self.first.load(Ordering::Relaxed);
        for k in 0..n {
            let i = (start + k) % n;
            let (config, tls) = &self.each[i];
            let attempt = config.connect(tls.clone());
            let answer = if k + 1 == n {
                attempt.await
            } else {
                match tokio::time::timeout(self.bound, attempt).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        // silent (lost or frozen): the next open starts past
                        // it; a host that answers, even to refuse (a standby
                        // about to be promoted), keeps its place
                        let next = (i + 1) % n;
                        let _ = self.first.compare_exchange(
                            i,
                            next,
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        );
                        tracing::warn!(host = ?config.get_hosts(), bound = ?self.bound, "store: a host did not answer in time");
                        continue;
                    }
                }
            };
            match answer {
                Ok(pair) => {
                    self.first.store(i, Ordering::Relaxed);
                    return Ok(pair);
                }
                Err(e) if k + 1 == n => return Err(e),
                Err(e) => tracing::debug!(host = ?config.get_hosts(), ?e, "store: a host refused"),
            }
        }
        unreachable!("a store URL has at least one host")
    }
}

/// The split read the hosts as tokio-postgres reads the whole URL (or the
/// URL is refused), and names `target_session_attrs=read-write` (or is
/// warned about: a standby may be picked, and every write refused).
fn check_split(
    url: &str,
    each: &[(Config, PgTls)],
    config: &impl Fn(&str) -> StoreResult<(Config, PgTls)>,
) -> StoreResult<()> {
    let whole = config(url)?.0;
    let parts: Vec<_> = each
        .iter()
        .flat_map(|(c, _)| c.get_hosts().to_vec())
        .collect();
    let one_each = each.iter().all(|(c, _)| c.get_hostaddrs().len() <= 1);
    if parts != whole.get_hosts() || !one_each {
        return Err(StoreError::database(
            super::Dialect::Postgres,
            "OPKERNEL_STORE: its hosts could not be told apart (percent-encode `@`, `/`, `,` \
             and `?` in the password; give hostaddr only with one host)",
        ));
    }
    if whole.get_target_session_attrs() != tokio_postgres::config::TargetSessionAttrs::ReadWrite {
        tracing::warn!("OPKERNEL_STORE names several hosts without target_session_attrs=read-write: a standby may be picked, and every write refused");
    }
    Ok(())
}

/// The pool's opener: [`Hosts::connect`], its connection driven by a task.
pub struct Opener(pub std::sync::Arc<Hosts>);

impl deadpool_postgres::Connect for Opener {
    fn connect(
        &self,
        _: &Config,
    ) -> BoxFuture<'_, Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>> {
        Box::pin(async move {
            let (client, connection) = self.0.connect().await?;
            let task = tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok((client, task))
        })
    }
}

/// `url` as one URL per host: `scheme://cred@h1:p1,h2:p2/rest` becomes
/// `scheme://cred@h1:p1/rest` and `scheme://cred@h2:p2/rest`. A URL of one
/// host (or in key=value form) is itself.
pub fn split(url: &str) -> Vec<String> {
    let Some(after) = url.find("://").map(|i| i + 3) else {
        return vec![url.to_owned()];
    };
    // the credentials end at the first `@` (as tokio-postgres reads them:
    // a password's own `@` is percent-encoded), the hosts at the next `/`
    // or `?`
    let hosts_from = url[after..].find('@').map_or(after, |i| after + i + 1);
    let hosts_end = url[hosts_from..]
        .find(['/', '?'])
        .map_or(url.len(), |i| hosts_from + i);
    let hosts = &url[hosts_from..hosts_end];
    if !hosts.contains(',') {
        return vec![url.to_owned()];
    }
    hosts
        .split(',')
        .map(|h| format!("{}{h}{}", &url[..hosts_from], &url[hosts_end..]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{split, Hosts};
    use std::time::Duration;

    #[test]
    fn each_host_is_bounded_and_an_unreadable_list_refused() {
        let second = Duration::from_secs(1);
        let config = crate::store::db::pgpool::config;
        let url = "postgres://u:p@pg1:5432,pg2:5432/db?target_session_attrs=read-write";
        let hosts = Hosts::new(url, second, config).unwrap();
        assert_eq!(hosts.open_bound(), 2 * second);
        let one = Hosts::new("postgres://u:p@pg1/db", second, config).unwrap();
        assert_eq!(one.open_bound(), second);
        let both = "postgres://u@h1,h2/db?hostaddr=10.0.0.1,10.0.0.2";
        let refused = Hosts::new(both, second, config).err().unwrap().to_string();
        assert!(refused.contains("could not be told apart"), "{refused}");
    }

    #[test]
    fn a_multi_host_url_is_one_url_per_host() {
        let url = "postgres://u:p@pg1:5432,pg2:5433/db?target_session_attrs=read-write";
        assert_eq!(
            split(url),
            [
                "postgres://u:p@pg1:5432/db?target_session_attrs=read-write",
                "postgres://u:p@pg2:5433/db?target_session_attrs=read-write",
            ]
        );
        assert_eq!(
            split("postgres://u@a,b?x=1"),
            ["postgres://u@a?x=1", "postgres://u@b?x=1"]
        );
        // a password holding `,`, `?` or `/` stays whole (`@` is encoded)
        assert_eq!(
            split("postgres://u:p,?/%40q@h1,h2/db"),
            ["postgres://u:p,?/%40q@h1/db", "postgres://u:p,?/%40q@h2/db"]
        );
        for one in [
            "postgres://u:p@pg1:5432/db",
            "postgres://u:p,q@pg1/db",
            "host=a,b user=u",
        ] {
            assert_eq!(split(one), [one]);
        }
    }
}
