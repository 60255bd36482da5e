//! runr-image-upload's merged byte ranges (what chunks in any order, overlapping and repeated,
//! add up to) against a bitmap after every insert and remove: the same bytes, counters, gaps
//! and invariants; the state-file form reads back equal and a damaged one is only accepted when
//! valid.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| runr_image_upload::fuzz::range_set(data));
