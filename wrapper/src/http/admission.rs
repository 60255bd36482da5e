//! Admission control: at most `slots` invocations at once (exec mode: `RUNR_MAX_INFLIGHT`
//! handler processes; persistent mode: one per worker), at most `RUNR_MAX_INFLIGHT_BYTES` bytes
//! held for them ([`Budget`]), and at most `RUNR_MAX_QUEUE` requests waiting for either. A
//! request finds a free slot and room for the bytes it will hold, or waits in line (first come,
//! first served) until its deadline, or — when the line is full — is refused at once; one that
//! needs more than the whole budget is refused with 413. The server asks before it reads a
//! request's body, so waiting and refused requests hold no body in memory.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::Refusal;
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
/// line ([`Slot::into_held`] keeps the bytes for as long as the answer is being written).
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    held: Held,
}

impl Slot {
    /// The bytes held (to grow them by an answer, or give some back).
    pub fn held(&mut self) -> &mut Held {
        &mut self.held
    }

    /// Frees the slot, keeps the bytes.
    pub fn into_held(self) -> Held {
        self.held
    }

    /// The slot alone and the bytes alone, to be let go of at different times.
    pub fn split(self) -> (OwnedSemaphorePermit, Held) {
        (self._permit, self.held)
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
                        _permit: p,
                        held: Held::unlimited(),
                    })
                }
                Some(Some(held)) => return Ok(Slot { _permit: p, held }),
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
            Ok(Slot {
                _permit: permit,
                held,
            })
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

// === the byte budget ===

/// The budget's unit: bytes are reserved in whole KiB (a semaphore counts permits in `u32`s
/// per acquisition; in KiB one covers 4 TiB).
const UNIT: u64 = 1024;

/// Bytes held for invocations, `RUNR_MAX_INFLIGHT_BYTES` at most: a fair semaphore of
/// [`UNIT`]s. A request reserves what it will hold before its body is read (and waits in line
/// for it); what an invocation adds that nobody could know before (its answer) is charged when
/// it is known, never waited for — an invocation under way is not stopped halfway — so the
/// budget may be overdrawn by answers: then the next requests wait until enough was given back.
/// The overdraft is `debt`, paid back first from what is released.
#[derive(Debug)]
pub struct Budget {
    inner: Arc<BudgetInner>,
}

#[derive(Debug)]
struct BudgetInner {
    units: Semaphore,
    total: u64,
    /// Units charged beyond what the semaphore had.
    debt: AtomicU64,
}

/// Bytes of a [`Budget`] held by one invocation; dropping it gives them back. Counted in bytes
/// (many small charges add up exactly), held in whole units.
#[derive(Debug)]
pub struct Held {
    budget: Option<Arc<BudgetInner>>,
    bytes: u64,
    units: u64,
}

fn units_of(bytes: u64) -> u64 {
    bytes.div_ceil(UNIT)
}

impl Budget {
    /// A budget of `bytes` (at least one unit).
    pub fn new(bytes: u64) -> Budget {
        let total = units_of(bytes).clamp(1, Semaphore::MAX_PERMITS as u64);
        Budget {
            inner: Arc::new(BudgetInner {
                units: Semaphore::new(total as usize),
                total,
                debt: AtomicU64::new(0),
            }),
        }
    }

    /// Whether `bytes` fit in the whole budget at all.
    pub fn fits(&self, bytes: u64) -> bool {
        units_of(bytes) <= self.inner.total
    }

    /// `bytes` now if they are free and nobody waits.
    pub fn try_take(&self, bytes: u64) -> Option<Held> {
        let units = units_of(bytes);
        if units == 0 {
            return Some(self.held(0, 0));
        }
        let n = u32::try_from(units).ok()?;
        let permits = self.inner.units.try_acquire_many(n).ok()?;
        permits.forget();
        Some(self.held(bytes, units))
    }

    /// `bytes`, waiting in line for them (they must [fit](Budget::fits)). Cancel-safe.
    pub async fn take(&self, bytes: u64) -> Held {
        let units = units_of(bytes).min(self.inner.total);
        if units == 0 {
            return self.held(0, 0);
        }
        let n = u32::try_from(units).unwrap_or(u32::MAX);
        match self.inner.units.acquire_many(n).await {
            Ok(permits) => permits.forget(),
            // Never closed.
            Err(_closed) => {}
        }
        let units = u64::from(n);
        self.held(bytes.min(units * UNIT), units)
    }

    fn held(&self, bytes: u64, units: u64) -> Held {
        metrics::get().inflight_bytes(i64::try_from(units * UNIT).unwrap_or(i64::MAX));
        Held {
            budget: Some(self.inner.clone()),
            bytes,
            units,
        }
    }

    /// Units free now.
    #[cfg(test)]
    fn free(&self) -> usize {
        self.inner.units.available_permits()
    }
}

impl Held {
    /// Holds nothing against no budget (unlimited).
    pub fn unlimited() -> Held {
        Held {
            budget: None,
            bytes: 0,
            units: 0,
        }
    }

    /// Holds `bytes` more, now: taken from what is free, the rest as an overdraft.
    pub fn charge(&mut self, bytes: u64) {
        let Some(b) = &self.budget else {
            return;
        };
        self.bytes = self.bytes.saturating_add(bytes);
        let units = units_of(self.bytes).saturating_sub(self.units);
        if units == 0 {
            return;
        }
        let want = usize::try_from(units).unwrap_or(usize::MAX);
        let got = b.units.forget_permits(want) as u64;
        if got < units {
            b.debt.fetch_add(units - got, Ordering::SeqCst);
        }
        self.units += units;
        metrics::get().inflight_bytes(i64::try_from(units * UNIT).unwrap_or(i64::MAX));
    }

    /// Gives back `bytes` of what it holds (what it turned out not to need).
    pub fn release(&mut self, bytes: u64) {
        self.bytes = self.bytes.saturating_sub(bytes);
        let units = self.units.saturating_sub(units_of(self.bytes));
        self.units -= units;
        self.give_back(units);
    }

    fn give_back(&self, units: u64) {
        let Some(b) = &self.budget else {
            return;
        };
        if units == 0 {
            return;
        }
        metrics::get().inflight_bytes(-i64::try_from(units * UNIT).unwrap_or(i64::MAX));
        // The overdraft first: those units were never in the semaphore.
        let mut paid = 0;
        let _ = b
            .debt
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |debt| {
                paid = debt.min(units);
                Some(debt - paid)
            });
        let back = usize::try_from(units - paid).unwrap_or(usize::MAX);
        if back > 0 {
            b.units.add_permits(back);
        }
    }

    /// Bytes held now, in whole units.
    #[cfg(test)]
    fn bytes(&self) -> u64 {
        self.units * UNIT
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.give_back(self.units);
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

    #[test]
    fn answers_overdraw_and_the_overdraft_is_paid_back_first() {
        let b = Budget::new(4 * UNIT);
        let mut x = b.try_take(2 * UNIT).unwrap();
        let y = b.try_take(2 * UNIT).unwrap();
        assert_eq!(b.free(), 0);
        assert!(b.try_take(1).is_none());
        // An answer is charged even with nothing free: 2 units of debt.
        x.charge(2 * UNIT);
        assert_eq!(x.bytes(), 4 * UNIT);
        // What y gives back pays the debt; nothing becomes free.
        drop(y);
        assert_eq!(b.free(), 0);
        drop(x);
        assert_eq!(b.free(), 4);
        // A reservation that turned out too large gives the surplus back.
        let mut z = b.try_take(4 * UNIT).unwrap();
        z.release(3 * UNIT);
        assert_eq!((z.bytes(), b.free()), (UNIT, 3));
        drop(z);
        assert_eq!(b.free(), 4);
        // Bytes are counted in whole units.
        assert!(b.fits(4 * UNIT) && !b.fits(4 * UNIT + 1));
        // Many small charges add up to what they are, not a unit each.
        let mut w = b.try_take(0).unwrap();
        for _ in 0..1024 {
            w.charge(3);
        }
        assert_eq!((w.bytes(), b.free()), (3 * UNIT, 1));
        w.release(3 * 1024);
        assert_eq!((w.bytes(), b.free()), (0, 4));
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
