//! Seeded pseudo-random numbers and bytes for tests: the same seed gives the same run, so a
//! failure prints its seed and can be replayed. xorshift64*: fast, no dependency, and nothing a
//! test does needs more than that (these are not secrets).

/// xorshift64* from a seed (any seed, 0 included).
pub struct Rng(u64);

impl Rng {
    /// The generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// `buf` filled.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let word = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }

    /// `items` in an order of this generator's (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// `len` bytes from `seed`.
pub fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0; len];
    Rng::new(seed).fill(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_and_another_differs() {
        assert_eq!(bytes(1000, 7), bytes(1000, 7));
        assert_ne!(bytes(1000, 7), bytes(1000, 8));
        assert_eq!(bytes(13, 7)[..], bytes(1000, 7)[..13]);
    }

    #[test]
    fn below_stays_below_and_shuffle_keeps_every_item() {
        let mut rng = Rng::new(1);
        assert!((0..10_000).all(|_| rng.below(7) < 7));
        let mut items: Vec<u32> = (0..100).collect();
        rng.shuffle(&mut items);
        assert_ne!(items, (0..100).collect::<Vec<_>>());
        items.sort_unstable();
        assert_eq!(items, (0..100).collect::<Vec<_>>());
    }
}
