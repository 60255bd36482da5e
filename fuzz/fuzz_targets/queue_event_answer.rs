//! runr-queue's parsers of untrusted bytes: a stream entry's fields become a JSON body that
//! serde_json reads back to the very same pairs (or the entry is refused for its size or for
//! bytes that are not UTF-8), and the function's Retry-After and X-RunR-Error headers are read
//! within their bounds, never with a panic; a `traceparent` field, valid or not, always gives a
//! valid `traceparent` for the attempt (the producer's trace id kept when it was valid).
#![no_main]

use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;
use runr_queue::fuzz::{
    attempt_traceparent, error_class, event_body, event_time, retry_after, traceparent,
};
use serde::de::{Deserializer, MapAccess, Visitor};

/// Every pair of a JSON object of strings, duplicates and order kept.
fn pairs(json: &[u8]) -> Vec<(String, String)> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<(String, String)>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object of strings")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(kv) = map.next_entry::<String, String>()? {
                out.push(kv);
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(json);
    let v = de
        .deserialize_map(V)
        .expect("the body is a JSON object of strings");
    de.end().expect("nothing after the object");
    v
}

fuzz_target!(|data: &[u8]| {
    // The first two bytes pick the size limit; the rest, split at 0xfe bytes, are names and
    // values in turn (an odd one out gets an empty value).
    if data.len() < 2 {
        return;
    }
    let limit = usize::from(u16::from_le_bytes([data[0], data[1]]));
    let parts: Vec<&[u8]> = data[2..].split(|b| *b == 0xfe).collect();
    let fields: Vec<(Vec<u8>, Vec<u8>)> = parts
        .chunks(2)
        .map(|c| {
            (
                c[0].to_vec(),
                c.get(1).map(|v| v.to_vec()).unwrap_or_default(),
            )
        })
        .collect();
    match event_body(&fields, limit) {
        Ok(body) => {
            assert!(
                body.len() <= limit,
                "{} bytes over a limit of {limit}",
                body.len()
            );
            let want: Vec<(String, String)> = fields
                .iter()
                .map(|(n, v)| {
                    (
                        String::from_utf8(n.clone()).unwrap(),
                        String::from_utf8(v.clone()).unwrap(),
                    )
                })
                .collect();
            assert_eq!(pairs(&body), want);
        }
        Err("limit") => {
            if let Ok(whole) = event_body(&fields, usize::MAX) {
                assert!(
                    whole.len() > limit,
                    "refused {} bytes under {limit}",
                    whole.len()
                );
            }
        }
        Err(_) => assert!(fields
            .iter()
            .any(|(n, v)| std::str::from_utf8(n).is_err() || std::str::from_utf8(v).is_err())),
    }

    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let (wait, ceiling) = retry_after(data, now);
    assert!(wait.is_none_or(|w| w <= ceiling));
    if let Some(class) = error_class(data) {
        assert!((1..=64).contains(&class.len()));
        assert!(class
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)));
    }
    let sent = attempt_traceparent(&[(b"traceparent".to_vec(), data.to_vec())]);
    let (trace, span, flags) = traceparent(sent.as_bytes()).expect("a valid traceparent is sent");
    assert_eq!(sent.len(), 55, "{sent}");
    assert_ne!(span, [0; 8]);
    if let Some((producer_trace, _, producer_flags)) = traceparent(data) {
        assert_eq!(trace, producer_trace);
        assert_eq!(flags, producer_flags);
    } else {
        assert_eq!(flags, 1, "a new trace is sampled");
    }
    if let Ok(id) = std::str::from_utf8(data) {
        if let Some(t) = event_time(id) {
            assert!(t.ends_with('Z') && t.len() >= "1970-01-01T00:00:00.000Z".len());
        }
    }
});
