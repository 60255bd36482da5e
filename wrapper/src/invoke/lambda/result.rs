//! What a function answered → the HTTP answer, per trigger:
//!
//! - http: as API Gateway maps payload format 2.0 results ([`http_reply`]): an object with
//!   `statusCode` gives the status, `headers`, `cookies` (each a `Set-Cookie`) and `body`
//!   (base64-decoded with `isBase64Encoded`); any other valid JSON is a 200 `application/json`
//!   answer with that JSON as the body;
//! - queue: 200, unless the result names the message in `batchItemFailures` ([`queue_reply`]);
//! - schedule and the emulator's invoke API: the result as it is ([`plain_reply`]);
//! - a function error (`/error`) → 502 `{"error": errorMessage, "errorType": …}`
//!   ([`error_reply`]).
//!
//! Streamed responses start with the HTTP-integration prelude ([`split_prelude`]) and may end
//! with error trailers ([`trailer_error`]). Nothing here panics on what a function sends.

use base64::Engine;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, SET_COOKIE};
use http::{HeaderMap, StatusCode};
use serde_json::{Map, Value};

use crate::response::{
    body_from_json, headers_from_json, status_code, ErrorClass, Reply, ERROR_HEADER, JSON, OCTETS,
    TEXT,
};

/// The content type of a streamed response that starts with the HTTP-integration prelude.
pub const HTTP_INTEGRATION: &str = "application/vnd.awslambda.http-integration-response";
/// What ends the prelude: eight NUL bytes.
pub const PRELUDE_DELIMITER: [u8; 8] = [0; 8];
/// The prelude must end within this many bytes (API Gateway's limit for it).
pub const MAX_PRELUDE: usize = 16 * 1024;
/// The trailer naming the error of a stream that failed midway.
pub const ERROR_TYPE_TRAILER: &str = "lambda-runtime-function-error-type";
/// The trailer with that error's body, base64.
pub const ERROR_BODY_TRAILER: &str = "lambda-runtime-function-error-body";
/// Longest error message an answer repeats (the rest is in the logs).
const MAX_ERROR_MESSAGE: usize = 4096;

/// A function's error, from `/invocation/{id}/error`, `/init/error` or error trailers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionError {
    /// `errorType` of the body, else the `Lambda-Runtime-Function-Error-Type` header, else
    /// `Unhandled`.
    pub error_type: String,
    /// `errorMessage` of the body (or the body's text when it is not an error object).
    pub message: String,
    /// The body as the runtime sent it (the emulator's invoke API answers it).
    pub body: Bytes,
}

impl FunctionError {
    /// An error the wrapper states itself (a runtime that exited during init).
    pub fn new(error_type: &str, message: String) -> FunctionError {
        let body = serde_json::to_vec(&serde_json::json!({
            "errorMessage": message,
            "errorType": error_type,
        }))
        .unwrap_or_default();
        FunctionError {
            error_type: error_type.to_string(),
            message,
            body: Bytes::from(body),
        }
    }
}

/// Reads an error body: `{"errorMessage", "errorType", "stackTrace"}` as the Runtime API
/// documents it; anything else counts as the message, and `header_type` (the
/// `Lambda-Runtime-Function-Error-Type` header) names the type when the body does not.
pub fn parse_error(header_type: Option<&str>, body: Bytes) -> FunctionError {
    let fallback_type = header_type
        .filter(|t| !t.trim().is_empty())
        .unwrap_or("Unhandled");
    let (error_type, message) = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(map)) => {
            let error_type = map
                .get("errorType")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
                .unwrap_or(fallback_type)
                .to_string();
            let message = match map.get("errorMessage") {
                Some(Value::String(s)) => s.clone(),
                None | Some(Value::Null) => String::new(),
                Some(other) => other.to_string(),
            };
            (error_type, message)
        }
        _ => (
            fallback_type.to_string(),
            String::from_utf8_lossy(body.trim_ascii()).into_owned(),
        ),
    };
    FunctionError {
        error_type: truncate(error_type, 256),
        message: truncate(message, MAX_ERROR_MESSAGE),
        body,
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// 502 `{"error": errorMessage, "errorType": errorType}` (the message falls back to the type
/// when the function gave none).
pub fn error_reply(err: &FunctionError) -> Reply {
    let message = if err.message.is_empty() {
        &err.error_type
    } else {
        &err.message
    };
    let body = serde_json::to_vec(&serde_json::json!({
        "error": message,
        "errorType": err.error_type,
    }))
    .unwrap_or_default();
    Reply::with_type(StatusCode::BAD_GATEWAY, JSON, Bytes::from(body))
}

/// The answer to the invocations a runtime's init error failed: [`error_reply`] marked as the
/// wrapper's own `start` failure (the function never got to answer).
pub fn init_error_reply(err: &FunctionError) -> Reply {
    let mut reply = error_reply(err);
    reply.headers.push((
        ERROR_HEADER,
        HeaderValue::from_static(ErrorClass::Start.as_str()),
    ));
    reply
}

/// A result as API Gateway maps a payload format 2.0 result (see the module docs); a result
/// that is not JSON, or an object with a bad `statusCode` or base64 body, answers 502 `crash`
/// (nothing the function sent can be answered).
pub fn http_reply(result: &Bytes) -> Reply {
    let text = result.trim_ascii();
    let value: Value = match serde_json::from_slice(text) {
        Ok(v) => v,
        Err(_) => {
            return Reply::failure(
                ErrorClass::Crash,
                StatusCode::BAD_GATEWAY,
                "the function's result is not JSON",
            )
        }
    };
    match value {
        Value::Object(map) if map.contains_key("statusCode") => from_v2_object(map),
        // `text` is a sub-slice of `result`: no copy.
        _ => Reply::with_type(StatusCode::OK, JSON, result.slice_ref(text)),
    }
}

fn from_v2_object(mut map: Map<String, Value>) -> Reply {
    let Some(status) = map.get("statusCode").and_then(status_code) else {
        let got = map
            .get("statusCode")
            .map(Value::to_string)
            .unwrap_or_default();
        return Reply::failure(
            ErrorClass::Crash,
            StatusCode::BAD_GATEWAY,
            &format!("the function returned an invalid statusCode {got}"),
        );
    };
    let mut headers = Vec::new();
    if let Some(h) = map.get("headers") {
        headers_from_json(h, &mut headers);
    }
    if let Some(c) = map.get("cookies") {
        add_cookies(c, &mut headers);
    }
    let Ok((body, default_type)) = body_from_json(&mut map) else {
        return Reply::failure(
            ErrorClass::Crash,
            StatusCode::BAD_GATEWAY,
            "the function returned isBase64Encoded with a body that is not base64",
        );
    };
    if let Some(t) = default_type.filter(|_| !body.is_empty()) {
        if !headers.iter().any(|(n, _)| n == CONTENT_TYPE) {
            headers.push((CONTENT_TYPE, HeaderValue::from_static(t)));
        }
    }
    Reply {
        status,
        headers,
        body,
    }
}

/// `cookies`: each string one `Set-Cookie`.
fn add_cookies(cookies: &Value, out: &mut Vec<(HeaderName, HeaderValue)>) {
    let Value::Array(cookies) = cookies else {
        return;
    };
    for c in cookies.iter().filter_map(Value::as_str) {
        match HeaderValue::from_str(c) {
            Ok(v) => out.push((SET_COOKIE, v)),
            Err(_) => tracing::warn!("the function returned an invalid cookie; dropped"),
        }
    }
}

/// The answer of a queue invocation: 500 when the result's `batchItemFailures` names the
/// message (or names something that is not a message of this batch of one, which Lambda also
/// takes as the whole batch failing), so the queue delivers it again; else 200 with the result.
pub fn queue_reply(result: &Bytes, message_id: &str) -> Reply {
    if let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(result.trim_ascii()) {
        if let Some(Value::Array(failures)) = map.get("batchItemFailures") {
            if let Some(item) = failures.first() {
                let named = item.get("itemIdentifier").and_then(Value::as_str);
                let message = match named {
                    Some(id) if id == message_id => {
                        format!("the function reported message {message_id} as failed")
                    }
                    _ => format!(
                        "the function's batchItemFailures names no message of this batch ({message_id}): the batch failed"
                    ),
                };
                return Reply::error(StatusCode::INTERNAL_SERVER_ERROR, &message);
            }
        }
    }
    plain_reply(result, None)
}

/// A result as it is, with 200: the runtime's content type when it gave one, else
/// `application/json` when the result is JSON and text otherwise.
pub fn plain_reply(result: &Bytes, content_type: Option<&HeaderValue>) -> Reply {
    let content_type = match content_type {
        Some(ct) => ct.clone(),
        None => {
            let is_json = !result.trim_ascii().is_empty()
                && serde_json::from_slice::<serde::de::IgnoredAny>(result).is_ok();
            HeaderValue::from_static(if is_json { JSON } else { TEXT })
        }
    };
    Reply {
        status: StatusCode::OK,
        headers: vec![(CONTENT_TYPE, content_type)],
        body: result.clone(),
    }
}

/// What the start of a streamed HTTP-integration response holds so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Prelude {
    /// The delimiter has not come yet (and the start is still within [`MAX_PRELUDE`]).
    NeedMore,
    /// The answer's head, and how many bytes of the start the prelude and delimiter took.
    Head {
        /// Status and headers (no body).
        reply: Reply,
        /// Bytes of the input used; the rest is the body.
        consumed: usize,
    },
    /// Not a prelude: why.
    Invalid(String),
}

/// Looks for the prelude (`{"statusCode", "headers", "cookies"}`, then eight NUL bytes) at the
/// start of a streamed HTTP-integration response. `start` is everything received so far.
pub fn split_prelude(start: &[u8]) -> Prelude {
    let end = start
        .windows(PRELUDE_DELIMITER.len())
        .position(|w| w == PRELUDE_DELIMITER);
    let Some(end) = end else {
        return if start.len() >= MAX_PRELUDE + PRELUDE_DELIMITER.len() {
            Prelude::Invalid(format!(
                "the streamed response has no prelude within {MAX_PRELUDE} bytes"
            ))
        } else {
            Prelude::NeedMore
        };
    };
    if end > MAX_PRELUDE {
        return Prelude::Invalid(format!(
            "the streamed response's prelude is longer than {MAX_PRELUDE} bytes"
        ));
    }
    let map = match serde_json::from_slice::<Value>(start[..end].trim_ascii()) {
        Ok(Value::Object(map)) => map,
        _ => {
            return Prelude::Invalid(
                "the streamed response's prelude is not a JSON object".to_string(),
            )
        }
    };
    let status = match map.get("statusCode") {
        None | Some(Value::Null) => StatusCode::OK,
        Some(v) => match status_code(v) {
            Some(s) => s,
            None => {
                return Prelude::Invalid(format!(
                    "the streamed response's prelude has an invalid statusCode {v}"
                ))
            }
        },
    };
    let mut headers = Vec::new();
    if let Some(h) = map.get("headers") {
        headers_from_json(h, &mut headers);
    }
    if let Some(c) = map.get("cookies") {
        add_cookies(c, &mut headers);
    }
    if !headers.iter().any(|(n, _)| n == CONTENT_TYPE) {
        headers.push((CONTENT_TYPE, HeaderValue::from_static(OCTETS)));
    }
    Prelude::Head {
        reply: Reply {
            status,
            headers,
            body: Bytes::new(),
        },
        consumed: end + PRELUDE_DELIMITER.len(),
    }
}

/// The error a stream's trailers report (`Lambda-Runtime-Function-Error-Type`, and
/// `Lambda-Runtime-Function-Error-Body` in base64), if they report one.
pub fn trailer_error(trailers: &HeaderMap) -> Option<FunctionError> {
    let error_type = trailers.get(ERROR_TYPE_TRAILER)?;
    let error_type = String::from_utf8_lossy(error_type.as_bytes())
        .trim()
        .to_string();
    if error_type.is_empty() {
        return None;
    }
    let body = trailers
        .get(ERROR_BODY_TRAILER)
        .map(|v| {
            base64::engine::general_purpose::STANDARD
                .decode(v.as_bytes().trim_ascii())
                .unwrap_or_else(|_| v.as_bytes().to_vec())
        })
        .unwrap_or_default();
    Some(parse_error(Some(&error_type), Bytes::from(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(r: &'a Reply, name: &str) -> Vec<&'a str> {
        r.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.to_str().unwrap())
            .collect()
    }

    fn http(s: &str) -> Reply {
        http_reply(&Bytes::from(s.to_string()))
    }

    #[test]
    fn v2_objects() {
        let r = http(
            r#"{"statusCode": 201, "headers": {"Content-Type": "text/html", "X-N": 7, "X-B": true, "X-Null": null, "Content-Length": "9"},
                "cookies": ["a=1; Path=/", "b=2"], "body": "<b>x</b>"}"#,
        );
        assert_eq!(r.status, 201);
        assert_eq!(header(&r, "content-type"), ["text/html"]);
        assert_eq!(header(&r, "x-n"), ["7"]);
        assert_eq!(header(&r, "x-b"), ["true"]);
        assert!(header(&r, "x-null").is_empty());
        assert!(header(&r, "content-length").is_empty());
        assert_eq!(header(&r, "set-cookie"), ["a=1; Path=/", "b=2"]);
        // X-RunR-Error is the wrapper's word, as for every other mode.
        let forged = http(r#"{"statusCode": 500, "headers": {"X-RunR-Error": "timeout"}}"#);
        assert!(header(&forged, "x-runr-error").is_empty());
        assert_eq!(r.body, "<b>x</b>");

        let r = http(r#"{"statusCode": 200, "body": "/wD+", "isBase64Encoded": true}"#);
        assert_eq!(
            (&r.body[..], header(&r, "content-type")),
            (&[0xff, 0, 0xfe][..], vec![OCTETS])
        );
        let r = http(r#"{"statusCode": 200, "body": "hi"}"#);
        assert_eq!(header(&r, "content-type"), [TEXT]);
        let r = http(r#"{"statusCode": 204}"#);
        assert_eq!(
            (r.status.as_u16(), r.body.len(), r.headers.len()),
            (204, 0, 0)
        );
        let r = http(r#"{"statusCode": 200, "body": {"a": 1}}"#);
        assert_eq!(
            (header(&r, "content-type"), &r.body[..]),
            (vec![JSON], &br#"{"a":1}"#[..])
        );
    }

    #[test]
    fn any_other_json_is_a_200_json_body_as_sent() {
        for (result, body) in [
            (" {\"message\": \"hi\"} \n", "{\"message\": \"hi\"}"),
            ("\"Hello from Lambda!\"", "\"Hello from Lambda!\""),
            ("[1, 2]", "[1, 2]"),
            ("42", "42"),
            ("null", "null"),
        ] {
            let r = http(result);
            assert_eq!(r.status, 200, "{result}");
            assert_eq!(header(&r, "content-type"), [JSON]);
            assert_eq!(r.body, body);
        }
    }

    #[test]
    fn bad_results_are_502() {
        for bad in [
            "not json",
            "",
            r#"{"statusCode": "200"}"#,
            r#"{"statusCode": 99}"#,
            r#"{"statusCode": 200.5}"#,
            r#"{"statusCode": 200, "body": "!!", "isBase64Encoded": true}"#,
        ] {
            let r = http(bad);
            assert_eq!(r.status, 502, "{bad}");
            assert_eq!(header(&r, "content-type"), [JSON]);
            // Nothing the function sent could be answered: the wrapper's own crash answer.
            assert_eq!(header(&r, "x-runr-error"), ["crash"], "{bad}");
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            assert!(
                v["error"].as_str().unwrap().starts_with("the function"),
                "{v}"
            );
        }
    }

    #[test]
    fn errors() {
        let e = parse_error(
            Some("Unhandled"),
            Bytes::from_static(
                br#"{"errorMessage": "boom", "errorType": "ValueError", "stackTrace": ["a"]}"#,
            ),
        );
        assert_eq!(
            (e.error_type.as_str(), e.message.as_str()),
            ("ValueError", "boom")
        );
        assert_eq!(
            error_reply(&e).body,
            r#"{"error":"boom","errorType":"ValueError"}"#
        );
        assert_eq!(error_reply(&e).status, 502);
        // A function error is the function's own answer; an init error is the wrapper's.
        assert!(header(&error_reply(&e), "x-runr-error").is_empty());
        let init = init_error_reply(&e);
        assert_eq!(
            (
                init.status.as_u16(),
                header(&init, "x-runr-error"),
                &init.body
            ),
            (502, vec!["start"], &error_reply(&e).body)
        );
        let e = parse_error(
            Some("Runtime.Custom"),
            Bytes::from_static(b" plain text \n"),
        );
        assert_eq!(
            (e.error_type.as_str(), e.message.as_str()),
            ("Runtime.Custom", "plain text")
        );
        let e = parse_error(None, Bytes::new());
        assert_eq!(
            error_reply(&e).body,
            r#"{"error":"Unhandled","errorType":"Unhandled"}"#
        );
        let e = parse_error(None, Bytes::from_static(br#"{"errorMessage": {"a": 1}}"#));
        assert_eq!(e.message, r#"{"a":1}"#);
        let long = "é".repeat(5000);
        let e = parse_error(None, Bytes::from(long));
        assert!(e.message.len() <= MAX_ERROR_MESSAGE && e.message.len() > 4000);
    }

    #[test]
    fn queue_results() {
        let ok = queue_reply(&Bytes::from_static(b"{\"done\": true}"), "m-1");
        assert_eq!(
            (ok.status.as_u16(), &ok.body[..]),
            (200, &b"{\"done\": true}"[..])
        );
        let none = queue_reply(&Bytes::from_static(br#"{"batchItemFailures": []}"#), "m-1");
        assert_eq!(none.status, 200);
        let failed = queue_reply(
            &Bytes::from_static(br#"{"batchItemFailures": [{"itemIdentifier": "m-1"}]}"#),
            "m-1",
        );
        assert_eq!(failed.status, 500);
        assert_eq!(
            failed.body,
            r#"{"error":"the function reported message m-1 as failed"}"#
        );
        for other in [
            r#"{"batchItemFailures": [{"itemIdentifier": "m-2"}]}"#,
            r#"{"batchItemFailures": [{"itemIdentifier": null}]}"#,
            r#"{"batchItemFailures": [{}]}"#,
        ] {
            assert_eq!(
                queue_reply(&Bytes::from(other), "m-1").status,
                500,
                "{other}"
            );
        }
        let text = queue_reply(&Bytes::from_static(b"done"), "m-1");
        assert_eq!(
            (text.status.as_u16(), header(&text, "content-type")),
            (200, vec![TEXT])
        );
    }

    #[test]
    fn preludes() {
        let mut start = br#"{"statusCode":201,"headers":{"content-type":"text/plain","x-a":["1","2"]},"cookies":["c=1"]}"#.to_vec();
        assert_eq!(split_prelude(&start), Prelude::NeedMore);
        start.extend_from_slice(&[0; 7]);
        assert_eq!(split_prelude(&start), Prelude::NeedMore);
        start.extend_from_slice(b"\0chunk");
        let Prelude::Head { reply, consumed } = split_prelude(&start) else {
            panic!("no head");
        };
        assert_eq!(&start[consumed..], b"chunk");
        assert_eq!(reply.status, 201);
        assert_eq!(header(&reply, "x-a"), ["1", "2"]);
        assert_eq!(header(&reply, "set-cookie"), ["c=1"]);
        assert_eq!(header(&reply, "content-type"), ["text/plain"]);

        let Prelude::Head { reply, consumed } = split_prelude(b"{}\0\0\0\0\0\0\0\0") else {
            panic!("no head");
        };
        assert_eq!((reply.status.as_u16(), consumed), (200, 10));
        assert_eq!(header(&reply, "content-type"), [OCTETS]);

        for bad in [
            &b"[1]\0\0\0\0\0\0\0\0"[..],
            b"nope\0\0\0\0\0\0\0\0",
            b"{\"statusCode\":7}\0\0\0\0\0\0\0\0",
        ] {
            assert!(matches!(split_prelude(bad), Prelude::Invalid(_)), "{bad:?}");
        }
        let long = vec![b' '; MAX_PRELUDE + 8];
        assert!(matches!(split_prelude(&long), Prelude::Invalid(_)));
        let mut late = vec![b' '; MAX_PRELUDE + 1];
        late.extend_from_slice(&[0; 8]);
        assert!(matches!(split_prelude(&late), Prelude::Invalid(_)));
    }

    #[test]
    fn trailers() {
        let mut t = HeaderMap::new();
        assert_eq!(trailer_error(&t), None);
        t.insert(
            ERROR_TYPE_TRAILER,
            HeaderValue::from_static("Runtime.StreamError"),
        );
        t.insert(
            ERROR_BODY_TRAILER,
            HeaderValue::from_static("eyJlcnJvck1lc3NhZ2UiOiJzdHJlYW0gYnJva2UifQ=="),
        );
        let e = trailer_error(&t).unwrap();
        assert_eq!(
            (e.error_type.as_str(), e.message.as_str()),
            ("Runtime.StreamError", "stream broke")
        );
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        fn well_formed(r: &Reply) {
            assert!((100..=999).contains(&r.status.as_u16()));
        }

        proptest! {
            #[test]
            fn any_result_bytes_give_an_answer(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
                let b = Bytes::from(bytes);
                well_formed(&http_reply(&b));
                well_formed(&queue_reply(&b, "m"));
                well_formed(&error_reply(&parse_error(None, b.clone())));
                let _ = split_prelude(&b);
            }

            #[test]
            fn any_v2_like_object_gives_an_answer(
                status in any::<i64>(),
                name in "[ -~\\n]{0,12}",
                value in "[\\x00-\\x7f]{0,12}",
                body in ".{0,32}",
                b64 in any::<bool>(),
            ) {
                let out = serde_json::json!({
                    "statusCode": status,
                    "headers": {name.clone(): value.clone()},
                    "cookies": [value.clone(), 3],
                    "body": body,
                    "isBase64Encoded": b64,
                });
                let r = http_reply(&Bytes::from(out.to_string()));
                well_formed(&r);
                if !(100..=999).contains(&status) {
                    prop_assert_eq!(r.status.as_u16(), 502);
                }
                let mut prelude = out.to_string().into_bytes();
                prelude.extend_from_slice(&PRELUDE_DELIMITER);
                let _ = split_prelude(&prelude);
            }
        }
    }
}
