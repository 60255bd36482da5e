//! Handler output → HTTP response: a response envelope (`statusCode` / `headers` / `body`) or a
//! raw body. Any bytes give a well-formed answer; nothing here can panic on user output.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::StatusCode;
use serde_json::Value;

/// `Content-Type` of text bodies.
pub const TEXT: &str = "text/plain; charset=utf-8";
/// `Content-Type` of JSON bodies.
pub const JSON: &str = "application/json";
/// `Content-Type` of base64-decoded bodies.
pub const OCTETS: &str = "application/octet-stream";

/// The header that marks an answer the wrapper made itself instead of the handler, with its
/// [`ErrorClass`]; queue consumers choose between retry and dead-letter by it. A handler's own
/// answer never carries it (a handler that sets it has it removed).
pub const ERROR_HEADER: HeaderName = HeaderName::from_static("x-runr-error");

/// Why the wrapper answered instead of the handler: the value of [`ERROR_HEADER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The invocation ran into `RUNR_TIMEOUT` (504).
    Timeout,
    /// The handler ended without a usable answer: exited without one, a persistent worker
    /// exited, or what it wrote is not an answer the wrapper can send.
    Crash,
    /// The handler could not be started.
    Start,
    /// A size limit: request body (413), request headers (431), output above 10 MiB.
    Limit,
    /// Admission control refused the request (503).
    Overload,
    /// Nothing can take the request any more (shutting down).
    Unavailable,
    /// The request itself could not be read: a malformed or broken body (400) or one that did
    /// not arrive in time (408). The handler never saw it.
    Request,
}

impl ErrorClass {
    /// Every class.
    pub const ALL: [ErrorClass; 7] = [
        ErrorClass::Timeout,
        ErrorClass::Crash,
        ErrorClass::Start,
        ErrorClass::Limit,
        ErrorClass::Overload,
        ErrorClass::Unavailable,
        ErrorClass::Request,
    ];

    /// The header value and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Timeout => "timeout",
            ErrorClass::Crash => "crash",
            ErrorClass::Start => "start",
            ErrorClass::Limit => "limit",
            ErrorClass::Overload => "overload",
            ErrorClass::Unavailable => "unavailable",
            ErrorClass::Request => "request",
        }
    }

    fn from_value(v: &HeaderValue) -> Option<ErrorClass> {
        ErrorClass::ALL
            .into_iter()
            .find(|c| c.as_str().as_bytes() == v.as_bytes())
    }
}

/// A finished HTTP answer, independent of hyper so every mode (and the one-shot schedule run)
/// can use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The status code.
    pub status: StatusCode,
    /// Headers in order; a name may repeat.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body.
    pub body: Bytes,
}

impl Reply {
    /// A `{"error": message}` answer.
    pub fn error(status: StatusCode, message: &str) -> Reply {
        let body = serde_json::to_vec(&serde_json::json!({ "error": message })).unwrap_or_default();
        Reply::with_type(status, JSON, body.into())
    }

    /// A `{"error": message}` answer the wrapper makes instead of the handler, marked with
    /// `X-RunR-Error: <class>`.
    pub fn failure(class: ErrorClass, status: StatusCode, message: &str) -> Reply {
        let mut reply = Reply::error(status, message);
        reply
            .headers
            .push((ERROR_HEADER, HeaderValue::from_static(class.as_str())));
        reply
    }

    /// 504 `handler timed out after 30s`: what every mode answers when `RUNR_TIMEOUT` (`timeout`)
    /// passes, whether the handler was running or the request still waited in line.
    pub fn timed_out(timeout: Duration) -> Reply {
        let message = format!("handler timed out after {}", display_timeout(timeout));
        Reply::failure(ErrorClass::Timeout, StatusCode::GATEWAY_TIMEOUT, &message)
    }

    /// The class of a wrapper-made answer ([`Reply::failure`]); `None` for the handler's own.
    pub fn error_class(&self) -> Option<ErrorClass> {
        self.headers
            .iter()
            .find(|(n, _)| *n == ERROR_HEADER)
            .and_then(|(_, v)| ErrorClass::from_value(v))
    }

    /// A body with one `Content-Type`.
    pub fn with_type(status: StatusCode, content_type: &'static str, body: Bytes) -> Reply {
        Reply {
            status,
            headers: vec![(CONTENT_TYPE, HeaderValue::from_static(content_type))],
            body,
        }
    }
}

/// A duration the way the 504 message and the start line show it: whole seconds as `30s`, else
/// `2.5s`.
pub fn display_timeout(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        let s = format!("{:.3}", d.as_secs_f64());
        format!("{}s", s.trim_end_matches('0').trim_end_matches('.'))
    }
}

/// What an exec-mode handler wrote on stdout: an envelope when it is a JSON object with a
/// numeric `statusCode`, else the raw body (JSON or text).
pub fn from_exec_output(stdout: Bytes) -> Reply {
    match envelope_reply(&stdout) {
        Some(reply) => reply,
        None => raw(stdout),
    }
}

/// The answer of stdout when it holds a response envelope, for exec mode's exit-status rule (a
/// failing handler that still wrote an envelope gets its envelope answered).
pub fn envelope_reply(stdout: &[u8]) -> Option<Reply> {
    parse_envelope_bytes(stdout).map(from_envelope)
}

fn parse_envelope_bytes(stdout: &[u8]) -> Option<serde_json::Map<String, Value>> {
    let trimmed = stdout.trim_ascii();
    if trimmed.first() != Some(&b'{') {
        return None;
    }
    match serde_json::from_slice::<Value>(trimmed) {
        Ok(Value::Object(map)) if map.get("statusCode").is_some_and(Value::is_number) => Some(map),
        _ => None,
    }
}

/// The JSON value a persistent worker answered with: an envelope, a JSON string (sent as
/// text), or any other JSON value (sent as JSON).
pub fn from_worker_value(value: Value, line: &[u8]) -> Reply {
    match value {
        Value::Object(map) if map.get("statusCode").is_some_and(Value::is_number) => {
            from_envelope(map)
        }
        Value::String(s) => Reply::with_type(StatusCode::OK, TEXT, Bytes::from(s)),
        _ => Reply::with_type(
            StatusCode::OK,
            JSON,
            Bytes::copy_from_slice(line.trim_ascii()),
        ),
    }
}

/// Raw output: `application/json` when it is valid JSON, text otherwise.
fn raw(stdout: Bytes) -> Reply {
    let is_json = !stdout.trim_ascii().is_empty()
        && serde_json::from_slice::<serde::de::IgnoredAny>(&stdout).is_ok();
    Reply::with_type(StatusCode::OK, if is_json { JSON } else { TEXT }, stdout)
}

/// A response envelope → reply. Header values that HTTP cannot carry are dropped with a
/// warning rather than failing the whole answer.
fn from_envelope(mut map: serde_json::Map<String, Value>) -> Reply {
    let status = match map.get("statusCode").and_then(status_code) {
        Some(s) => s,
        None => {
            let got = map
                .get("statusCode")
                .map(Value::to_string)
                .unwrap_or_default();
            return Reply::failure(
                ErrorClass::Crash,
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("handler returned an invalid statusCode {got}"),
            );
        }
    };
    let mut headers = Vec::new();
    if let Some(hs) = map.get("headers") {
        headers_from_json(hs, &mut headers);
    }
    let Ok((body, default_type)) = body_from_json(&mut map) else {
        return Reply::failure(
            ErrorClass::Crash,
            StatusCode::BAD_GATEWAY,
            "handler returned isBase64Encoded with a body that is not base64",
        );
    };
    if let Some(t) = default_type {
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

/// A response's `body` (taken out of `map`) and `isBase64Encoded`: its bytes, and the
/// content type they imply when the response names none (text for a string, octets for base64,
/// JSON for any other value, none for no body). `Err` when base64 is claimed for a body that is
/// not base64. Shared by response envelopes and Lambda results, which AWS shaped alike.
pub fn body_from_json(
    map: &mut serde_json::Map<String, Value>,
) -> Result<(Bytes, Option<&'static str>), base64::DecodeError> {
    let is_base64 = map.get("isBase64Encoded").and_then(Value::as_bool) == Some(true);
    Ok(match map.remove("body") {
        None | Some(Value::Null) => (Bytes::new(), None),
        Some(Value::String(s)) if is_base64 => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(s.trim())?;
            (Bytes::from(bytes), Some(OCTETS))
        }
        Some(Value::String(s)) => (Bytes::from(s), Some(TEXT)),
        Some(other) => (Bytes::from(other.to_string()), Some(JSON)),
    })
}

/// A response's `statusCode`: a whole number in 100–999 (`201`, `201.0`); anything else is not
/// a status.
pub fn status_code(v: &Value) -> Option<StatusCode> {
    let n = v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0)
            .map(|f| f as u64)
    })?;
    u16::try_from(n)
        .ok()
        .filter(|n| (100..=999).contains(n))
        .and_then(|n| StatusCode::from_u16(n).ok())
}

/// A handler's or Lambda function's `headers`: an object whose values are text (numbers and
/// booleans written as text, arrays as repeated headers), appended to `out` in order. What HTTP
/// cannot carry is dropped with a warning. Framing headers are hyper's (a handler's would
/// contradict the body it frames), and `X-RunR-Error` is the wrapper's word: a consumer must be
/// able to trust it, whatever mode produced the answer.
pub fn headers_from_json(headers: &Value, out: &mut Vec<(HeaderName, HeaderValue)>) {
    let Value::Object(headers) = headers else {
        return;
    };
    for (name, value) in headers {
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            tracing::warn!(header = %name, "handler returned an invalid header name; dropped");
            continue;
        };
        if name == http::header::CONTENT_LENGTH
            || name == http::header::TRANSFER_ENCODING
            || name == http::header::CONNECTION
            || name == ERROR_HEADER
        {
            continue;
        }
        let values = match value {
            Value::Array(items) => items.iter().collect(),
            other => vec![other],
        };
        for v in values {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => continue,
            };
            match HeaderValue::from_str(&text) {
                Ok(v) => out.push((name.clone(), v)),
                Err(_) => {
                    tracing::warn!(header = %name, "handler returned an invalid header value; dropped")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_display() {
        assert_eq!(display_timeout(Duration::from_secs(30)), "30s");
        assert_eq!(display_timeout(Duration::from_millis(2500)), "2.5s");
        assert_eq!(display_timeout(Duration::from_millis(250)), "0.25s");
    }

    impl Reply {
        fn header(&self, name: &HeaderName) -> Option<&HeaderValue> {
            self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v)
        }

        fn has_header(&self, name: &HeaderName) -> bool {
            self.header(name).is_some()
        }
    }

    fn ctype(r: &Reply) -> &str {
        r.header(&CONTENT_TYPE).unwrap().to_str().unwrap()
    }

    fn exec(s: &str) -> Reply {
        from_exec_output(Bytes::from(s.to_string()))
    }

    #[test]
    fn envelope_with_string_body() {
        let r = exec(
            r#"{"statusCode": 201, "headers": {"Content-Type": "text/html"}, "body": "<b>created</b>"}"#,
        );
        assert_eq!(r.status, 201);
        assert_eq!(ctype(&r), "text/html");
        assert_eq!(r.body, "<b>created</b>");
    }

    #[test]
    fn string_body_defaults_to_text() {
        let r = exec(r#"{"statusCode": 200, "body": "hi"}"#);
        assert_eq!(ctype(&r), TEXT);
        assert_eq!(r.body, "hi");
    }

    #[test]
    fn base64_body_defaults_to_octets() {
        let r = exec(r#"{"statusCode": 200, "body": "/wD+", "isBase64Encoded": true}"#);
        assert_eq!(ctype(&r), OCTETS);
        assert_eq!(&r.body[..], &[0xff, 0x00, 0xfe]);
        let bad = exec(r#"{"statusCode": 200, "body": "!!", "isBase64Encoded": true}"#);
        assert_eq!(bad.status, 502);
    }

    #[test]
    fn json_body_is_encoded() {
        let r = exec(r#"{"statusCode": 200, "body": {"a": [1, true]}}"#);
        assert_eq!(ctype(&r), JSON);
        assert_eq!(r.body, r#"{"a":[1,true]}"#);
        let r =
            exec(r#"{"statusCode": 200, "headers": {"content-type": "application/x"}, "body": 5}"#);
        assert_eq!(ctype(&r), "application/x");
        assert_eq!(r.body, "5");
    }

    #[test]
    fn header_arrays_numbers_and_bools() {
        let r = exec(
            r#"{"statusCode": 200, "headers": {"Set-Cookie": ["a=1", "b=2"], "X-N": 42, "X-B": true, "X-Null": null, "Content-Length": "99"}, "body": ""}"#,
        );
        let cookies: Vec<_> = r
            .headers
            .iter()
            .filter(|(n, _)| n == "set-cookie")
            .map(|(_, v)| v.to_str().unwrap())
            .collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(r.header(&HeaderName::from_static("x-n")).unwrap(), "42");
        assert_eq!(r.header(&HeaderName::from_static("x-b")).unwrap(), "true");
        assert!(!r.has_header(&HeaderName::from_static("x-null")));
        assert!(!r.has_header(&http::header::CONTENT_LENGTH));
    }

    #[test]
    fn status_code_range() {
        assert_eq!(exec(r#"{"statusCode": 999}"#).status, 999);
        assert_eq!(exec(r#"{"statusCode": 100.0}"#).status, 100);
        for bad in ["99", "1000", "-1", "200.5", "1e20"] {
            let r = exec(&format!(r#"{{"statusCode": {bad}, "body": "x"}}"#));
            assert_eq!(r.status, 500, "{bad}");
            assert_eq!(ctype(&r), JSON);
        }
    }

    #[test]
    fn missing_body_is_empty() {
        let r = exec(r#"{"statusCode": 204}"#);
        assert_eq!(r.status, 204);
        assert!(r.body.is_empty());
    }

    #[test]
    fn raw_outputs() {
        let r = exec("hello\n");
        assert_eq!((r.status, ctype(&r)), (StatusCode::OK, TEXT));
        assert_eq!(r.body, "hello\n");
        let r = exec("[1,2]\n");
        assert_eq!(ctype(&r), JSON);
        let r = exec(r#"{"statusCode": "200"}"#);
        assert_eq!(ctype(&r), JSON, "a string statusCode is not an envelope");
        assert_eq!(r.status, 200);
        let r = exec("");
        assert_eq!(ctype(&r), TEXT);
        let r = from_exec_output(Bytes::from_static(&[0xff, 0xfe]));
        assert_eq!(ctype(&r), TEXT);
    }

    #[test]
    fn worker_values() {
        let r = from_worker_value(serde_json::json!("text"), br#""text""#);
        assert_eq!((ctype(&r), &r.body[..]), (TEXT, &b"text"[..]));
        let r = from_worker_value(serde_json::json!([1]), b"[1]\n");
        assert_eq!((ctype(&r), &r.body[..]), (JSON, &b"[1]"[..]));
        let r = from_worker_value(serde_json::json!({"statusCode": 404, "body": "no"}), b"");
        assert_eq!(r.status, 404);
    }

    #[test]
    fn wrapper_made_answers_carry_their_class_and_handlers_cannot_forge_it() {
        let r = Reply::failure(ErrorClass::Timeout, StatusCode::GATEWAY_TIMEOUT, "t");
        assert_eq!(r.header(&ERROR_HEADER).unwrap(), "timeout");
        assert_eq!(r.error_class(), Some(ErrorClass::Timeout));
        let forged = exec(
            r#"{"statusCode": 503, "headers": {"X-RunR-Error": "overload", "x-runr-error": ["timeout"]}, "body": "busy"}"#,
        );
        assert_eq!(forged.status, 503);
        assert!(!forged.has_header(&ERROR_HEADER), "{:?}", forged.headers);
        assert_eq!(forged.error_class(), None);
        let bad = exec(r#"{"statusCode": 7}"#);
        assert_eq!(bad.error_class(), Some(ErrorClass::Crash));
        let bad = exec(r#"{"statusCode": 200, "body": "!!", "isBase64Encoded": true}"#);
        assert_eq!(bad.error_class(), Some(ErrorClass::Crash));
        assert_eq!(exec("plain").error_class(), None);
        let names: Vec<_> = ErrorClass::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            names,
            [
                "timeout",
                "crash",
                "start",
                "limit",
                "overload",
                "unavailable",
                "request"
            ]
        );
    }

    #[test]
    fn error_replies_are_json() {
        let r = Reply::error(StatusCode::GATEWAY_TIMEOUT, "handler timed out after 1s");
        assert_eq!(r.body, r#"{"error":"handler timed out after 1s"}"#);
        assert_eq!(ctype(&r), JSON);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        fn well_formed(r: &Reply) {
            assert!((100..=999).contains(&r.status.as_u16()));
            assert!(r.headers.iter().any(|(n, _)| n == CONTENT_TYPE) || r.body.is_empty());
        }

        proptest! {
            #[test]
            fn any_bytes_give_an_answer(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                well_formed(&from_exec_output(Bytes::from(bytes)));
            }

            #[test]
            fn any_envelope_like_output_gives_an_answer(
                status in any::<i64>(),
                name in "[ -~\\n]{0,12}",
                value in "[\\x00-\\x7f]{0,12}",
                body in ".{0,32}",
                b64 in any::<bool>(),
            ) {
                let out = serde_json::json!({
                    "statusCode": status,
                    "headers": {name: [value.clone(), 1, false]},
                    "body": body,
                    "isBase64Encoded": b64,
                });
                let r = from_exec_output(Bytes::from(out.to_string()));
                well_formed(&r);
                if !(100..=999).contains(&status) {
                    prop_assert_eq!(r.status.as_u16(), 500);
                }
            }

            #[test]
            fn any_worker_line_gives_an_answer(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
                if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                    well_formed(&from_worker_value(v, &bytes));
                }
            }
        }
    }
}
