//! Who is calling the proxy: the run whose container holds a source
//! address on the egress network, remembered for a few seconds and
//! forgotten whenever this kernel makes a container there (the only way
//! an address of a removed container is given again); and how many
//! connections each source, and all together, may hold.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::base::sync::Lock;
use crate::runtime::kernel::Kernel;

/// How long a looked-up address is believed without asking Docker again.
const REMEMBER: Duration = Duration::from_secs(5);
/// Connections open at once, all sources together, and per source.
const MAX_OPEN: usize = 4096;
const MAX_OPEN_PER_SOURCE: usize = 256;

/// One remembered address.
struct Seen {
    run: String,
    at: Instant,
    generation: u64,
}

#[derive(Default)]
pub(super) struct Peers {
    seen: Lock<HashMap<Ipv4Addr, Seen>>,
    /// Bumped before each container made on the egress network.
    generation: AtomicU64,
    open: Arc<Lock<HashMap<IpAddr, usize>>>,
}

/// A held connection slot; given back when dropped.
pub(super) struct Slot {
    open: Arc<Lock<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock();
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

impl Peers {
    /// A slot for one more connection from `ip`, unless it or everyone
    /// already holds the most allowed.
    pub(super) fn admit(&self, ip: IpAddr) -> Option<Slot> {
        let mut open = self.open.lock();
        let total: usize = open.values().sum();
        let mine = open.get(&ip).copied().unwrap_or(0);
        if total >= MAX_OPEN || mine >= MAX_OPEN_PER_SOURCE {
            return None;
        }
        open.insert(ip, mine + 1);
        Some(Slot {
            open: self.open.clone(),
            ip,
        })
    }

    /// Forgets every remembered address: a container is about to be made
    /// on the egress network (it may get an address a removed one held).
    pub(super) fn forget_all(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().clear();
    }

    fn remembered(&self, ip: Ipv4Addr) -> Option<String> {
        let generation = self.generation.load(Ordering::SeqCst);
        let seen = self.seen.lock();
        let s = seen.get(&ip)?;
        (s.generation == generation && s.at.elapsed() < REMEMBER).then(|| s.run.clone())
    }
}

/// The run whose container holds `ip` on the egress network; `None` when
/// no container of this kernel's does.
pub(super) async fn run_of(k: &Kernel, ip: IpAddr) -> Option<String> {
    let IpAddr::V4(ip) = ip else {
        return None;
    };
    let peers = &k.egress.peers;
    if let Some(run) = peers.remembered(ip) {
        return Some(run);
    }
    // read before asking Docker: a container made meanwhile bumps it, and
    // what was learnt is then not kept
    let generation = peers.generation.load(Ordering::SeqCst);
    let name = super::network_name(&k.config.home);
    let on_net = k.backend.network_peers(&name).await.ok()?;
    let (id, _) = on_net.into_iter().find(|(_, addr)| *addr == ip)?;
    let info = k.backend.inspect(&id).await.ok()?;
    if !k.backend.owns(&info) {
        return None;
    }
    let run = k.run_of(&info)?;
    let mut seen = peers.seen.lock();
    if seen.len() > MAX_OPEN {
        seen.clear();
    }
    seen.insert(
        ip,
        Seen {
            run: run.clone(),
            at: Instant::now(),
            generation,
        },
    );
    Some(run)
}
