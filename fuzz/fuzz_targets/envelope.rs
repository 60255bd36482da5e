//! The request → envelope encoder (runr_wrapper::fuzz::envelope): the envelope streamed piece by
//! piece into a handler is byte for byte serde_json's whole envelope, one line of JSON whose
//! body decodes back to the request body, and the exec variables are unique.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| runr_wrapper::fuzz::envelope(data));
