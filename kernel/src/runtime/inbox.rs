//! How an op's observer is woken. Every source (a file event on its
//! `.pid`/`.code`, its container monitor's alarm, a kill request, a drill's
//! fault) posts one [`Wake`] to the op's [`Inbox`]; the observer takes all
//! pending wakes at once. Posting never blocks, never fails and never grows
//! memory: wakes of one kind coalesce.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

pub use opkernel_domain::wake::{Wake, Wakes};

/// One op's wake-ups; shared by its observer attempts and their sources.
#[derive(Debug, Default)]
pub struct Inbox {
    pending: AtomicU8,
    notify: Notify,
}

impl Inbox {
    /// Posts a wake; it coalesces with a pending one of the same kind.
    pub fn post(&self, wake: Wake) {
        self.pending.fetch_or(wake as u8, Ordering::SeqCst);
        self.notify.notify_one();
    }

    /// Takes what is pending without waiting.
    pub fn take(&self) -> Wakes {
        Wakes::from_bits(self.pending.swap(0, Ordering::SeqCst))
    }

    /// Waits up to `limit` for a wake (returns at once if one is pending),
    /// then takes everything pending; `Wakes::NONE` when the time ran out.
    pub async fn wait(&self, limit: Duration) -> Wakes {
        if self.pending.load(Ordering::SeqCst) == 0 {
            let _ = tokio::time::timeout(limit, self.notify.notified()).await;
        }
        self.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wakes_coalesce_and_none_is_lost() {
        let inbox = Inbox::default();
        inbox.post(Wake::File);
        inbox.post(Wake::File);
        inbox.post(Wake::Kill);
        let got = inbox.wait(Duration::from_secs(5)).await;
        assert!(got.has(Wake::File) && got.has(Wake::Kill) && !got.has(Wake::Alarm));
        assert_eq!(inbox.wait(Duration::from_millis(20)).await, Wakes::NONE);
        // a post while nobody waits is kept for the next wait
        inbox.post(Wake::Alarm);
        let began = std::time::Instant::now();
        assert_eq!(
            inbox.wait(Duration::from_secs(5)).await,
            Wakes::of(&[Wake::Alarm])
        );
        assert!(began.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_post_wakes_a_waiting_observer() {
        let inbox = std::sync::Arc::new(Inbox::default());
        let waiter = {
            let inbox = inbox.clone();
            tokio::spawn(async move { inbox.wait(Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        inbox.post(Wake::Fault);
        let got = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("woken")
            .expect("joined");
        assert!(got.has(Wake::Fault));
    }
}
