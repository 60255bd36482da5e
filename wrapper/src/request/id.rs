//! The request's id, the envelope's `id` and every log line's `request_id`: the client's
//! `X-Request-Id` when it is one a person can read back, else a fresh one (the CloudEvent id of
//! a queue or schedule request wins over both: [`super::Request::head`]).

use std::sync::atomic::{AtomicU64, Ordering};

use http::HeaderMap;

/// Longest `X-Request-Id` kept, in characters.
pub const MAX_REQUEST_ID_CHARS: usize = 200;

/// Characters of a replaced `X-Request-Id` the logs quote.
pub const REPLACED_ID_QUOTE: usize = 64;

/// The client's `X-Request-Id`: `Ok` when it can be the envelope id (1 to
/// [`MAX_REQUEST_ID_CHARS`] visible characters of valid UTF-8, `café` as well as `abc-1`: no
/// space, control or other [invisible](runr_base::logfmt::is_invisible) character, which would
/// make the id one a person cannot read back or copy), else `Err` with what the logs quote of
/// it; `None` without the header.
pub fn client_request_id(headers: &HeaderMap) -> Option<Result<&str, String>> {
    let raw = headers.get("x-request-id")?.as_bytes();
    if let Ok(id) = std::str::from_utf8(raw) {
        let visible = id.chars().all(|c| !runr_base::logfmt::is_invisible(c));
        if visible && !id.is_empty() && id.chars().nth(MAX_REQUEST_ID_CHARS).is_none() {
            return Some(Ok(id));
        }
    }
    let quote = raw.len().min(4 * REPLACED_ID_QUOTE);
    Some(Err(String::from_utf8_lossy(&raw[..quote])
        .chars()
        .take(REPLACED_ID_QUOTE)
        .collect()))
}

/// A process-unique id for requests that bring none: start time, pid and a counter, in hex.
pub(crate) fn new_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        now ^ (u64::from(std::process::id()) << 44)
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{base:016x}-{n}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::test_headers as headers;
    use bytes::Bytes;

    use crate::config::Trigger;
    use crate::request::Request;

    #[test]
    fn ids_are_unique_and_request_id_header_wins() {
        let a = Request::new(Trigger::Http, "GET", "/", HeaderMap::new(), Bytes::new());
        let b = Request::new(Trigger::Http, "GET", "/", HeaderMap::new(), Bytes::new());
        assert_ne!(a.id, b.id);
        let c = Request::new(
            Trigger::Http,
            "GET",
            "/",
            headers(&[("x-request-id", "abc")]),
            Bytes::new(),
        );
        assert_eq!(c.id, "abc");
    }

    #[test]
    fn a_request_id_is_kept_when_it_is_1_to_200_visible_characters() {
        let with = |raw: &[u8]| {
            let mut h = HeaderMap::new();
            h.insert("x-request-id", http::HeaderValue::from_bytes(raw).unwrap());
            Request::new(Trigger::Http, "GET", "/", h, Bytes::new())
        };
        for kept in [
            "abc".to_string(),
            "café".to_string(),
            "x=1\"'".to_string(),
            "日本".repeat(100),
            "a".repeat(200),
        ] {
            let r = with(kept.as_bytes());
            assert_eq!((r.id.as_str(), r.replaced_id), (kept.as_str(), None));
        }
        let long = "b".repeat(201);
        for (raw, quoted) in [
            (&b"x status=200 error=none"[..], "x status=200 error=none"),
            (b"", ""),
            (b"a\tb", "a\tb"),
            (b"\xffid", "\u{fffd}id"),
            (b"caf\xc3", "caf\u{fffd}"),
            ("a\u{202e}b".as_bytes(), "a\u{202e}b"),
            ("no\u{a0}break".as_bytes(), "no\u{a0}break"),
            (long.as_bytes(), &long[..REPLACED_ID_QUOTE]),
        ] {
            let r = with(raw);
            assert_eq!(r.replaced_id.as_deref(), Some(quoted), "{raw:?}");
            assert!(
                r.id.ends_with(|c: char| c.is_ascii_digit()),
                "a fresh id: {}",
                r.id
            );
            assert_ne!(r.id.as_bytes(), raw);
        }
        // The CloudEvent id wins, whatever the header.
        let mut h = headers(&[("ce-id", "ev-1"), ("ce-type", "t"), ("ce-source", "/s")]);
        h.insert("x-request-id", http::HeaderValue::from_static("a b"));
        let r = Request::new(Trigger::Queue, "POST", "/", h, Bytes::new());
        assert_eq!((r.id.as_str(), r.replaced_id), ("ev-1", None));
    }
}
