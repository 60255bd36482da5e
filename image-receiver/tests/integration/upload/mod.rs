//! The upload half of `runr-image-upload serve`, end to end against the real binary: the chunk
//! protocol (any order, duplicates, overlaps, concurrency), refusals, resume after SIGKILL,
//! verification and its reopening, stalled chunks and keepalive, and bad configuration.
//!
//! Uploads here are random bytes: they verify, then fail format detection, which is the part
//! of the pipeline that needs no registry. The wasm tests push into a real registry.

mod chunks;
mod clients;
mod config;
mod journal;
mod lifecycle;
mod stalls;

use runr_testkit::http::Resp;

/// An answer without its `Date` header (the one part that changes from second to second), its
/// header names in lower case: what two answers to the same request must share byte for byte.
fn without_date(resp: &Resp) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let headers = resp
        .headers
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("date"))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
        .collect();
    (resp.status, headers, resp.body.clone())
}
