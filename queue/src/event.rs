//! The queue CloudEvent in the HTTP binary content mode: attributes as `ce-*` headers, the
//! entry's fields as a JSON object of strings in the body.
//!
//! The fields come from whoever wrote to the stream: arbitrary bytes, any number of them, names
//! repeated or not. [`encode_body`] turns them into JSON without ever holding more than the
//! size limit, and refuses what a JSON string cannot carry.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The CloudEvents constants live in runr-base, shared with runr-tick and the wrapper, which
/// reads `ce-type` to tell a queue invocation from a tick: producer and reader cannot drift.
pub use runr_base::cloudevent::{CONTENT_TYPE, QUEUE_EVENT_TYPE as EVENT_TYPE, SPECVERSION};
/// The header carrying the attempt number (1 for the first delivery).
pub const ATTEMPT_HEADER: &str = "x-runr-delivery-attempt";

/// `ce-source`: `/redisstream/<stream>/<group>`.
pub fn source(stream: &str, group: &str) -> String {
    format!("/redisstream/{stream}/{group}")
}

/// `ce-time`: when the entry was added, from the milliseconds part of its id
/// (`<ms>-<seq>`), RFC 3339 in UTC with milliseconds. The same on every attempt. `None` for an
/// id that is not of that form (Redis never makes one).
pub fn time_of_id(id: &str) -> Option<String> {
    let (ms, seq) = id.split_once('-')?;
    if ms.is_empty() || !ms.bytes().all(|b| b.is_ascii_digit()) || seq.parse::<u64>().is_err() {
        return None;
    }
    let ms: u64 = ms.parse().ok()?;
    let t = UNIX_EPOCH.checked_add(Duration::from_millis(ms))?;
    Some(runr_base::fmt::rfc3339_millis(t))
}

/// `ce-time` for an entry: [`time_of_id`], or now.
pub fn time_for(id: &str) -> String {
    time_of_id(id).unwrap_or_else(|| runr_base::fmt::rfc3339_millis(SystemTime::now()))
}

/// Why an entry cannot become an event body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The JSON would be larger than the limit.
    #[error("the event body would exceed {limit} bytes")]
    TooLarge {
        /// The limit (`RUNR_QUEUE_MAX_BODY`).
        limit: usize,
    },
    /// A field name or value is not UTF-8, which a JSON string cannot carry unchanged.
    #[error("field {index} is not UTF-8")]
    NotUtf8 {
        /// Index of the name/value pair.
        index: usize,
    },
}

impl BodyError {
    /// The `runr-error` class of the dead-letter entry.
    pub fn class(&self) -> &'static str {
        match self {
            BodyError::TooLarge { .. } => "limit",
            BodyError::NotUtf8 { .. } => "encoding",
        }
    }
}

/// The fields as a JSON object of strings, `{"name":"value",...}`, in the order Redis keeps
/// them; a name that repeats is repeated (JSON allows it; most parsers keep the last). Strings
/// are escaped exactly as serde_json escapes them. At most `limit` bytes are ever allocated.
pub fn encode_body(fields: &[(Vec<u8>, Vec<u8>)], limit: usize) -> Result<Vec<u8>, BodyError> {
    let mut out = Vec::with_capacity(estimate(fields).min(limit));
    out.push(b'{');
    for (index, (name, value)) in fields.iter().enumerate() {
        let name = std::str::from_utf8(name).map_err(|_| BodyError::NotUtf8 { index })?;
        let value = std::str::from_utf8(value).map_err(|_| BodyError::NotUtf8 { index })?;
        if index > 0 {
            out.push(b',');
        }
        push_string(&mut out, name, limit)?;
        out.push(b':');
        push_string(&mut out, value, limit)?;
    }
    out.push(b'}');
    if out.len() > limit {
        return Err(BodyError::TooLarge { limit });
    }
    Ok(out)
}

/// The body's size when nothing needs escaping.
fn estimate(fields: &[(Vec<u8>, Vec<u8>)]) -> usize {
    2 + fields
        .iter()
        .map(|(n, v)| n.len() + v.len() + 6)
        .sum::<usize>()
}

/// Appends `s` as a JSON string; fails as soon as `out` would pass `limit`.
fn push_string(out: &mut Vec<u8>, s: &str, limit: usize) -> Result<(), BodyError> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // Two quotes at least; escapes are checked as they come.
    if out.len() + s.len() + 2 > limit {
        return Err(BodyError::TooLarge { limit });
    }
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
        if out.len() + (bytes.len() - start) + 1 > limit {
            return Err(BodyError::TooLarge { limit });
        }
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::de::{Deserializer, MapAccess, Visitor};

    fn pairs(v: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        v.iter()
            .map(|(a, b)| (a.as_bytes().to_vec(), b.as_bytes().to_vec()))
            .collect()
    }

    /// The reference: serde_json's parser, keeping every pair (duplicates too) in order.
    fn parse_pairs(json: &[u8]) -> Vec<(String, String)> {
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
        let v = de.deserialize_map(V).expect("valid JSON object of strings");
        de.end().expect("nothing after the object");
        v
    }

    #[test]
    fn known_bodies() {
        assert_eq!(encode_body(&[], 100).unwrap(), b"{}");
        assert_eq!(
            encode_body(&pairs(&[("msg", "hi")]), 100).unwrap(),
            br#"{"msg":"hi"}"#
        );
        assert_eq!(
            encode_body(
                &pairs(&[("a", "1"), ("a", "2"), ("q", "\"\\\n\u{1}é/")]),
                100
            )
            .unwrap(),
            "{\"a\":\"1\",\"a\":\"2\",\"q\":\"\\\"\\\\\\n\\u0001é/\"}".as_bytes()
        );
    }

    #[test]
    fn the_limit_is_exact() {
        let f = pairs(&[("k", "vvvv")]);
        let body = br#"{"k":"vvvv"}"#;
        assert_eq!(encode_body(&f, body.len()).unwrap(), body);
        assert_eq!(
            encode_body(&f, body.len() - 1),
            Err(BodyError::TooLarge {
                limit: body.len() - 1
            })
        );
        // Escapes count: 10 newlines are 20 bytes of JSON.
        let f = pairs(&[("k", "\n\n\n\n\n\n\n\n\n\n")]);
        assert_eq!(encode_body(&f, 28).unwrap().len(), 28);
        assert!(encode_body(&f, 27).is_err());
    }

    #[test]
    fn non_utf8_is_refused() {
        let f = vec![
            (b"ok".to_vec(), b"ok".to_vec()),
            (b"k".to_vec(), vec![0xff]),
        ];
        assert_eq!(encode_body(&f, 100), Err(BodyError::NotUtf8 { index: 1 }));
        assert_eq!(BodyError::NotUtf8 { index: 1 }.class(), "encoding");
        assert_eq!(BodyError::TooLarge { limit: 1 }.class(), "limit");
    }

    #[test]
    fn times_from_ids() {
        assert_eq!(
            time_of_id("1728561234567-0").as_deref(),
            Some("2024-10-10T11:53:54.567Z")
        );
        assert_eq!(
            time_of_id("0-1").as_deref(),
            Some("1970-01-01T00:00:00.000Z")
        );
        for bad in [
            "",
            "-",
            "1",
            "1-",
            "-1",
            "a-1",
            "1-b",
            "+1-0",
            "99999999999999999999-0",
        ] {
            assert_eq!(time_of_id(bad), None, "{bad:?}");
        }
        assert!(time_for("junk").ends_with('Z'));
        assert_eq!(
            source("orders", "orders-api"),
            "/redisstream/orders/orders-api"
        );
    }

    fn field() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            // Mostly text with everything JSON must escape.
            "[a-z\"\\\\/\u{0}-\u{1f}\u{7f}é€😀 ]{0,40}".prop_map(String::into_bytes),
            // Sometimes any bytes at all.
            proptest::collection::vec(any::<u8>(), 0..16),
        ]
    }

    proptest! {
        /// The body is exactly what serde_json writes for the same strings, parses back to the
        /// same pairs, never exceeds the limit, and is refused only for non-UTF-8 or size.
        #[test]
        fn body_agrees_with_serde_json(
            fields in proptest::collection::vec((field(), field()), 0..8),
            limit in 2usize..600,
        ) {
            let utf8: Option<Vec<(String, String)>> = fields
                .iter()
                .map(|(n, v)| Some((String::from_utf8(n.clone()).ok()?, String::from_utf8(v.clone()).ok()?)))
                .collect();
            match (encode_body(&fields, limit), utf8) {
                (Ok(body), Some(strings)) => {
                    prop_assert!(body.len() <= limit);
                    prop_assert_eq!(parse_pairs(&body), strings.clone());
                    let mut reference = String::from("{");
                    for (i, (n, v)) in strings.iter().enumerate() {
                        if i > 0 { reference.push(','); }
                        reference.push_str(&serde_json::to_string(n).unwrap());
                        reference.push(':');
                        reference.push_str(&serde_json::to_string(v).unwrap());
                    }
                    reference.push('}');
                    prop_assert_eq!(String::from_utf8(body).unwrap(), reference);
                }
                (Err(BodyError::TooLarge { .. }), Some(strings)) => {
                    let full = encode_body(&fields, usize::MAX).unwrap();
                    prop_assert!(full.len() > limit, "refused {} bytes under a limit of {}", full.len(), limit);
                    prop_assert_eq!(parse_pairs(&full), strings);
                }
                (Err(BodyError::NotUtf8 { index }), None) => {
                    let (n, v) = &fields[index];
                    prop_assert!(std::str::from_utf8(n).is_err() || std::str::from_utf8(v).is_err());
                }
                (Err(BodyError::TooLarge { .. }), None) => {
                    // Size is checked as the pairs are written: a too-large prefix is found
                    // before a bad pair later on.
                    let first_bad = fields.iter().position(|(n, v)| std::str::from_utf8(n).is_err() || std::str::from_utf8(v).is_err()).unwrap();
                    prop_assert!(encode_body(&fields[..first_bad], usize::MAX).unwrap().len() > limit);
                }
                (got, utf8) => prop_assert!(false, "{:?} for utf8 = {:?}", got, utf8.is_some()),
            }
        }

        /// Any id either gives a timestamp in RFC 3339 shape or none, never a panic.
        #[test]
        fn any_id_is_safe(id in "[0-9a-z+-]{0,24}") {
            if let Some(t) = time_of_id(&id) {
                prop_assert_eq!(t.len(), "1970-01-01T00:00:00.000Z".len());
            }
        }
    }
}
