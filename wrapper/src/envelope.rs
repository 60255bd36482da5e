//! The JSON request envelope a handler reads (stdin in exec mode, one line in persistent mode),
//! encoded from a [`Request`] piece by piece ([`encode`]) and written into the handler's stdin
//! as it is encoded, so an invocation holds its body once (as received) plus one encoded piece,
//! never a whole encoded copy next to it.

use base64::Engine;
use http::HeaderMap;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::request::{joined, Request};

/// Body bytes encoded per piece of [`EnvelopeStream`]: a piece is at most 6 times as long
/// once JSON-escaped (`\u0000`), 4/3 as base64. A multiple of 3, so that base64 pieces
/// concatenate to the whole body's base64.
pub const BODY_PIECE: usize = 16 * 1024 * 3;

/// Envelope bytes a writer gathers before a write to a handler's pipe: a pipe's default
/// capacity (see [`EnvelopeStream::fill`]).
pub const WRITE_CHUNK: usize = 64 * 1024;

/// The envelope of `req`, from its start.
pub fn encode(req: &Request) -> EnvelopeStream<'_> {
    EnvelopeStream {
        req,
        text: std::str::from_utf8(&req.body).ok(),
        next: Part::Head,
    }
}

/// The request envelope of one request, produced piece by piece:
/// `{"runr":1, "trigger", "id", "method", "path", "query", "rawQuery", "headers", "body",
/// "isBase64Encoded", "event"?, "deadlineMs"?}` on one line (serde_json escapes every newline inside strings).
/// The head (everything before the body) is one piece, the body a piece per [`BODY_PIECE`]
/// bytes of it (JSON-escaped text, or base64 when it is not UTF-8), the rest one piece.
/// Joined, the pieces are byte for byte what serde_json makes of the whole envelope.
pub struct EnvelopeStream<'a> {
    req: &'a Request,
    /// The body when it is UTF-8 (it goes in as a JSON string), else `None` (base64).
    text: Option<&'a str>,
    next: Part,
}

/// Where an [`EnvelopeStream`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Head,
    /// The body from this offset (at its end: the rest of the envelope).
    Body(usize),
    Done,
}

impl<'a> EnvelopeStream<'a> {
    /// Appends the next piece to `out`; `false` (nothing appended) once the envelope is
    /// complete.
    pub fn next_piece(&mut self, out: &mut Vec<u8>) -> bool {
        let req = self.req;
        match self.next {
            Part::Head => {
                let head = Head {
                    runr: 1,
                    trigger: req.trigger.as_str(),
                    id: &req.id,
                    method: &req.method,
                    path: &req.path,
                    query: req.query(),
                    raw_query: &req.raw_query,
                    headers: Headers(&req.headers),
                };
                // Serializing plain strings and maps into a Vec cannot fail.
                let _ = serde_json::to_writer(&mut *out, &head);
                // `{...,"headers":{...}}` goes on as `{...,"headers":{...},"body":"`.
                out.pop();
                out.extend_from_slice(br#","body":""#);
                self.next = Part::Body(0);
            }
            Part::Body(at) if at < req.body.len() => {
                let mut end = (at + BODY_PIECE).min(req.body.len());
                match self.text {
                    Some(text) => {
                        // A piece ends on a character boundary: escaping is per character.
                        while !text.is_char_boundary(end) {
                            end -= 1;
                        }
                        push_escaped(out, &text[at..end]);
                    }
                    None => push_base64(out, &req.body[at..end]),
                }
                self.next = Part::Body(end);
            }
            Part::Body(_) => {
                out.extend_from_slice(br#"","isBase64Encoded":"#);
                let base64: &[u8] = if self.text.is_some() {
                    b"false"
                } else {
                    b"true"
                };
                out.extend_from_slice(base64);
                if let Some(event) = req.event_with_data() {
                    out.extend_from_slice(br#","event":"#);
                    let _ = serde_json::to_writer(&mut *out, &event);
                }
                if let Some(ms) = req.deadline_ms {
                    out.extend_from_slice(br#","deadlineMs":"#);
                    out.extend_from_slice(ms.to_string().as_bytes());
                }
                out.push(b'}');
                self.next = Part::Done;
            }
            Part::Done => return false,
        }
        true
    }

    /// Appends pieces to `out` until it holds at least `at_least` bytes or the envelope is
    /// complete; returns whether more follows. Each write(2) to a pipe wakes its reader, so
    /// writers gather a pipe's worth at a time instead of writing piece by piece (measured on
    /// persistent mode: head, body, tail and newline written apart cost ~9 µs a request at c8).
    pub fn fill(&mut self, out: &mut Vec<u8>, at_least: usize) -> bool {
        while out.len() < at_least {
            if !self.next_piece(out) {
                return false;
            }
        }
        true
    }
}

/// The envelope up to the body.
#[derive(Serialize)]
struct Head<'a> {
    runr: u8,
    trigger: &'a str,
    id: &'a str,
    method: &'a str,
    path: &'a str,
    query: Map<String, Value>,
    #[serde(rename = "rawQuery")]
    raw_query: &'a str,
    headers: Headers<'a>,
}

/// Headers as an object of lower-case names; repeated headers joined with `, `.
struct Headers<'a>(&'a HeaderMap);

impl Serialize for Headers<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.keys_len()))?;
        for name in self.0.keys() {
            let mut values = self.0.get_all(name).iter();
            match (values.next().map(|v| v.to_str()), values.next()) {
                // The common case, without copying: one value, plain text.
                (Some(Ok(text)), None) => map.serialize_entry(name.as_str(), text)?,
                _ => {
                    let value = joined(self.0, name.as_str());
                    map.serialize_entry(name.as_str(), &String::from_utf8_lossy(&value))?
                }
            }
        }
        map.end()
    }
}

/// Appends `text` JSON-escaped, without quotes, exactly as serde_json escapes a string: `"`
/// and `\\` with a backslash, `\b \f \n \r \t` by name, the other controls below 0x20 as
/// `\u00xx`, everything else as it is. Runs that need no escape are found eight bytes at a
/// time and copied whole: bodies are mostly such runs.
fn push_escaped(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    let mut run = 0;
    let mut at = 0;
    while at < bytes.len() {
        if let Some(word) = bytes.get(at..at + 8) {
            let word = u64::from_le_bytes(word.try_into().unwrap_or_default());
            if !needs_escape(word) {
                at += 8;
                continue;
            }
        }
        let b = bytes[at];
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => {
                at += 1;
                continue;
            }
        };
        out.extend_from_slice(&bytes[run..at]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(escape);
        }
        at += 1;
        run = at;
    }
    out.extend_from_slice(&bytes[run..]);
}

/// Whether any of the eight bytes in `word` is `"`, `\\` or below 0x20 (the classic
/// "has a zero byte" bit trick, per kind).
fn needs_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero_in = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS != 0;
    // Below 0x20: subtracting 0x20 from such a byte borrows into its high bit (bytes with the
    // high bit set already are excluded by `!word`).
    let control = word.wrapping_sub(0x20 * ONES) & !word & HIGHS != 0;
    control || zero_in(word ^ (u64::from(b'"') * ONES)) || zero_in(word ^ (u64::from(b'\\') * ONES))
}

/// Appends the standard base64 of `bytes` (padded: only the last piece is not a multiple of
/// 3 long, so the pieces join into the base64 of the whole).
fn push_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    let start = out.len();
    out.resize(start + bytes.len().div_ceil(3) * 4, 0);
    let written = base64::engine::general_purpose::STANDARD
        .encode_slice(bytes, &mut out[start..])
        .unwrap_or(0);
    out.truncate(start + written);
}

/// The envelope made the plain way, whole, with serde_json: what [`EnvelopeStream`] must
/// produce byte for byte (the differential tests and the fuzz target compare the two).
#[cfg(any(test, feature = "fuzz"))]
pub fn whole_envelope(req: &Request) -> Vec<u8> {
    use std::borrow::Cow;

    #[derive(Serialize)]
    struct Envelope<'a> {
        runr: u8,
        trigger: &'a str,
        id: &'a str,
        method: &'a str,
        path: &'a str,
        query: Map<String, Value>,
        #[serde(rename = "rawQuery")]
        raw_query: &'a str,
        headers: Headers<'a>,
        body: Cow<'a, str>,
        #[serde(rename = "isBase64Encoded")]
        is_base64_encoded: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        event: Option<Value>,
        #[serde(rename = "deadlineMs", skip_serializing_if = "Option::is_none")]
        deadline_ms: Option<u64>,
    }
    let (body, is_base64) = match std::str::from_utf8(&req.body) {
        Ok(s) => (Cow::Borrowed(s), false),
        Err(_) => (
            Cow::Owned(base64::engine::general_purpose::STANDARD.encode(&req.body)),
            true,
        ),
    };
    let envelope = Envelope {
        runr: 1,
        trigger: req.trigger.as_str(),
        id: &req.id,
        method: &req.method,
        path: &req.path,
        query: req.query(),
        raw_query: &req.raw_query,
        headers: Headers(&req.headers),
        body,
        is_base64_encoded: is_base64,
        event: req.event_with_data(),
        deadline_ms: req.deadline_ms,
    };
    serde_json::to_vec(&envelope).unwrap_or_default()
}

/// The envelope, whole: the streamed pieces of [`encode`] joined.
#[cfg(any(test, feature = "fuzz"))]
pub fn encoded(req: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    let mut stream = encode(req);
    while stream.next_piece(&mut out) {}
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::request::test_headers as headers;
    use bytes::Bytes;
    use http::HeaderValue;

    use crate::config::Trigger;

    /// The envelope of `req`, parsed.
    pub(crate) fn envelope(req: &Request) -> Value {
        serde_json::from_slice(&encoded(req)).unwrap()
    }

    #[test]
    fn get_with_query_and_headers() {
        let req = Request::new(
            Trigger::Http,
            "GET",
            "/hello?name=Run%20R&x=1&x=2&flag&plus=a+b",
            headers(&[("x-api-key", "k"), ("accept", "a"), ("accept", "b")]),
            Bytes::new(),
        );
        let e = envelope(&req);
        assert_eq!(e["runr"], 1);
        assert_eq!(e["trigger"], "http");
        assert_eq!(e["method"], "GET");
        assert_eq!(e["path"], "/hello");
        assert_eq!(e["rawQuery"], "name=Run%20R&x=1&x=2&flag&plus=a+b");
        assert_eq!(e["query"]["name"], "Run R");
        assert_eq!(e["query"]["x"], serde_json::json!(["1", "2"]));
        assert_eq!(e["query"]["flag"], "");
        assert_eq!(e["query"]["plus"], "a b");
        assert_eq!(e["headers"]["x-api-key"], "k");
        assert_eq!(e["headers"]["accept"], "a, b");
        assert_eq!(e["body"], "");
        assert_eq!(e["isBase64Encoded"], false);
        assert!(e.get("event").is_none());
        assert!(!e["id"].as_str().unwrap().is_empty());
    }

    #[test]
    fn three_values_of_one_key_stay_in_order() {
        let req = Request::new(
            Trigger::Http,
            "GET",
            "/?a=1&b=2&a=3&a=4",
            HeaderMap::new(),
            Bytes::new(),
        );
        assert_eq!(
            envelope(&req)["query"]["a"],
            serde_json::json!(["1", "3", "4"])
        );
    }

    #[test]
    fn binary_body_is_base64() {
        let body = Bytes::from_static(&[0xff, 0x00, 0xfe]);
        let req = Request::new(Trigger::Http, "POST", "/", HeaderMap::new(), body);
        let e = envelope(&req);
        assert_eq!(e["body"], "/wD+");
        assert_eq!(e["isBase64Encoded"], true);
    }

    #[test]
    fn text_body_is_kept() {
        let req = Request::new(
            Trigger::Http,
            "POST",
            "/",
            HeaderMap::new(),
            Bytes::from("héllo\n\"x\""),
        );
        let e = envelope(&req);
        assert_eq!(e["body"], "héllo\n\"x\"");
        assert!(!encoded(&req).contains(&b'\n'));
    }

    #[test]
    fn non_json_event_data_is_text() {
        let req = Request::new(
            Trigger::Queue,
            "POST",
            "/",
            headers(&[("ce-id", "1"), ("content-type", "text/plain")]),
            Bytes::from("{not parsed}"),
        );
        assert_eq!(envelope(&req)["event"]["data"], "{not parsed}");
    }

    #[test]
    fn pieces_join_into_the_whole_envelope_at_piece_boundaries() {
        // Multi-byte characters across the piece boundary, escapes, and binary bodies whose
        // length is and is not a multiple of 3 around it.
        let mut texts: Vec<Vec<u8>> = Vec::new();
        for shift in 0..4 {
            let mut t = "a".repeat(BODY_PIECE - shift).into_bytes();
            t.extend_from_slice("é€😀\"\n\u{1}".repeat(3).as_bytes());
            texts.push(t);
        }
        for len in [
            BODY_PIECE - 1,
            BODY_PIECE,
            BODY_PIECE + 1,
            2 * BODY_PIECE + 2,
        ] {
            texts.push((0..len).map(|i| (i * 7 % 256) as u8 | 0x80).collect());
        }
        for body in texts {
            let req = Request::new(Trigger::Http, "POST", "/", HeaderMap::new(), body.into());
            let streamed = encoded(&req);
            assert_eq!(streamed, whole_envelope(&req));
            let mut stream = encode(&req);
            let mut piece = Vec::new();
            let mut pieces = 0;
            while stream.next_piece(&mut piece) {
                pieces += 1;
                assert!(piece.len() <= 6 * BODY_PIECE + 64, "{}", piece.len());
                piece.clear();
            }
            assert!(pieces >= 3, "head, body pieces, tail");
        }
    }

    #[test]
    fn filled_chunks_join_into_the_whole_envelope_and_a_small_one_is_one_chunk() {
        for len in [0, 10, WRITE_CHUNK - 100, WRITE_CHUNK, 3 * WRITE_CHUNK + 7] {
            let body: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let req = Request::new(Trigger::Http, "POST", "/", HeaderMap::new(), body.into());
            let mut stream = encode(&req);
            let (mut joined, mut chunk, mut chunks) = (Vec::new(), Vec::new(), 0);
            loop {
                let more = stream.fill(&mut chunk, WRITE_CHUNK);
                chunks += 1;
                assert!(
                    chunk.len() < WRITE_CHUNK + 6 * BODY_PIECE + 64,
                    "{}",
                    chunk.len()
                );
                joined.extend_from_slice(&chunk);
                chunk.clear();
                if !more {
                    break;
                }
            }
            assert_eq!(joined, whole_envelope(&req), "body of {len} bytes");
            if len < WRITE_CHUNK - 200 {
                assert_eq!(chunks, 1, "body of {len} bytes");
            }
        }
    }

    #[test]
    fn escaping_is_serde_jsons_for_every_character_at_every_word_position() {
        let chars = (0u32..0x80).chain([0x80, 0xe9, 0x2028, 0x20ac, 0x1f600]);
        for c in chars.filter_map(char::from_u32) {
            for pos in 0..10 {
                let text = format!("{}{c}{}", "a".repeat(pos), "b".repeat(9 - pos.min(9)));
                let mut out = Vec::new();
                push_escaped(&mut out, &text);
                let whole = serde_json::to_vec(&text).unwrap();
                assert_eq!(out, whole[1..whole.len() - 1], "{c:?} at {pos}");
            }
        }
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        /// A body of one of the kinds the encoder treats differently: ASCII, text with
        /// multi-byte characters and characters JSON escapes, or arbitrary bytes.
        fn body() -> impl Strategy<Value = Vec<u8>> {
            let text = proptest::collection::vec(
                prop_oneof![
                    Just("a".to_string()),
                    Just("\"\\/\n\t\u{0}\u{1f}\u{7f}".to_string()),
                    Just("é".to_string()),
                    Just("€".to_string()),
                    Just("😀".to_string()),
                    "[ -~]{1,64}",
                ],
                0..4000,
            )
            .prop_map(|parts| parts.concat().into_bytes());
            let bytes = proptest::collection::vec(any::<u8>(), 0..(3 * BODY_PIECE + 5));
            prop_oneof![text, bytes]
        }

        fn trigger() -> impl Strategy<Value = Trigger> {
            prop_oneof![
                Just(Trigger::Http),
                Just(Trigger::Queue),
                Just(Trigger::Schedule)
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            #[test]
            fn streamed_envelope_is_the_whole_envelope(
                body in body(),
                trigger in trigger(),
                target in "/[a-z0-9%/]{0,12}(\\?[a-z0-9=&%+]{0,24})?",
                values in proptest::collection::vec("[ -~\\x80-\\xff]{0,16}", 0..4),
                json in any::<bool>(),
            ) {
                let mut h = HeaderMap::new();
                for (i, v) in values.iter().enumerate() {
                    let name = ["x-a", "ce-id", "ce-type", "x-a"][i];
                    if let Ok(v) = HeaderValue::from_bytes(v.as_bytes()) {
                        h.append(name, v);
                    }
                }
                if json {
                    h.insert("content-type", HeaderValue::from_static("application/json"));
                }
                let req = Request::new(trigger, "POST", &target, h, body.into());
                let streamed = encoded(&req);
                prop_assert_eq!(&streamed, &whole_envelope(&req));
                // And it is one line of JSON whose body decodes back to the body.
                prop_assert!(!streamed.contains(&b'\n'));
                let v: Value = serde_json::from_slice(&streamed).unwrap();
                let got = match v["isBase64Encoded"].as_bool().unwrap() {
                    true => base64::engine::general_purpose::STANDARD
                        .decode(v["body"].as_str().unwrap())
                        .unwrap(),
                    false => v["body"].as_str().unwrap().as_bytes().to_vec(),
                };
                prop_assert_eq!(&got[..], &req.body[..]);
            }
        }
    }
}
