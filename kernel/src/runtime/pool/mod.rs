//! The warm pool (SPEC §22): running, unbound containers of the pooled
//! profiles, each with its own scratch dir and resident launcher; a new
//! run's first op adopts one instead of creating a container.
//!
//! Whose a pool container is: the control plane's `container_bindings` row
//! (one transaction; both run and container unique) is the authority; the
//! binding file (the run's scratch path, a root-owned symlink to the pool
//! container's dir) mirrors it, written after the commit and re-written
//! from the rows at start. A pool container is free only when no row and
//! no binding file name it and this process put it in the free list; one
//! taken for adoption is never given back (an adoption that does not
//! settle leaves it to the upkeep, which removes it unless a row binds it).
//! This module holds the process-local state; [`upkeep`] refills, drains
//! and trims it.

mod adopt;
mod reconcile;
pub mod upkeep;

pub use adopt::AdoptError;

use std::collections::{HashMap, HashSet};

use sandbox::profile::{pool_fingerprint, LABEL_POOL, LABEL_SCRATCH_KEY};
use sandbox::ContainerInfo;

use crate::base::sync::Lock;
use crate::runtime::config::PoolConfig;
use crate::store::Binding;

/// Whose a pool-labelled container is, as this kernel knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolRole {
    /// Ready in the free list, for a run of its profile.
    Free,
    /// Being made by the upkeep (not yet in the free list).
    Making,
    /// Taken for an adoption whose binding is being written.
    Adopting,
    /// Bound to this run (its control-plane row).
    Bound(String),
    /// A binding file names it (for this run key) but no row does: its
    /// identity cannot be confirmed, so it is never reused.
    Unconfirmed(String),
    /// None of the above: left from an earlier process, a failed fill or
    /// an adoption that did not settle; the upkeep removes it.
    Stray,
}

impl PoolRole {
    /// Its name in views: `free`, `adopting`, `bound`, `unconfirmed`, `stray`.
    pub fn as_str(&self) -> &'static str {
        match self {
            PoolRole::Free => "free",
            PoolRole::Making => "making",
            PoolRole::Adopting => "adopting",
            PoolRole::Bound(_) => "bound",
            PoolRole::Unconfirmed(_) => "unconfirmed",
            PoolRole::Stray => "stray",
        }
    }
}

/// The pool's process-local state.
#[derive(Default)]
struct State {
    /// Free containers, oldest first.
    free: Vec<ContainerInfo>,
    /// Container ids taken for an adoption not yet settled.
    adopting: HashSet<String>,
    /// Containers taken by an adoption whose bind's answer was lost, and
    /// since when: neither free nor removable until the control plane says.
    uncertain: HashMap<String, std::time::Instant>,
    /// Scratch keys of the containers the upkeep is making.
    making: HashSet<String>,
    /// Every binding, by run (loaded at start, added to by adoptions).
    by_run: HashMap<String, Binding>,
    /// Run id by bound container id.
    by_container: HashMap<String, String>,
    /// Pool keys named by a binding file without a row, with its run key.
    unconfirmed: HashMap<String, String>,
    /// The image id of each pooled profile's image (by reference), as
    /// last seen.
    image_ids: HashMap<String, String>,
}

impl State {
    /// Records a binding: its container is the run's, taken or free no
    /// longer.
    fn record(&mut self, b: Binding) {
        self.adopting.remove(&b.container_id);
        self.uncertain.remove(&b.container_id);
        self.free.retain(|f| f.id != b.container_id);
        self.by_container
            .insert(b.container_id.clone(), b.run_id.clone());
        self.by_run.insert(b.run_id.clone(), b);
    }
}

/// The warm pool of one kernel.
pub struct Pool {
    config: PoolConfig,
    state: Lock<State>,
    /// Wakes the upkeep (after an adoption, to refill at once).
    pub(crate) wake: tokio::sync::Notify,
    /// The pooled profiles' fingerprints, in [`PoolConfig::profiles`] order.
    fingerprints: Vec<String>,
    /// This kernel's cluster node (its bindings name it), if any.
    node: Option<String>,
}

impl Pool {
    /// An empty pool for these settings (filled by [`upkeep`]), of the
    /// cluster node `node` (none: a single kernel).
    pub fn new(config: PoolConfig, node: Option<String>) -> Pool {
        let fingerprints = config.profiles.iter().map(pool_fingerprint).collect();
        Pool {
            config,
            state: Lock::default(),
            wake: tokio::sync::Notify::new(),
            fingerprints,
            node,
        }
    }

    /// Unbound containers kept per pooled profile.
    pub fn size(&self) -> usize {
        self.config.size
    }

    /// Whether runs of `profile` adopt from the pool.
    pub fn pools(&self, profile: &sandbox::Profile) -> bool {
        self.config.size > 0 && self.fingerprints.contains(&pool_fingerprint(profile))
    }

    /// The binding of a run, if it adopted a pool container.
    pub fn binding(&self, run_id: &str) -> Option<Binding> {
        self.state.lock().by_run.get(run_id).cloned()
    }

    /// The run a container is bound to, if any.
    pub fn bound_run(&self, container_id: &str) -> Option<String> {
        self.state.lock().by_container.get(container_id).cloned()
    }

    /// The role of a pool-labelled container (`None`: not a pool container).
    pub fn role(&self, c: &ContainerInfo) -> Option<PoolRole> {
        c.labels.get(LABEL_POOL)?;
        let s = self.state.lock();
        Some(self.role_locked(&s, c))
    }

    /// Free containers now, and bound ones known.
    pub fn counts(&self) -> (usize, usize) {
        let s = self.state.lock();
        (s.free.len(), s.by_container.len())
    }

    /// Records a binding of this node's (loaded at start, or just
    /// written); another node's is not this pool's business.
    pub(crate) fn remember(&self, b: Binding) {
        if self.is_local(&b) {
            self.state.lock().record(b);
        }
    }

    /// [`Pool::role`] with the state already locked.
    fn role_locked(&self, s: &State, c: &ContainerInfo) -> PoolRole {
        let key = c.labels.get(LABEL_SCRATCH_KEY).cloned().unwrap_or_default();
        if let Some(run) = s.by_container.get(&c.id) {
            PoolRole::Bound(run.clone())
        } else if let Some(run_key) = s.unconfirmed.get(&key) {
            PoolRole::Unconfirmed(run_key.clone())
        } else if s.adopting.contains(&c.id) || s.uncertain.contains_key(&c.id) {
            PoolRole::Adopting
        } else if s.making.contains(&key) {
            PoolRole::Making
        } else if s.free.iter().any(|f| f.id == c.id) {
            PoolRole::Free
        } else {
            PoolRole::Stray
        }
    }

    /// Forgets a run's binding (its container and scratch are gone).
    pub fn forget_run(&self, run_id: &str) {
        let mut s = self.state.lock();
        if let Some(b) = s.by_run.remove(run_id) {
            s.by_container.remove(&b.container_id);
        }
    }

    /// Takes a free container of `profile` out of the free list, for an
    /// adoption: from now on it is never free again.
    pub(super) fn take(&self, profile: &sandbox::Profile) -> Option<ContainerInfo> {
        let fingerprint = pool_fingerprint(profile);
        let mut s = self.state.lock();
        let at = s
            .free
            .iter()
            .position(|c| c.labels.get(LABEL_POOL) == Some(&fingerprint))?;
        let c = s.free.remove(at);
        s.adopting.insert(c.id.clone());
        Some(c)
    }

    /// Ends an adoption that wrote nothing: the container leaves the
    /// adopting set as a stray (the upkeep removes it after asking the
    /// control plane), and the binding found instead, if any, is recorded
    /// in the same step.
    pub(super) fn release_taken(&self, container_id: &str, found: Option<Binding>) {
        let mut s = self.state.lock();
        s.adopting.remove(container_id);
        // another node's binding of the run names a container of that
        // node's engine: nothing of this node's (SPEC §24)
        if let Some(b) = found.filter(|b| self.is_local(b)) {
            s.record(b);
        }
    }

    /// Whether a binding is this node's (or, for a single kernel, node-less).
    fn is_local(&self, b: &Binding) -> bool {
        b.node == self.node
    }

    /// An adoption whose bind may or may not have landed: the container
    /// stays taken, and the upkeep asks the control plane again later.
    pub(super) fn uncertain(&self, container_id: &str) {
        let mut s = self.state.lock();
        s.adopting.remove(container_id);
        s.uncertain
            .insert(container_id.to_owned(), std::time::Instant::now());
    }
}
