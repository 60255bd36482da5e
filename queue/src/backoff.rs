//! How long an entry waits before its next attempt.

use std::time::Duration;

/// The wait before retry `n` (1 for the second attempt): `d = min(base·2ⁿ⁻¹, cap)` with equal
/// jitter — half of `d` fixed, the other half uniform from `random` — and never less than
/// `floor` (a 429's or 503's `Retry-After`, which the cap does not shorten).
pub fn retry_delay(
    n: u32,
    base: Duration,
    cap: Duration,
    floor: Option<Duration>,
    random: u64,
) -> Duration {
    let d = doubled(base, n).min(cap);
    let d_ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let half = d_ns / 2;
    // The modulo bias of `random % (span + 1)` is negligible next to what jitter is for.
    let extra = random % (d_ns - half + 1);
    let jittered = Duration::from_nanos(half + extra);
    jittered.max(floor.unwrap_or(Duration::ZERO))
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

/// 8 random bytes from the OS, for [`retry_delay`].
pub fn random() -> u64 {
    let mut b = [0u8; 8];
    runr_base::fmt::random_bytes(&mut b);
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
        let d = |n, r| retry_delay(n, S(1), S(10), None, r);
        assert_eq!(d(1, 0), Duration::from_millis(500));
        assert_eq!(d(2, 0), S(1));
        assert_eq!(d(3, 0), S(2));
        assert_eq!(d(4, 0), S(4));
        assert_eq!(d(5, 0), S(5));
        assert_eq!(d(40, 0), S(5));
        assert_eq!(d(u32::MAX, 0), S(5));
        // The largest jitter reaches d exactly.
        assert_eq!(d(1, 500_000_000), S(1));
        assert_eq!(d(5, 5_000_000_000), S(10));
    }

    #[test]
    fn retry_after_is_a_floor_the_cap_does_not_shorten() {
        assert_eq!(retry_delay(1, S(1), S(10), Some(S(30)), 0), S(30));
        assert_eq!(retry_delay(1, S(1), S(10), Some(S(30)), u64::MAX), S(30));
        // A small floor does not shorten the backoff either.
        assert_eq!(retry_delay(4, S(1), S(10), Some(S(1)), 0), S(4));
    }

    /// The reference, written with u128 arithmetic and no shortcuts.
    fn reference(
        n: u32,
        base: Duration,
        cap: Duration,
        floor: Option<Duration>,
        r: u64,
    ) -> Duration {
        let exp = 2u128.checked_pow(n - 1).unwrap_or(u128::MAX);
        let d = base.as_nanos().saturating_mul(exp).min(cap.as_nanos());
        let half = d / 2;
        let extra = u128::from(r) % (d - half + 1);
        let j = Duration::from_nanos((half + extra) as u64);
        j.max(floor.unwrap_or_default())
    }

    proptest! {
        #[test]
        fn matches_reference_and_stays_in_bounds(
            n in 1u32..80,
            base_ms in 1u64..10_000,
            cap_ms in 1u64..100_000,
            floor_ms in proptest::option::of(0u64..200_000),
            r in any::<u64>(),
        ) {
            let (base, cap) = (Duration::from_millis(base_ms), Duration::from_millis(cap_ms.max(base_ms)));
            let floor = floor_ms.map(Duration::from_millis);
            let got = retry_delay(n, base, cap, floor, r);
            prop_assert_eq!(got, reference(n, base, cap, floor, r));
            let d = doubled(base, n).min(cap);
            prop_assert!(got >= d / 2);
            prop_assert!(got <= d.max(floor.unwrap_or_default()));
        }
    }
}
