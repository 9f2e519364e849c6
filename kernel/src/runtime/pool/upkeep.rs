//! The pool's upkeep. At start: the bindings loaded from the control plane
//! (their binding files re-written), binding files without a row set apart
//! (never reused), and the pool containers an earlier process left sorted:
//! the current ones are free again. Then a loop, woken by every adoption
//! and at least every few seconds, that removes what may not stay (strays,
//! containers of a profile or image no longer pooled, a surplus), then
//! refills each pooled profile to the configured size, one container at a
//! time, off the path of any start.

use std::sync::Arc;
use std::time::Duration;

use sandbox::profile::{scratch_key, LABEL_POOL, LABEL_POOL_IMAGE, LABEL_SCRATCH_KEY};
use sandbox::{ContainerInfo, PoolIdentity};

use super::{reconcile, Pool, PoolRole};
use crate::base::sync::Stop;
use crate::runtime::kernel::Kernel;
use crate::store::StoreError;

/// The upkeep's cadence when nothing wakes it.
const EVERY: Duration = Duration::from_secs(5);
/// Pause after a failed fill (an image that will not start, Docker away).
const FAILED_FILL_PAUSE: Duration = Duration::from_secs(30);
/// How long a wake (an adoption, or a new run the pool could not serve)
/// waits before the refill: the new run's first command, on the same
/// cores and the same engine, goes first. Wakes meanwhile join it.
pub(super) const SETTLE: Duration = Duration::from_millis(50);

/// Loads the bindings and sorts the pool containers Docker has (at start,
/// before any observer looks at a container).
pub async fn recover(k: &Kernel) -> Result<(), StoreError> {
    for mut b in k.store.bindings().await? {
        let run_key = scratch_key(&b.run_id);
        if b.node.is_none() && k.store.node().is_some() {
            // a single kernel's binding: taken over only by the node whose
            // disk holds its files, never removed by another (SPEC §24)
            if !k.backend.scratch_exists(&b.scratch_key)
                || !k.store.take_over_binding(&b.run_id).await?
            {
                continue;
            }
            b.node = k.store.node().map(str::to_owned);
        }
        if !k.backend.scratch_exists(&b.scratch_key) {
            // its scratch went (a kill while the reaper removed it): the
            // binding has nothing left to bind; its file goes too
            let _ = k.backend.remove_scratch(&run_key);
            k.store.unbind(&b.run_id).await?;
            continue;
        }
        // the row stands; its file may be missing (killed after the commit)
        if let Err(e) = k.backend.bind_scratch(&run_key, &b.scratch_key) {
            tracing::warn!(run = %b.run_id, %e, "binding file not re-written; the run's next op tries again");
        }
        k.pool.remember(b);
    }
    {
        let mut s = k.pool.state.lock();
        let bound: std::collections::HashSet<String> =
            s.by_run.values().map(|b| b.scratch_key.clone()).collect();
        for (run_key, pool_key) in k.backend.scratch_bindings() {
            if !bound.contains(&pool_key) {
                tracing::warn!(%run_key, %pool_key, "a binding file without a control-plane row: that pool container is never reused");
                s.unconfirmed.insert(pool_key, run_key);
            }
        }
    }
    let Ok(list) = k.backend.list_managed().await else {
        return Ok(());
    };
    k.restore_run_names(&list).await;
    let _ = k.pool.refresh_images(k).await;
    for c in list {
        let key = c.labels.get(LABEL_SCRATCH_KEY).cloned().unwrap_or_default();
        let fresh = k.pool.fresh(k, &c) && reconcile::untouched(k, &key);
        if k.pool.role(&c) == Some(PoolRole::Stray) && fresh {
            // the list has no hostname: the launcher is addressed by it
            if let Ok(info) = k.backend.inspect(&c.id).await {
                k.pool.state.lock().free.push(info);
            }
        }
    }
    Ok(())
}

/// The upkeep loop (one per kernel, in the housekeeping set).
pub async fn run(k: Arc<Kernel>, mut stop: Stop) {
    loop {
        let pause = match tick(&k).await {
            Ok(()) => EVERY,
            Err(e) => {
                tracing::warn!(%e, "warm pool: upkeep failed; trying again later");
                FAILED_FILL_PAUSE
            }
        };
        tokio::select! {
            _ = k.pool.wake.notified() => if !stop.nap(SETTLE).await { return },
            alive = stop.nap(pause) => if !alive { return },
        }
    }
}

/// One round: the removals, then the refill.
async fn tick(k: &Kernel) -> Result<(), sandbox::SandboxError> {
    k.pool.refresh_images(k).await?;
    let list = k.backend.list_managed().await?;
    k.pool.drop_vanished(&list);
    for c in list.iter().filter(|c| c.labels.contains_key(LABEL_POOL)) {
        if let Some(reason) = k.pool.must_go(k, c) {
            if let Err(e) = remove_unbound(k, c, &reason).await {
                tracing::warn!(container = %c.name, %e, "warm pool: not removed; tried again next round");
            }
        }
    }
    if let Err(e) = reconcile::pass(k, &list).await {
        tracing::warn!(%e, "warm pool: bindings not reconciled this round");
    }
    for profile in &k.pool.config.profiles {
        let image = k.pool.image_id_of(profile).unwrap_or_default();
        while k.pool.free_of(profile) < k.pool.size() {
            let identity = PoolIdentity::new(profile, &image);
            // listed as being made: a reaper pass meanwhile keeps it
            k.pool
                .state
                .lock()
                .making
                .insert(identity.scratch_key.clone());
            let made = k.backend.create_pool_container(&identity, profile).await;
            let mut s = k.pool.state.lock();
            s.making.remove(&identity.scratch_key);
            let info = made?;
            tracing::debug!(container = %info.name, "warm pool: container ready");
            s.free.push(info);
        }
    }
    Ok(())
}

/// At a graceful stop: the free containers go (they serve no run, and a
/// stopped kernel should leave no idle container behind; a SIGKILLed
/// kernel's are reused or removed at its next start). Bounded: what is not
/// removed in time is sorted at the next start.
pub async fn drain(k: &Kernel) {
    let free = std::mem::take(&mut k.pool.state.lock().free);
    let removals = async {
        for c in &free {
            if k.backend.remove(&c.id).await.is_ok() {
                if let Some(key) = c.labels.get(LABEL_SCRATCH_KEY) {
                    let _ = k.backend.remove_scratch(key);
                }
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(10), removals)
        .await
        .is_err()
    {
        tracing::warn!("warm pool: not every free container was removed at the stop");
    }
}

/// Removes an unbound pool container (and its scratch dir) when it still
/// is: taken out of the free list first, so no adoption can have it.
/// False when it was not removable (adopted meanwhile, bound, unconfirmed).
pub async fn remove_unbound(
    k: &Kernel,
    c: &ContainerInfo,
    reason: &str,
) -> Result<bool, sandbox::SandboxError> {
    let stray = {
        let mut s = k.pool.state.lock();
        match k.pool.role_locked(&s, c) {
            PoolRole::Free => {
                s.free.retain(|f| f.id != c.id);
                false
            }
            PoolRole::Stray => true,
            _ => return Ok(false),
        }
    };
    // a stray may be bound by a commit this kernel never heard of: the
    // control plane's word first (unreachable: kept for now)
    if stray {
        match k.store.binding_of_container(&c.id).await {
            Ok(None) => {}
            Ok(Some(b)) => {
                k.pool.remember(b);
                return Ok(false);
            }
            Err(_) => return Ok(false),
        }
    }
    k.backend.remove(&c.id).await?;
    if let Some(key) = c.labels.get(LABEL_SCRATCH_KEY) {
        if sandbox::profile::is_pool_key(key) {
            k.backend.remove_scratch(key)?;
        }
    }
    tracing::info!(container = %c.name, reason, "warm pool: container removed");
    Ok(true)
}

impl Pool {
    /// Reads the image id of each pooled profile's image (SPEC §26: the
    /// pool is kept per image); a rebuilt image drains its containers.
    async fn refresh_images(&self, k: &Kernel) -> Result<(), sandbox::SandboxError> {
        let mut ids = std::collections::HashMap::new();
        for p in &self.config.profiles {
            if !ids.contains_key(&p.image) {
                ids.insert(p.image.clone(), k.backend.image_id(&p.image).await?);
            }
        }
        self.state.lock().image_ids = ids;
        Ok(())
    }

    /// The image id `profile`'s containers are made from, as last seen.
    fn image_id_of(&self, profile: &sandbox::Profile) -> Option<String> {
        self.state.lock().image_ids.get(&profile.image).cloned()
    }

    /// Whether an unbound pool container may serve a new run: running,
    /// this home's, of a pooled profile and that profile's current image.
    fn fresh(&self, k: &Kernel, c: &ContainerInfo) -> bool {
        let profile = c
            .labels
            .get(LABEL_POOL)
            .and_then(|f| self.fingerprints.iter().position(|p| p == f))
            .map(|i| &self.config.profiles[i]);
        let Some(profile) = profile else {
            return false;
        };
        let image = self.image_id_of(profile);
        c.running
            && k.backend.owns(c)
            && image.is_some()
            && c.labels.get(LABEL_POOL_IMAGE) == image.as_ref()
    }

    /// Why an unbound pool container must go now (`None`: it stays, or it
    /// serves a run).
    pub fn must_go(&self, k: &Kernel, c: &ContainerInfo) -> Option<String> {
        if !k.backend.owns(c) {
            return None;
        }
        match self.role(c)? {
            PoolRole::Stray => Some("not in the free list and bound to no run".into()),
            PoolRole::Free if !self.fresh(k, c) => {
                Some("its profile or image is no longer pooled, or it stopped".into())
            }
            PoolRole::Free => {
                let fingerprint = c.labels.get(LABEL_POOL)?;
                let s = self.state.lock();
                let same: Vec<&ContainerInfo> = s
                    .free
                    .iter()
                    .filter(|f| f.labels.get(LABEL_POOL) == Some(fingerprint))
                    .collect();
                // the newest beyond the configured size go
                let rank = same.iter().position(|f| f.id == c.id)?;
                (rank >= self.size()).then(|| format!("beyond the pool's size ({})", self.size()))
            }
            _ => None,
        }
    }

    /// Free containers whose Docker listing is gone leave the free list.
    fn drop_vanished(&self, list: &[ContainerInfo]) {
        let mut s = self.state.lock();
        s.free
            .retain(|f| list.iter().any(|c| c.id == f.id && c.running));
    }

    /// Free containers of `profile` now.
    fn free_of(&self, profile: &sandbox::Profile) -> usize {
        let fingerprint = sandbox::profile::pool_fingerprint(profile);
        let s = self.state.lock();
        s.free
            .iter()
            .filter(|f| f.labels.get(LABEL_POOL) == Some(&fingerprint))
            .count()
    }
}
