//! Admission control: at most `slots` invocations at once (exec mode: `RUNR_MAX_INFLIGHT`
//! handler processes; persistent mode: one per worker), at most `RUNR_MAX_INFLIGHT_BYTES` bytes
//! held for them ([`Budget`]), and at most `RUNR_MAX_QUEUE` requests waiting for either. A
//! request finds a free slot and room for the bytes it will hold, or waits in line (first come,
//! first served) until its deadline, or — when the line is full — is refused at once; one that
//! needs more than the whole budget is refused with 413. The server asks before it reads a
//! request's body, so waiting and refused requests hold no body in memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::Refusal;
use crate::invoke::budget::{Budget, Held};
use crate::observe::metrics;

/// The slots, the byte budget and the line in front of them.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    budget: Option<Budget>,
    /// Requests waiting for a slot or for bytes now.
    waiting: AtomicUsize,
    max_queue: usize,
}

/// A held slot and the bytes reserved with it; dropping it frees both for the next request in
/// line. [`Slot::split`] lets go of them at different times: the slot when the handler is done,
/// the bytes once the answer has been written.
#[derive(Debug)]
pub struct Slot {
    permit: OwnedSemaphorePermit,
    held: Held,
}

impl Slot {
    /// The slot alone and the bytes alone, to be let go of at different times.
    pub fn split(self) -> (OwnedSemaphorePermit, Held) {
        (self.permit, self.held)
    }
}

impl Admission {
    /// `slots` invocations at once (at least 1), `budget` bytes held for them at most (`None`:
    /// unlimited), `max_queue` waiting (0: none wait).
    pub fn new(slots: usize, budget: Option<u64>, max_queue: usize) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(slots.max(1))),
            budget: budget.map(Budget::new),
            waiting: AtomicUsize::new(0),
            max_queue,
        }
    }

    /// A slot and `bytes` of the budget, waiting for them until `deadline` if they are not
    /// free. [`Refusal::OverBudget`] when `bytes` is more than the whole budget,
    /// [`Refusal::Overloaded`] when `max_queue` requests wait already,
    /// [`Refusal::QueueTimedOut`] when the deadline passed in line. Cancel-safe: a request that
    /// goes away leaves the line (and gives back what it had got).
    pub async fn admit(&self, deadline: Instant, bytes: u64) -> Result<Slot, Refusal> {
        let budget = self.budget.as_ref();
        if budget.is_some_and(|b| !b.fits(bytes)) {
            return Err(Refusal::OverBudget);
        }
        // Free permits are handed to waiters first (tokio's semaphores are fair), so this
        // never jumps the line.
        let mut permit = self.slots.clone().try_acquire_owned().ok();
        if let Some(p) = permit.take() {
            match budget.map(|b| b.try_take(bytes)) {
                None => {
                    return Ok(Slot {
                        permit: p,
                        held: Held::unlimited(),
                    })
                }
                Some(Some(held)) => return Ok(Slot { permit: p, held }),
                // A slot but not the bytes: it keeps the slot while it waits for them.
                Some(None) => permit = Some(p),
            }
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_queue {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Refusal::Overloaded);
        }
        let _in_line = InLine(&self.waiting);
        // `runr_queued_invocations` counts it while it waits here.
        let _queued = metrics::get().queued();
        let wait = async {
            let permit = match permit {
                Some(p) => p,
                // The semaphore is never closed; were it, nothing could be served any more.
                None => self
                    .slots
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_closed| Refusal::Overloaded)?,
            };
            let held = match budget {
                Some(b) => b.take(bytes).await,
                None => Held::unlimited(),
            };
            Ok(Slot { permit, held })
        };
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(slot) => slot,
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
        let a = Arc::new(Admission::new(2, None, 3));
        let far = Instant::now() + Duration::from_secs(60);
        let s1 = a.admit(far, 0).await.unwrap();
        let _s2 = a.admit(far, 0).await.unwrap();
        assert_eq!(a.free(), 0);
        // Three wait in line, in order.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for n in 0..3 {
            let (a, tx) = (a.clone(), tx.clone());
            tokio::spawn(async move {
                let slot = a.admit(far, 0).await;
                tx.send((n, slot.is_ok())).unwrap();
                // Hold it until the test ends.
                std::future::pending::<()>().await;
                drop(slot);
            });
            tokio::task::yield_now().await;
        }
        assert_eq!(a.waiting(), 3);
        // The fourth finds the line full.
        assert!(matches!(a.admit(far, 0).await, Err(Refusal::Overloaded)));
        drop(s1);
        assert_eq!(rx.recv().await, Some((0, true)));
        assert_eq!(a.waiting(), 2);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn waiting_ends_at_the_deadline_and_leaves_the_line() {
        let a = Admission::new(1, None, 1);
        let _held = a.admit(Instant::now(), 0).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        assert!(matches!(
            a.admit(deadline, 0).await,
            Err(Refusal::QueueTimedOut)
        ));
        assert!(Instant::now() >= deadline);
        assert_eq!(a.waiting(), 0);
        // A request that goes away while in line leaves it too.
        let gone = tokio::time::timeout(
            Duration::from_secs(1),
            a.admit(deadline + Duration::from_secs(60), 0),
        );
        assert!(gone.await.is_err());
        assert_eq!(a.waiting(), 0);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn no_line_at_all_with_max_queue_0() {
        let a = Admission::new(1, None, 0);
        let far = Instant::now() + Duration::from_secs(60);
        let _held = a.admit(far, 0).await.unwrap();
        assert!(matches!(a.admit(far, 0).await, Err(Refusal::Overloaded)));
    }

    const MIB: u64 = 1 << 20;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn bytes_wait_in_line_like_slots_and_what_never_fits_is_refused() {
        let a = Arc::new(Admission::new(8, Some(10 * MIB), 4));
        let far = Instant::now() + Duration::from_secs(60);
        let first = a.admit(far, 6 * MIB).await.unwrap();
        // A slot is free, the bytes are not: it waits in line.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let waiter = {
            let (a, tx) = (a.clone(), tx.clone());
            tokio::spawn(async move {
                let slot = a.admit(far, 6 * MIB).await;
                tx.send(slot.is_ok()).unwrap();
                std::future::pending::<()>().await;
                drop(slot);
            })
        };
        tokio::task::yield_now().await;
        assert_eq!(a.waiting(), 1);
        // Behind it, even a small one waits (first come, first served).
        let small = tokio::time::timeout(Duration::from_secs(1), a.admit(far, MIB));
        assert!(small.await.is_err());
        // More than the whole budget can never be served.
        assert!(matches!(
            a.admit(far, 10 * MIB + 1).await,
            Err(Refusal::OverBudget)
        ));
        drop(first);
        assert_eq!(rx.recv().await, Some(true));
        assert_eq!(a.waiting(), 0);
        waiter.abort();
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_full_line_refuses_and_the_deadline_ends_a_wait_for_bytes() {
        let a = Admission::new(8, Some(4 * MIB), 0);
        let far = Instant::now() + Duration::from_secs(60);
        let _held = a.admit(far, 4 * MIB).await.unwrap();
        assert!(matches!(a.admit(far, MIB).await, Err(Refusal::Overloaded)));
        let a = Admission::new(8, Some(4 * MIB), 1);
        let _held = a.admit(far, 3 * MIB).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        assert!(matches!(
            a.admit(deadline, 2 * MIB).await,
            Err(Refusal::QueueTimedOut)
        ));
        assert_eq!(Instant::now(), deadline);
        assert_eq!(a.waiting(), 0);
        // Requests without a body hold nothing and never wait for bytes.
        assert!(a.admit(far, 0).await.is_ok());
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_request_that_goes_away_in_line_gives_back_what_it_had() {
        let a = Admission::new(1, Some(4 * MIB), 4);
        let far = Instant::now() + Duration::from_secs(60);
        let held = a.admit(far, 3 * MIB).await.unwrap();
        // The second has neither the slot nor the bytes; it gives up after a second.
        let gone = tokio::time::timeout(Duration::from_secs(1), a.admit(far, 2 * MIB));
        assert!(gone.await.is_err());
        assert_eq!(a.waiting(), 0);
        drop(held);
        assert_eq!(a.free(), 1);
        let again = a.admit(far, 4 * MIB).await.unwrap();
        drop(again);
    }
}
