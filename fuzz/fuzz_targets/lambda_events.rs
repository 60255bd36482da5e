//! Any request (target, header values, body) becomes valid JSON as an API Gateway 2.0, SQS and
//! EventBridge event in runr-wrapper's lambda mode, and the HTTP event's body decodes back to
//! the request's bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| runr_wrapper::fuzz::lambda::events(data));
