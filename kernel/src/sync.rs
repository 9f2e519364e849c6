//! Locks that cannot poison. The kernel's in-memory maps (registries,
//! handles, caches) stay valid after any single update, so a panic in one
//! task must not make every later lock silently skip its work.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// A mutex whose `lock` always returns the guard: a panic while it was held
/// does not poison it for everyone else.
#[derive(Debug, Default)]
pub struct Lock<T>(Mutex<T>);

impl<T> Lock<T> {
    pub fn new(value: T) -> Lock<T> {
        Lock(Mutex::new(value))
    }

    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
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
