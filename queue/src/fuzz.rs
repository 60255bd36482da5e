//! What the fuzz targets under `fuzz/` call (feature `fuzz`): the parsers of bytes that come
//! from outside, entry fields from whoever writes to the stream, answer headers from the function.

use std::time::{Duration, SystemTime};

/// [`crate::event`]'s body encoder: the fields as a JSON object, at most `limit` bytes; `Err`
/// names why an entry cannot be an event (`limit` or `encoding`).
pub fn event_body(fields: &[(Vec<u8>, Vec<u8>)], limit: usize) -> Result<Vec<u8>, &'static str> {
    crate::event::encode_body(fields, limit).map_err(|e| e.class())
}

/// The `ce-time` of an entry id, when it has the `<ms>-<seq>` form.
pub fn event_time(id: &str) -> Option<String> {
    crate::event::time_of_id(id)
}

/// A 429's or 503's `Retry-After` as a wait from `now`, and its ceiling.
pub fn retry_after(value: &[u8], now: SystemTime) -> (Option<Duration>, Duration) {
    (
        crate::answer::parse_retry_after(value, now),
        crate::answer::RETRY_AFTER_CEILING,
    )
}

/// The `X-RunR-Error` class, when the value is one.
pub fn error_class(value: &[u8]) -> Option<String> {
    crate::answer::parse_error_class(value)
}

/// A `traceparent` field or header (W3C level 1): trace id, parent span id and flags.
pub fn traceparent(value: &[u8]) -> Option<([u8; 16], [u8; 8], u8)> {
    crate::trace::parse_traceparent(value).map(|p| (p.trace_id, p.span_id, p.flags))
}

/// The `traceparent` an attempt of an entry with `fields` sends.
pub fn attempt_traceparent(fields: &[(Vec<u8>, Vec<u8>)]) -> String {
    crate::trace::Trace::of_entry(fields).attempt().traceparent
}
