//! The request every mode uses, parsed once from its head into [`Request`], and what is decided
//! about it before any mode runs it: its id ([`id`]), its CloudEvent ([`cloudevent`]), which
//! trigger sent it ([`trigger`]); and its body, read only once a handler can take it
//! ([`body`]).

pub(crate) mod body;
pub(crate) mod cloudevent;
pub(crate) mod id;
pub(crate) mod trigger;

use std::ffi::OsString;
use std::sync::OnceLock;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Map, Value};

use crate::config::Trigger;

/// One invocation's request, whatever mode runs it.
#[derive(Debug, Clone)]
pub struct Request {
    /// Where it came from ([`crate::request::trigger`] decides).
    pub trigger: Trigger,
    /// The envelope id: the CloudEvent id, else `X-Request-Id` when it is a [usable
    /// one](id::client_request_id), else a fresh one.
    pub id: String,
    /// The client's `X-Request-Id` when it was not usable and a fresh id took its place: its
    /// first [`id::REPLACED_ID_QUOTE`] characters (undecodable bytes as U+FFFD), for the logs.
    pub replaced_id: Option<String>,
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path without the query.
    pub path: String,
    /// The query string as it arrived, without `?`.
    pub raw_query: String,
    /// Request headers (names are lower-case in `HeaderMap`).
    pub headers: HeaderMap,
    /// The whole body (at most [`body::MAX_BODY`]); empty until [`Request::set_body`], and for raw
    /// exec input, which goes from the connection into the handler as it arrives
    /// ([`body::BodyReader`]).
    pub body: Bytes,
    /// The CloudEvent attributes (queue and schedule triggers) folded from the `ce-*` headers;
    /// its `data` is made from the body when the envelope is encoded.
    pub event: Option<Map<String, Value>>,
    /// When the invocation times out, in Unix epoch milliseconds: the envelope's `deadlineMs`
    /// and exec mode's `RUNR_DEADLINE_MS` (added to the spec's envelope; set by whoever knows
    /// the deadline, absent until then).
    pub deadline_ms: Option<u64>,
    /// Exec mode's variables of this request, once built: exec mode checks them against what
    /// execve takes before admission and passes the same to the handler
    /// ([`crate::invoke::exec::env::vars`]); each build is two allocations per variable.
    pub(crate) exec_vars: OnceLock<Vec<(OsString, OsString)>>,
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
            Trigger::Queue | Trigger::Schedule => cloudevent::attributes(&headers),
            Trigger::Http => None,
        };
        let event_id = event
            .as_ref()
            .and_then(|e| e.get("id"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let (id, replaced_id) = match event_id {
            Some(id) => (id, None),
            None => match id::client_request_id(&headers) {
                Some(Ok(id)) => (id.to_string(), None),
                Some(Err(replaced)) => (id::new_id(), Some(replaced)),
                None => (id::new_id(), None),
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
}

/// A header's values joined with `, ` (how HTTP folds repeated fields).
pub(crate) fn joined(headers: &HeaderMap, name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, v) in headers.get_all(name).iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(v.as_bytes());
    }
    out
}

/// A header's value when it is text.
pub(crate) fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Headers of `pairs`, in order (a name may repeat): what the tests build requests from.
#[cfg(test)]
pub(crate) fn test_headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, http::HeaderValue::from_str(v).unwrap());
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::test_headers as headers;

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
}
