//! The persistent line reader (runr_wrapper::fuzz::line_reader): capped line reading gives what
//! a plain splitter gives, however the input is cut into reads.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| runr_wrapper::fuzz::line_reader(data));
