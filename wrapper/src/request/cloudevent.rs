//! The binary-mode CloudEvent of a queue or schedule request: its attributes folded from the
//! `ce-*` headers when the request is parsed ([`attributes`]), its `data` made from the body
//! only when the envelope is encoded ([`Request::event_with_data`]). Which requests are read
//! for one is [`super::trigger`]'s decision.

use base64::Engine;
use http::HeaderMap;
use serde_json::{Map, Value};

use super::{header_str, joined, Request};

/// The CloudEvent attributes of a binary-mode request: every `ce-<attr>` header becomes
/// `<attr>`, the content type becomes `datacontenttype` (the body becomes `data` when the
/// envelope is encoded: [`Request::event_with_data`]). `None` when the request carries no
/// `ce-*` header at all.
pub fn attributes(headers: &HeaderMap) -> Option<Map<String, Value>> {
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

impl Request {
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
