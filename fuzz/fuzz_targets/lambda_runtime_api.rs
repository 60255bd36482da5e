//! What a Lambda runtime sends to runr-wrapper's Runtime API (error bodies and types, results
//! for every trigger, the streamed HTTP-integration prelude at every prefix, error trailers,
//! paths) always maps to a well-formed answer, and never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| runr_wrapper::fuzz::lambda::runtime_api(data));
