//! The byte ranges of the file held so far, merged: chunks arrive in any order, overlap and
//! repeat, and what the client needs back is how much of the file from byte 0 is there without
//! a gap (`uploaded_bytes`) and how many distinct bytes are held (`received_bytes`).

use serde::{Deserialize, Serialize};

/// A set of byte positions kept as sorted, disjoint, non-adjacent half-open ranges `[start, end)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<(u64, u64)>", into = "Vec<(u64, u64)>")]
pub struct Ranges {
    spans: Vec<(u64, u64)>,
}

/// A state file whose ranges are not sorted, disjoint half-open ranges.
#[derive(Debug, thiserror::Error)]
#[error("byte ranges are not sorted, disjoint and non-empty")]
pub struct InvalidRanges;

impl Ranges {
    /// The empty set.
    pub fn new() -> Ranges {
        Ranges::default()
    }

    /// Adds `[start, end)`, merging it with every range it overlaps or touches.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        // First span that ends at or after `start` (it may touch or overlap the new one).
        let first = self.spans.partition_point(|&(_, e)| e < start);
        // First span that starts after `end` (it neither touches nor overlaps).
        let last = self.spans.partition_point(|&(s, _)| s <= end);
        let (mut s, mut e) = (start, end);
        if first < last {
            s = s.min(self.spans[first].0);
            e = e.max(self.spans[last - 1].1);
        }
        self.spans.splice(first..last, [(s, e)]);
    }

    /// The parts of `[start, end)` not in the set, in order.
    pub fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut pos = start;
        let from = self.spans.partition_point(|&(_, e)| e <= start);
        for &(s, e) in &self.spans[from..] {
            if s >= end {
                break;
            }
            if s > pos {
                out.push((pos, s));
            }
            pos = pos.max(e);
            if pos >= end {
                break;
            }
        }
        if pos < end {
            out.push((pos, end));
        }
        out
    }

    /// Removes `[start, end)` from the set.
    pub fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut out = Vec::with_capacity(self.spans.len() + 1);
        for &(s, e) in &self.spans {
            if e <= start || s >= end {
                out.push((s, e));
                continue;
            }
            if s < start {
                out.push((s, start));
            }
            if e > end {
                out.push((end, e));
            }
        }
        self.spans = out;
    }

    /// Bytes from 0 without a gap.
    pub fn contiguous_prefix(&self) -> u64 {
        match self.spans.first() {
            Some(&(0, e)) => e,
            _ => 0,
        }
    }

    /// Distinct bytes held.
    pub fn total(&self) -> u64 {
        self.spans.iter().map(|&(s, e)| e - s).sum()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The ranges, sorted and disjoint.
    pub fn spans(&self) -> &[(u64, u64)] {
        &self.spans
    }
}

impl TryFrom<Vec<(u64, u64)>> for Ranges {
    type Error = InvalidRanges;

    /// Accepts exactly what [`Ranges`] would hold itself (from a state file we wrote).
    fn try_from(spans: Vec<(u64, u64)>) -> Result<Ranges, InvalidRanges> {
        let ordered =
            spans.iter().all(|&(s, e)| s < e) && spans.windows(2).all(|w| w[0].1 < w[1].0);
        if ordered {
            Ok(Ranges { spans })
        } else {
            Err(InvalidRanges)
        }
    }
}

impl From<Ranges> for Vec<(u64, u64)> {
    fn from(r: Ranges) -> Vec<(u64, u64)> {
        r.spans
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn of(spans: &[(u64, u64)]) -> Ranges {
        let mut r = Ranges::new();
        for &(s, e) in spans {
            r.insert(s, e);
        }
        r
    }

    #[test]
    fn merges_overlapping_touching_and_repeated() {
        let r = of(&[(10, 20), (30, 40), (20, 25), (10, 20), (35, 50), (0, 5)]);
        assert_eq!(r.spans(), &[(0, 5), (10, 25), (30, 50)]);
        assert_eq!(r.contiguous_prefix(), 5);
        assert_eq!(r.total(), 5 + 15 + 20);
        let r = of(&[(10, 20), (30, 40), (5, 45)]);
        assert_eq!(r.spans(), &[(5, 45)]);
        assert_eq!(r.contiguous_prefix(), 0);
    }

    #[test]
    fn empty_ranges_are_ignored() {
        let r = of(&[(3, 3), (5, 1)]);
        assert!(r.is_empty());
        assert_eq!(r.contiguous_prefix(), 0);
    }

    #[test]
    fn gaps_and_remove() {
        let r = of(&[(10, 20), (30, 40)]);
        assert_eq!(r.gaps(0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        assert_eq!(r.gaps(12, 18), vec![]);
        assert_eq!(r.gaps(15, 35), vec![(20, 30)]);
        assert_eq!(r.gaps(20, 30), vec![(20, 30)]);
        let mut r = r;
        r.remove(15, 35);
        assert_eq!(r.spans(), &[(10, 15), (35, 40)]);
    }

    #[test]
    fn state_file_form_is_checked() {
        let r = of(&[(0, 4), (8, 9)]);
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(json, "[[0,4],[8,9]]");
        assert_eq!(serde_json::from_str::<Ranges>(&json).unwrap(), r);
        for bad in ["[[4,0]]", "[[0,4],[4,8]]", "[[5,8],[0,4]]", "[[1,1]]"] {
            assert!(serde_json::from_str::<Ranges>(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        /// Whatever the order, overlaps and repeats, the set equals a bitmap of the same
        /// inserts, and the counters agree with it.
        #[test]
        fn agrees_with_a_bitmap(chunks in prop::collection::vec((0u64..200, 0u64..40), 0..40)) {
            let mut bits = vec![false; 256];
            let mut r = Ranges::new();
            for &(s, len) in &chunks {
                let e = (s + len).min(256);
                r.insert(s, e);
                for b in &mut bits[s as usize..e as usize] {
                    *b = true;
                }
                // Invariants after every insert.
                let spans = r.spans();
                prop_assert!(spans.iter().all(|&(s, e)| s < e));
                prop_assert!(spans.windows(2).all(|w| w[0].1 < w[1].0));
                let prefix = bits.iter().take_while(|&&b| b).count() as u64;
                prop_assert_eq!(r.contiguous_prefix(), prefix);
                prop_assert_eq!(r.total(), bits.iter().filter(|&&b| b).count() as u64);
                prop_assert!(r.contiguous_prefix() <= r.total());
            }
            // Gaps are exactly the unset bits.
            let gap_bits: u64 = r.gaps(0, 256).iter().map(|&(s, e)| e - s).sum();
            prop_assert_eq!(gap_bits, bits.iter().filter(|&&b| !b).count() as u64);
            for (s, e) in r.gaps(0, 256) {
                prop_assert!(bits[s as usize..e as usize].iter().all(|&b| !b));
            }
        }

        /// The order chunks arrive in does not change the result.
        #[test]
        fn order_does_not_matter(chunks in prop::collection::vec((0u64..1000, 1u64..100), 1..30)) {
            let forward = of(&chunks.iter().map(|&(s, l)| (s, s + l)).collect::<Vec<_>>());
            let backward = of(&chunks.iter().rev().map(|&(s, l)| (s, s + l)).collect::<Vec<_>>());
            prop_assert_eq!(forward, backward);
        }
    }
}
