//! Synchronization the kernel's parts share: locks that cannot poison (the
//! kernel's in-memory maps (registries, handles, caches) stay valid after
//! any single update, so a panic in one task must not make every later lock
//! silently skip its work), and the stop its background loops nap through.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

/// A mutex whose `lock` always returns the guard: a panic while it was held
/// does not poison it for everyone else.
#[derive(Debug, Default)]
pub struct Lock<T>(Mutex<T>);

impl<T> Lock<T> {
    /// A lock holding `value`.
    pub const fn new(value: T) -> Lock<T> {
        Lock(Mutex::new(value))
    }

    /// The guard, poisoned or not.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A background loop's view of its set's stop (see `housekeeping.rs`).
#[derive(Clone)]
pub struct Stop(watch::Receiver<bool>);

impl Stop {
    /// A stop and the switch that pulls it.
    pub fn new() -> (watch::Sender<bool>, Stop) {
        let (tx, rx) = watch::channel(false);
        (tx, Stop(rx))
    }

    /// Resolves once the set is stopped.
    pub async fn stopped(&mut self) {
        let _ = self.0.wait_for(|stopped| *stopped).await;
    }

    /// Sleeps `d`, or less when the set stops; false once it is stopped
    /// (or its switch is gone).
    pub async fn nap(&mut self, d: Duration) -> bool {
        if !*self.0.borrow() {
            // a switch that is gone stops the set, as `stopped` says
            if let Ok(Err(_)) = tokio::time::timeout(d, self.0.wait_for(|stopped| *stopped)).await {
                return false;
            }
        }
        !*self.0.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_while_locked_does_not_stop_later_work() {
        let lock = std::sync::Arc::new(Lock::new(vec![1]));
        let l = lock.clone();
        let _ = std::thread::spawn(move || {
            let _guard = l.lock();
            panic!("while holding the lock");
        })
        .join();
        lock.lock().push(2);
        assert_eq!(*lock.lock(), vec![1, 2]);
    }
}
