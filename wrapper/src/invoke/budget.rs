//! The bytes held for invocations (`RUNR_MAX_INFLIGHT_BYTES`): reserved by the server's
//! admission before a request's body is read, grown by what an invocation collects (its
//! answer), given back as each part is let go of.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::observe::metrics;

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
}
