//! Admission control: at most `slots` invocations at once (exec mode: `RUNR_MAX_INFLIGHT`
//! handler processes; persistent mode: one per worker) and at most `RUNR_MAX_QUEUE` requests
//! waiting for a slot. A request finds a free slot, or waits in line (first come, first
//! served) until its deadline, or — when the line is full — is refused at once. The server asks
//! before it reads a request's body, so waiting and refused requests hold no body in memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::Refusal;
use crate::observe::metrics;

/// The slots and the line in front of them.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    /// Requests waiting for a slot now.
    waiting: AtomicUsize,
    max_queue: usize,
}

/// A held slot; dropping it frees the slot for the next request in line.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

impl Admission {
    /// `slots` invocations at once (at least 1), `max_queue` waiting (0: none wait).
    pub fn new(slots: usize, max_queue: usize) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(slots.max(1))),
            waiting: AtomicUsize::new(0),
            max_queue,
        }
    }

    /// A slot, waiting for one until `deadline` if none is free. [`Refusal::Overloaded`] when
    /// `max_queue` requests wait already, [`Refusal::QueueTimedOut`] when the deadline passed
    /// in line. Cancel-safe: a request that goes away leaves the line.
    pub async fn admit(&self, deadline: Instant) -> Result<Slot, Refusal> {
        // Free permits are handed to waiters first (tokio's semaphore is fair), so this never
        // jumps the line.
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(Slot { _permit: permit });
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_queue {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Refusal::Overloaded);
        }
        let _in_line = InLine(&self.waiting);
        // `runr_queued_invocations` counts it while it waits here.
        let _queued = metrics::get().queued();
        match tokio::time::timeout_at(deadline, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Slot { _permit: permit }),
            // The semaphore is never closed; were it, nothing could be served any more.
            Ok(Err(_closed)) => Err(Refusal::Overloaded),
            Err(_elapsed) => Err(Refusal::QueueTimedOut),
        }
    }

    /// Requests waiting for a slot now.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Slots free now.
    #[cfg(test)]
    pub fn free(&self) -> usize {
        self.slots.available_permits()
    }
}

/// Counts a request in line while it waits, however the wait ends.
struct InLine<'a>(&'a AtomicUsize);

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn slots_then_the_line_then_refusals() {
        let a = Arc::new(Admission::new(2, 3));
        let far = Instant::now() + Duration::from_secs(60);
        let s1 = a.admit(far).await.unwrap();
        let _s2 = a.admit(far).await.unwrap();
        assert_eq!(a.free(), 0);
        // Three wait in line, in order.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for n in 0..3 {
            let (a, tx) = (a.clone(), tx.clone());
            tokio::spawn(async move {
                let slot = a.admit(far).await;
                tx.send((n, slot.is_ok())).unwrap();
                // Hold it until the test ends.
                std::future::pending::<()>().await;
                drop(slot);
            });
            tokio::task::yield_now().await;
        }
        assert_eq!(a.waiting(), 3);
        // The fourth finds the line full.
        assert!(matches!(a.admit(far).await, Err(Refusal::Overloaded)));
        drop(s1);
        assert_eq!(rx.recv().await, Some((0, true)));
        assert_eq!(a.waiting(), 2);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn waiting_ends_at_the_deadline_and_leaves_the_line() {
        let a = Admission::new(1, 1);
        let _held = a.admit(Instant::now()).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        assert!(matches!(
            a.admit(deadline).await,
            Err(Refusal::QueueTimedOut)
        ));
        assert!(Instant::now() >= deadline);
        assert_eq!(a.waiting(), 0);
        // A request that goes away while in line leaves it too.
        let gone = tokio::time::timeout(
            Duration::from_secs(1),
            a.admit(deadline + Duration::from_secs(60)),
        );
        assert!(gone.await.is_err());
        assert_eq!(a.waiting(), 0);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn no_line_at_all_with_max_queue_0() {
        let a = Admission::new(1, 0);
        let far = Instant::now() + Duration::from_secs(60);
        let _held = a.admit(far).await.unwrap();
        assert!(matches!(a.admit(far).await, Err(Refusal::Overloaded)));
    }
}
