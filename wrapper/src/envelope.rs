//! A request, parsed once into [`Request`], and the two forms handlers see it in: the JSON
//! request envelope (stdin in exec mode, one line in persistent mode) and the `RUNR_*` variables
//! of exec mode.
//!
//! The envelope is produced piece by piece ([`EnvelopeStream`]) and written into the handler's
//! stdin as it is encoded, so an invocation holds its body once (as received) plus one encoded
//! piece, never a whole encoded copy next to it.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::config::Trigger;
use crate::response::{ErrorClass, Reply};

/// Longest `X-Request-Id` kept, in characters.
pub const MAX_REQUEST_ID_CHARS: usize = 200;

/// Characters of a replaced `X-Request-Id` the logs quote.
pub const REPLACED_ID_QUOTE: usize = 64;

/// Largest request body; larger ones answer 413 (a declared `Content-Length` before a byte is
/// read).
pub const MAX_BODY: usize = 10 * 1024 * 1024;

/// Body bytes encoded per piece of [`EnvelopeStream`]: a piece is at most 6 times as long
/// once JSON-escaped (`\u0000`), 4/3 as base64. A multiple of 3, so that base64 pieces
/// concatenate to the whole body's base64.
pub const BODY_PIECE: usize = 16 * 1024 * 3;

/// Envelope bytes a writer gathers before a write to a handler's pipe: a pipe's default
/// capacity (see [`EnvelopeStream::fill`]).
pub const WRITE_CHUNK: usize = 64 * 1024;

/// One invocation's request, whatever mode runs it.
#[derive(Debug, Clone)]
pub struct Request {
    /// Where it came from ([`crate::request::trigger`] decides).
    pub trigger: Trigger,
    /// The envelope id: the CloudEvent id, else `X-Request-Id` when it is a [usable
    /// one](client_request_id), else a fresh one.
    pub id: String,
    /// The client's `X-Request-Id` when it was not usable and a fresh id took its place: its
    /// first [`REPLACED_ID_QUOTE`] characters (undecodable bytes as U+FFFD), for the logs.
    pub replaced_id: Option<String>,
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path without the query.
    pub path: String,
    /// The query string as it arrived, without `?`.
    pub raw_query: String,
    /// Request headers (names are lower-case in `HeaderMap`).
    pub headers: HeaderMap,
    /// The whole body (at most [`MAX_BODY`]); empty until [`Request::set_body`], and for raw
    /// exec input, which goes from the connection into the handler as it arrives
    /// ([`BodyReader`]).
    pub body: Bytes,
    /// The CloudEvent attributes (queue and schedule triggers) folded from the `ce-*` headers;
    /// its `data` is made from the body when the envelope is encoded.
    pub event: Option<Map<String, Value>>,
    /// When the invocation times out, in Unix epoch milliseconds: the envelope's `deadlineMs`
    /// and exec mode's `RUNR_DEADLINE_MS` (added to the spec's envelope; set by whoever knows
    /// the deadline, absent until then).
    pub deadline_ms: Option<u64>,
    /// [`Request::exec_vars`], once built.
    exec_vars: OnceLock<Vec<(OsString, OsString)>>,
}

impl Request {
    /// Builds the request value from its HTTP parts. `path_and_query` is the request target
    /// (`/orders?id=1`).
    pub fn new(
        trigger: Trigger,
        method: &str,
        path_and_query: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Request {
        let mut req = Request::head(trigger, method, path_and_query, headers);
        req.set_body(body);
        req
    }

    /// The request from its head alone, before its body is read (the server reads bodies only
    /// once a handler can take them): everything but the body is known.
    pub fn head(
        trigger: Trigger,
        method: &str,
        path_and_query: &str,
        headers: HeaderMap,
    ) -> Request {
        let (path, raw_query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, q),
            None => (path_and_query, ""),
        };
        let event = match trigger {
            Trigger::Queue | Trigger::Schedule => cloud_event(&headers),
            Trigger::Http => None,
        };
        let event_id = event
            .as_ref()
            .and_then(|e| e.get("id"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let (id, replaced_id) = match event_id {
            Some(id) => (id, None),
            None => match client_request_id(&headers) {
                Some(Ok(id)) => (id.to_string(), None),
                Some(Err(replaced)) => (new_id(), Some(replaced)),
                None => (new_id(), None),
            },
        };
        Request {
            trigger,
            id,
            replaced_id,
            method: method.to_string(),
            path: if path.is_empty() { "/" } else { path }.to_string(),
            raw_query: raw_query.to_string(),
            headers,
            body: Bytes::new(),
            event,
            deadline_ms: None,
            exec_vars: OnceLock::new(),
        }
    }

    /// Sets the body once it has been read.
    pub fn set_body(&mut self, body: Bytes) {
        self.body = body;
    }

    /// The query string as an object: `a=1&b=2&b=3` → `{"a":"1","b":["2","3"]}`; a key given
    /// more than once keeps every value, in order.
    pub fn query(&self) -> Map<String, Value> {
        let mut map = Map::new();
        for (k, v) in form_urlencoded::parse(self.raw_query.as_bytes()) {
            let v = Value::String(v.into_owned());
            match map.get_mut(k.as_ref()) {
                None => {
                    map.insert(k.into_owned(), v);
                }
                Some(Value::Array(values)) => values.push(v),
                Some(first) => {
                    let first = first.take();
                    map.insert(k.into_owned(), Value::Array(vec![first, v]));
                }
            }
        }
        map
    }

    /// The CloudEvent with its `data`: the body parsed when the content type is JSON (text
    /// when it does not parse), text when UTF-8, else base64 in `data_base64` as the
    /// CloudEvents JSON format does. Made when the envelope is encoded, not kept: it is a
    /// second copy of the body.
    pub fn event_with_data(&self) -> Option<Value> {
        let mut event = self.event.clone()?;
        let body = &self.body;
        if !body.is_empty() {
            let json = header_str(&self.headers, "content-type").is_some_and(is_json_content_type);
            match (json, std::str::from_utf8(body)) {
                (true, Ok(text)) => {
                    let data =
                        serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.into()));
                    event.insert("data".into(), data);
                }
                (_, Ok(text)) => {
                    event.insert("data".into(), Value::String(text.into()));
                }
                (_, Err(_)) => {
                    let b64 = base64::engine::general_purpose::STANDARD.encode(body);
                    event.insert("data_base64".into(), Value::String(b64));
                }
            }
        }
        Some(Value::Object(event))
    }

    /// The JSON request envelope, whole (the streamed pieces of [`EnvelopeStream`] joined).
    #[cfg(any(test, feature = "fuzz"))]
    pub fn envelope_json(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut stream = EnvelopeStream::new(self);
        while stream.next_piece(&mut out) {}
        out
    }

    /// [`Request::exec_env`], built on the first call and kept: exec mode checks the variables
    /// against what execve takes before admission and passes the same to the handler, and each
    /// build is two allocations per variable. Everything they are made of (the headers,
    /// `deadline_ms`, the event) must be set before the first call.
    pub fn exec_vars(&self) -> &[(OsString, OsString)] {
        self.exec_vars.get_or_init(|| self.exec_env())
    }

    /// The per-invocation variables of exec mode (`RUNR_TRIGGER`, `RUNR_HEADER_<NAME>`, ...),
    /// each name once: header names that map to the same variable (`X-User`, `X_User`) have
    /// their values joined with `, ` in the order they arrived, as a repeated header's are.
    pub fn exec_env(&self) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> = Vec::with_capacity(9 + self.headers.keys_len());
        let mut put = |k: &str, v: &str| env.push((k.into(), v.into()));
        put("RUNR_TRIGGER", self.trigger.as_str());
        put("RUNR_REQUEST_ID", &self.id);
        put("RUNR_METHOD", &self.method);
        put("RUNR_PATH", &self.path);
        put("RUNR_QUERY", &self.raw_query);
        put(
            "RUNR_CONTENT_TYPE",
            header_str(&self.headers, "content-type").unwrap_or(""),
        );
        if let Some(ms) = self.deadline_ms {
            put("RUNR_DEADLINE_MS", &ms.to_string());
        }
        if let Some(event) = &self.event {
            for (attr, var) in [
                ("id", "RUNR_EVENT_ID"),
                ("type", "RUNR_EVENT_TYPE"),
                ("source", "RUNR_EVENT_SOURCE"),
            ] {
                if let Some(v) = event.get(attr).and_then(Value::as_str) {
                    put(var, v);
                }
            }
        }
        let headers_start = env.len();
        // HeaderMap yields every value of a name, in arrival order, before the next name.
        let mut last: Option<(&http::HeaderName, usize)> = None;
        for (name, value) in &self.headers {
            let (slot, first) = match last {
                Some((n, slot)) if n == name => (slot, false),
                _ => {
                    let var = header_var(name.as_str());
                    let known = env[headers_start..]
                        .iter()
                        .position(|(k, _)| k.as_encoded_bytes() == var.as_bytes());
                    match known {
                        Some(i) => (headers_start + i, false),
                        None => {
                            env.push((var.into(), OsString::new()));
                            (env.len() - 1, true)
                        }
                    }
                }
            };
            last = Some((name, slot));
            let joined = &mut env[slot].1;
            if !first {
                joined.push(", ");
            }
            joined.push(OsStr::from_bytes(value.as_bytes()));
        }
        env
    }
}

// === the body ===

/// Why a request body cannot be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// More than [`MAX_BODY`].
    TooLarge,
    /// The client broke off, or its chunked framing is bad.
    Unreadable,
    /// Not all of it had arrived by the invocation's deadline.
    TimedOut,
}

impl BodyError {
    /// A stable name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            BodyError::TooLarge => "body_too_large",
            BodyError::Unreadable => "body_unreadable",
            BodyError::TimedOut => "body_timed_out",
        }
    }

    /// 413, 400 or 408.
    pub fn reply(self) -> Reply {
        match self {
            BodyError::TooLarge => Reply::failure(
                ErrorClass::Limit,
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body exceeds 10 MiB",
            ),
            BodyError::Unreadable => Reply::failure(
                ErrorClass::Request,
                StatusCode::BAD_REQUEST,
                "could not read the request body",
            ),
            BodyError::TimedOut => Reply::failure(
                ErrorClass::Request,
                StatusCode::REQUEST_TIMEOUT,
                "request body not received in time",
            ),
        }
    }
}

/// A request body still on the connection, read only once a handler can take it: whole into
/// one buffer ([`BodyReader::read_whole`]: the envelope needs all of it), or piece by piece as
/// it arrives ([`BodyReader::next`]: raw input goes straight into the handler's stdin, so it is
/// never held at all). At most [`MAX_BODY`] bytes either way.
pub struct BodyReader {
    inner: crate::http::linger::Unread,
    /// Bytes received so far.
    seen: u64,
    /// The first bytes, kept for a replay capture when streamed (up to `keep`).
    kept: Vec<u8>,
    keep: usize,
    done: bool,
}

impl BodyReader {
    /// A reader of `inner` that keeps the first `keep` bytes it streams aside.
    pub fn new(inner: crate::http::linger::Unread, keep: usize) -> BodyReader {
        BodyReader {
            inner,
            seen: 0,
            kept: Vec::new(),
            keep,
            done: false,
        }
    }

    /// The whole body in one buffer, sized from `declared` (`Content-Length`) when there is
    /// one, so it is held exactly once: no growing copies, no frame list joined at the end.
    pub async fn read_whole(&mut self, declared: Option<u64>) -> Result<Bytes, BodyError> {
        let mut buf = Vec::with_capacity(declared.unwrap_or(0).min(MAX_BODY as u64) as usize);
        while let Some(piece) = self.next_data().await {
            buf.extend_from_slice(&piece?);
        }
        Ok(Bytes::from(buf))
    }

    /// The next piece as it arrives (kept aside as far as asked); `None` at the end.
    /// Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<Bytes, BodyError>> {
        let piece = self.next_data().await;
        if let Some(Ok(data)) = &piece {
            let room = self.keep.saturating_sub(self.kept.len());
            self.kept.extend_from_slice(&data[..room.min(data.len())]);
        }
        piece
    }

    async fn next_data(&mut self) -> Option<Result<Bytes, BodyError>> {
        loop {
            let frame = match self.inner.frame().await {
                None => {
                    self.done = true;
                    return None;
                }
                Some(Err(_)) => return Some(Err(BodyError::Unreadable)),
                Some(Ok(frame)) => frame,
            };
            // Trailers carry no body bytes.
            let Ok(data) = frame.into_data() else {
                continue;
            };
            self.seen += data.len() as u64;
            if self.seen > MAX_BODY as u64 {
                return Some(Err(BodyError::TooLarge));
            }
            return Some(Ok(data));
        }
    }

    /// Whether the whole body has been read.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The first bytes streamed, as far as they were kept.
    pub fn kept(&self) -> &[u8] {
        &self.kept
    }

    /// Bytes received so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }
}

/// `X-Api-Key` → `RUNR_HEADER_X_API_KEY`: upper-cased, everything but A–Z and 0–9 becomes `_`.
pub fn header_var(name: &str) -> String {
    let mut var = String::with_capacity(12 + name.len());
    var.push_str("RUNR_HEADER_");
    var.extend(name.chars().map(|c| match c.to_ascii_uppercase() {
        c @ ('A'..='Z' | '0'..='9') => c,
        _ => '_',
    }));
    var
}

/// A header's values joined with `, ` (how HTTP folds repeated fields).
fn joined(headers: &HeaderMap, name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, v) in headers.get_all(name).iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(v.as_bytes());
    }
    out
}

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

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The CloudEvent attributes of a binary-mode request: every `ce-<attr>` header becomes
/// `<attr>`, the content type becomes `datacontenttype` (the body becomes `data` when the
/// envelope is encoded: [`Request::event_with_data`]). `None` when the request carries no
/// `ce-*` header at all.
fn cloud_event(headers: &HeaderMap) -> Option<Map<String, Value>> {
    let mut event = Map::new();
    for name in headers.keys() {
        if let Some(attr) = name.as_str().strip_prefix("ce-") {
            let value = String::from_utf8_lossy(&joined(headers, name.as_str())).into_owned();
            event.insert(attr.to_string(), Value::String(value));
        }
    }
    if event.is_empty() {
        return None;
    }
    if let Some(ct) = header_str(headers, "content-type") {
        event.insert("datacontenttype".into(), Value::String(ct.to_string()));
    }
    Some(event)
}

/// `application/json`, `application/cloudevents+json; charset=utf-8`, `text/json`.
fn is_json_content_type(ct: &str) -> bool {
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence == "text/json" || essence.ends_with("+json")
}

/// A process-unique id for requests that bring none: start time, pid and a counter, in hex.
fn new_id() -> String {
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

// === the envelope, streamed ===

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
    /// The envelope of `req`, from its start.
    pub fn new(req: &'a Request) -> EnvelopeStream<'a> {
        EnvelopeStream {
            req,
            text: std::str::from_utf8(&req.body).ok(),
            next: Part::Head,
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn envelope(req: &Request) -> Value {
        serde_json::from_slice(&req.envelope_json()).unwrap()
    }

    #[test]
    fn the_deadline_goes_into_the_envelope_and_the_variables_when_known() {
        let mut req = Request::new(
            Trigger::Queue,
            "POST",
            "/",
            headers(&[("ce-id", "1"), ("content-type", "application/json")]),
            Bytes::from_static(b"{\"a\":1}"),
        );
        assert!(envelope(&req).get("deadlineMs").is_none());
        let has_var = |req: &Request| {
            req.exec_env()
                .into_iter()
                .find(|(k, _)| k == "RUNR_DEADLINE_MS")
                .map(|(_, v)| v.into_string().unwrap())
        };
        assert_eq!(has_var(&req), None);
        req.deadline_ms = Some(1_728_561_600_123);
        let e = envelope(&req);
        assert_eq!(e["deadlineMs"], 1_728_561_600_123u64);
        assert_eq!(e["event"]["data"]["a"], 1);
        assert_eq!(
            req.envelope_json(),
            whole_envelope(&req),
            "streamed = whole"
        );
        assert_eq!(has_var(&req).as_deref(), Some("1728561600123"));
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
        assert!(!req.envelope_json().contains(&b'\n'));
    }

    #[test]
    fn queue_event_from_ce_headers() {
        let req = Request::new(
            Trigger::Queue,
            "POST",
            "/",
            headers(&[
                ("ce-specversion", "1.0"),
                ("ce-id", "1728561234567-0"),
                ("ce-type", "dev.runr.queue.message"),
                ("ce-source", "/redisstream/orders/orders-api"),
                ("ce-time", "2026-10-10T12:00:00Z"),
                ("content-type", "application/json"),
            ]),
            Bytes::from(r#"{"item":42}"#),
        );
        let e = envelope(&req);
        assert_eq!(e["id"], "1728561234567-0");
        assert_eq!(e["trigger"], "queue");
        let ev = &e["event"];
        assert_eq!(ev["specversion"], "1.0");
        assert_eq!(ev["type"], "dev.runr.queue.message");
        assert_eq!(ev["source"], "/redisstream/orders/orders-api");
        assert_eq!(ev["time"], "2026-10-10T12:00:00Z");
        assert_eq!(ev["datacontenttype"], "application/json");
        assert_eq!(ev["data"], serde_json::json!({"item": 42}));
        assert_eq!(e["body"], r#"{"item":42}"#);

        let env: std::collections::HashMap<_, _> = req.exec_env().into_iter().collect();
        assert_eq!(env[&OsString::from("RUNR_EVENT_ID")], "1728561234567-0");
        assert_eq!(
            env[&OsString::from("RUNR_EVENT_TYPE")],
            "dev.runr.queue.message"
        );
        assert_eq!(
            env[&OsString::from("RUNR_EVENT_SOURCE")],
            "/redisstream/orders/orders-api"
        );
        assert_eq!(env[&OsString::from("RUNR_TRIGGER")], "queue");
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
    fn http_trigger_has_no_event() {
        let req = Request::new(
            Trigger::Http,
            "POST",
            "/",
            headers(&[("ce-id", "1")]),
            Bytes::new(),
        );
        assert!(req.event.is_none());
        assert_ne!(req.id, "1");
    }

    #[test]
    fn exec_env_variables() {
        let req = Request::new(
            Trigger::Http,
            "PUT",
            "/a/b?name=RunR&x=1",
            headers(&[
                ("x-api-key", "secret"),
                ("content-type", "text/plain"),
                ("x.dots-and_", "v"),
            ]),
            Bytes::new(),
        );
        let env: std::collections::HashMap<_, _> = req.exec_env().into_iter().collect();
        let get = |k: &str| env[&OsString::from(k)].to_str().unwrap().to_string();
        assert_eq!(get("RUNR_METHOD"), "PUT");
        assert_eq!(get("RUNR_PATH"), "/a/b");
        assert_eq!(get("RUNR_QUERY"), "name=RunR&x=1");
        assert_eq!(get("RUNR_CONTENT_TYPE"), "text/plain");
        assert_eq!(get("RUNR_HEADER_X_API_KEY"), "secret");
        assert_eq!(get("RUNR_HEADER_X_DOTS_AND_"), "v");
        assert_eq!(get("RUNR_REQUEST_ID"), req.id);
        assert!(!env.contains_key(&OsString::from("RUNR_EVENT_ID")));
    }

    #[test]
    fn header_names_that_map_to_one_variable_are_joined_in_arrival_order() {
        let req = Request::new(
            Trigger::Http,
            "GET",
            "/",
            headers(&[
                ("x-user", "alice"),
                ("x_user", "admin"),
                ("x.user", "eve"),
                ("x-user", "bob"),
                ("accept", "a"),
            ]),
            Bytes::new(),
        );
        let env = req.exec_env();
        let users: Vec<_> = env
            .iter()
            .filter(|(k, _)| k == "RUNR_HEADER_X_USER")
            .map(|(_, v)| v.to_str().unwrap())
            .collect();
        // One variable; each spelling's values in arrival order, spellings in the order they
        // first arrived (HeaderMap keeps no order across names).
        assert_eq!(users, ["alice, bob, admin, eve"]);
        assert_eq!(
            env.iter()
                .filter(|(k, _)| k == "RUNR_HEADER_ACCEPT")
                .count(),
            1
        );
        // The envelope keeps each name as it came.
        let e = envelope(&req);
        assert_eq!(e["headers"]["x-user"], "alice, bob");
        assert_eq!(e["headers"]["x_user"], "admin");
        assert_eq!(e["headers"]["x.user"], "eve");
    }

    #[test]
    fn non_utf8_header_values_reach_the_variables_as_bytes() {
        let mut h = HeaderMap::new();
        h.append("x-raw", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        h.append("x_raw", HeaderValue::from_bytes(b"\xff").unwrap());
        let req = Request::new(Trigger::Http, "GET", "/", h, Bytes::new());
        let env = req.exec_env();
        let v = &env
            .iter()
            .find(|(k, _)| k == "RUNR_HEADER_X_RAW")
            .unwrap()
            .1;
        assert_eq!(v.as_encoded_bytes(), b"caf\xe9, \xff");
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
            let streamed = req.envelope_json();
            assert_eq!(streamed, whole_envelope(&req));
            let mut stream = EnvelopeStream::new(&req);
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
            let mut stream = EnvelopeStream::new(&req);
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
                let streamed = req.envelope_json();
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

    #[test]
    fn header_var_names() {
        assert_eq!(header_var("X-Api-Key"), "RUNR_HEADER_X_API_KEY");
        assert_eq!(header_var("accept-ÿ"), "RUNR_HEADER_ACCEPT__");
    }

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
