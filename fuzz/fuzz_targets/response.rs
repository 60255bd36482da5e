//! The handler output parser (runr_wrapper::fuzz::response): any stdout of an exec handler and
//! any JSON value of a worker give a well-formed answer, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| runr_wrapper::fuzz::response(data));
