//! A request, parsed once into [`Request`], and the two forms handlers see it in: the JSON
//! request envelope (stdin in exec mode, one line in persistent mode) and the `RUNR_*` variables
//! of exec mode.

use std::borrow::Cow;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine;
use bytes::Bytes;
use http::HeaderMap;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::config::Trigger;

/// One invocation's request, whatever mode runs it.
#[derive(Debug, Clone)]
pub struct Request {
    /// Where it came from (the wrapper's `RUNR_TRIGGER`).
    pub trigger: Trigger,
    /// The envelope id: the CloudEvent id, else `X-Request-Id`, else a fresh one.
    pub id: String,
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path without the query.
    pub path: String,
    /// The query string as it arrived, without `?`.
    pub raw_query: String,
    /// Request headers (names are lower-case in `HeaderMap`).
    pub headers: HeaderMap,
    /// The whole body (at most 10 MiB, checked by the server).
    pub body: Bytes,
    /// The CloudEvent (queue and schedule triggers) folded from the `ce-*` headers.
    pub event: Option<Value>,
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
        let (path, raw_query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, q),
            None => (path_and_query, ""),
        };
        let event = match trigger {
            Trigger::Queue | Trigger::Schedule => cloud_event(&headers, &body),
            Trigger::Http => None,
        };
        let id = event
            .as_ref()
            .and_then(|e| e.get("id"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| header_str(&headers, "x-request-id").map(str::to_string))
            .unwrap_or_else(new_id);
        Request {
            trigger,
            id,
            method: method.to_string(),
            path: if path.is_empty() { "/" } else { path }.to_string(),
            raw_query: raw_query.to_string(),
            headers,
            body,
            event,
        }
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

    /// The JSON request envelope, without a trailing newline (serde_json escapes every newline
    /// inside strings, so it is always one line).
    pub fn envelope_json(&self) -> Vec<u8> {
        let (body, is_base64) = match std::str::from_utf8(&self.body) {
            Ok(s) => (Cow::Borrowed(s), false),
            Err(_) => (
                Cow::Owned(base64::engine::general_purpose::STANDARD.encode(&self.body)),
                true,
            ),
        };
        let envelope = Envelope {
            runr: 1,
            trigger: self.trigger.as_str(),
            id: &self.id,
            method: &self.method,
            path: &self.path,
            query: self.query(),
            raw_query: &self.raw_query,
            headers: Headers(&self.headers),
            body,
            is_base64_encoded: is_base64,
            event: self.event.as_ref(),
        };
        // Serializing plain strings and maps into a Vec cannot fail.
        serde_json::to_vec(&envelope).unwrap_or_default()
    }

    /// The per-invocation variables of exec mode (`RUNR_TRIGGER`, `RUNR_HEADER_<NAME>`, ...).
    pub fn exec_env(&self) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> = Vec::with_capacity(8 + self.headers.len());
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
        for name in self.headers.keys() {
            let value = joined(&self.headers, name.as_str());
            env.push((header_var(name.as_str()).into(), OsString::from_vec(value)));
        }
        env
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

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The CloudEvent of a binary-mode request: every `ce-<attr>` header becomes `<attr>`, the
/// content type becomes `datacontenttype`, and the body is `data` (parsed when it is JSON,
/// text when UTF-8, else base64 in `data_base64` as the CloudEvents JSON format does).
/// `None` when the request carries no `ce-*` header at all.
fn cloud_event(headers: &HeaderMap, body: &Bytes) -> Option<Value> {
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
    let content_type = header_str(headers, "content-type");
    if let Some(ct) = content_type {
        event.insert("datacontenttype".into(), Value::String(ct.to_string()));
    }
    if !body.is_empty() {
        let json = content_type.is_some_and(is_json_content_type);
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

/// The wire shape of the request envelope.
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
    event: Option<&'a Value>,
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
}
