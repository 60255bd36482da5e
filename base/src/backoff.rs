//! The one backoff of the workspace: exponential, capped, with equal jitter. Retries of
//! deliveries (runr-queue), of registry requests (the receiver, prewarm) and of Redis while it is
//! unavailable all wait by it; the wrapper's worker restarts use its ceiling (one worker needs no
//! spreading out).

use std::time::Duration;

/// Retry `n` (1 for the first retry) waits at most `min(base·2ⁿ⁻¹, cap)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first retry's longest wait.
    pub base: Duration,
    /// The longest wait of any retry.
    pub cap: Duration,
}

impl Backoff {
    /// A backoff from `base` doubling up to `cap`.
    pub const fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff { base, cap }
    }

    /// The longest wait before retry `n`: `min(base·2ⁿ⁻¹, cap)`, without jitter.
    pub fn ceiling(&self, n: u32) -> Duration {
        doubled(self.base, n).min(self.cap)
    }

    /// The wait before retry `n` with equal jitter from the OS's randomness.
    pub fn delay(&self, n: u32) -> Duration {
        self.delay_with(n, random())
    }

    /// [`Backoff::delay`] with the randomness given (for tests).
    pub fn delay_with(&self, n: u32, random: u64) -> Duration {
        equal_jitter_with(self.ceiling(n), random)
    }
}

/// Equal jitter: half of `d` fixed, the other half uniform — retries of many clients spread
/// out, yet none fires at once.
pub fn equal_jitter(d: Duration) -> Duration {
    equal_jitter_with(d, random())
}

/// [`equal_jitter`] with the randomness given.
pub fn equal_jitter_with(d: Duration, random: u64) -> Duration {
    let d_ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let half = d_ns / 2;
    // The modulo bias of `random % (span + 1)` is negligible next to what jitter is for.
    let extra = random % (d_ns - half + 1);
    Duration::from_nanos(half + extra)
}

/// `base·2ⁿ⁻¹`, saturating at `u64::MAX` nanoseconds (584 years).
fn doubled(base: Duration, n: u32) -> Duration {
    let shift = n.saturating_sub(1);
    let ns = base.as_nanos();
    let d = if ns == 0 {
        0
    } else if shift >= 64 || ns.leading_zeros() <= shift {
        u128::MAX
    } else {
        ns << shift
    };
    Duration::from_nanos(u64::try_from(d).unwrap_or(u64::MAX))
}

/// 8 random bytes from the OS.
pub fn random() -> u64 {
    let mut b = [0u8; 8];
    crate::fmt::random_bytes(&mut b);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn doubling_then_the_cap() {
        // random = 0: the fixed half only; random = MAX-ish: up to the whole.
        let b = Backoff::new(S(1), S(10));
        let d = |n, r| b.delay_with(n, r);
        assert_eq!(d(1, 0), Duration::from_millis(500));
        assert_eq!(d(2, 0), S(1));
        assert_eq!(d(3, 0), S(2));
        assert_eq!(d(4, 0), S(4));
        assert_eq!(d(5, 0), S(5));
        assert_eq!(d(40, 0), S(5));
        assert_eq!(d(u32::MAX, 0), S(5));
        // The largest jitter reaches the ceiling exactly.
        assert_eq!(d(1, 500_000_000), S(1));
        assert_eq!(d(5, 5_000_000_000), S(10));
        assert_eq!(b.ceiling(0), S(1));
        assert_eq!(b.ceiling(3), S(4));
        assert_eq!(b.ceiling(99), S(10));
        assert_eq!(Backoff::new(Duration::ZERO, S(1)).delay(7), Duration::ZERO);
    }

    /// The reference, written with u128 arithmetic and no shortcuts.
    fn reference(n: u32, base: Duration, cap: Duration, r: u64) -> Duration {
        let exp = 2u128.checked_pow(n.max(1) - 1).unwrap_or(u128::MAX);
        let d = base.as_nanos().saturating_mul(exp).min(cap.as_nanos());
        let half = d / 2;
        let extra = u128::from(r) % (d - half + 1);
        Duration::from_nanos((half + extra) as u64)
    }

    proptest! {
        #[test]
        fn matches_reference_and_stays_in_bounds(
            n in 0u32..80,
            base_ms in 1u64..10_000,
            cap_ms in 1u64..100_000,
            r in any::<u64>(),
        ) {
            let b = Backoff::new(Duration::from_millis(base_ms), Duration::from_millis(cap_ms.max(base_ms)));
            let got = b.delay_with(n, r);
            prop_assert_eq!(got, reference(n, b.base, b.cap, r));
            prop_assert!(got >= b.ceiling(n) / 2);
            prop_assert!(got <= b.ceiling(n));
        }
    }
}
