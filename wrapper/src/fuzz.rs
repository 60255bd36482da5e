//! Entry points for the cargo-fuzz targets in `fuzz/` (feature `fuzz`): each takes the
//! fuzzer's bytes, runs one parser of untrusted input and panics when an invariant breaks.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::config::Trigger;
use crate::envelope::{encoded, whole_envelope};
use crate::invoke::exec::env::exec_env;
use crate::process::arg_limit::ArgLimit;
use crate::process::{read_line_capped, Line};
use crate::request::Request;
use crate::response::{self, Reply};

/// The request → envelope encoder: a request made from `data` (first byte: trigger and
/// content type; then the target and `name: value` header lines up to a NUL; the rest is the
/// body). Its streamed envelope must be byte for byte serde_json's whole one, one line of
/// JSON whose body decodes back to the body; its exec variables unique and checkable.
pub fn envelope(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let (head, body) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let mut lines = head.split(|&b| b == b'\n');
    let target = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    if flags & 4 != 0 {
        headers.insert("content-type", HeaderValue::from_static("application/json"));
    }
    let trigger = [Trigger::Http, Trigger::Queue, Trigger::Schedule][usize::from(flags % 3)];
    let req = Request::new(
        trigger,
        "POST",
        &target,
        headers,
        Bytes::copy_from_slice(body),
    );

    let streamed = encoded(&req);
    assert_eq!(streamed, whole_envelope(&req), "streamed and whole differ");
    assert!(!streamed.contains(&b'\n'), "the envelope is one line");
    let value: serde_json::Value = serde_json::from_slice(&streamed).expect("valid JSON");
    let text = value["body"].as_str().expect("a string body");
    let decoded = match value["isBase64Encoded"].as_bool() {
        Some(true) => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .expect("base64")
        }
        _ => text.as_bytes().to_vec(),
    };
    assert_eq!(decoded, body, "the body comes back");

    let env = exec_env(&req);
    let mut names: Vec<_> = env.iter().map(|(k, _)| k.clone()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), env.len(), "each variable once");
    let limit = ArgLimit::new(Some(8 << 20), 4096, "/bin/handler", &[], &[], 0);
    let _ = limit.check(&env);
}

/// The handler output parser: any bytes on an exec handler's stdout, and any JSON value a
/// worker answers with, give a well-formed answer.
pub fn response(data: &[u8]) {
    well_formed(&response::from_exec_output(Bytes::copy_from_slice(data)));
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        well_formed(&response::from_worker_value(value, data));
    }
}

fn well_formed(r: &Reply) {
    assert!((100..=999).contains(&r.status.as_u16()), "{}", r.status);
    let typed = r
        .headers
        .iter()
        .any(|(n, _)| n == http::header::CONTENT_TYPE);
    assert!(typed || r.body.is_empty(), "a body without a content type");
}

/// The persistent line reader: `data` (first byte: the cap and the size of the reads it is
/// fed in) read with [`read_line_capped`] line after line gives what a plain splitter gives,
/// however the input is cut into reads.
pub fn line_reader(data: &[u8]) {
    let Some((&shape, input)) = data.split_first() else {
        return;
    };
    let cap = usize::from(shape & 0x3f) + 1;
    let step = usize::from(shape >> 6) * 5 + 1;
    let mut reader = Pieces { rest: input, step };
    let mut got = Vec::new();
    let waker = Waker::noop();
    let mut cx = Context::from_waker(waker);
    loop {
        let mut buf = Vec::new();
        let polled = {
            let read = std::pin::pin!(read_line_capped(&mut reader, &mut buf, cap));
            read.poll(&mut cx)
        };
        let Poll::Ready(line) = polled else {
            panic!("an in-memory read never waits");
        };
        let line = line.expect("in-memory reads do not fail");
        let eof = line == Line::Eof;
        got.push((buf, line));
        if eof {
            break;
        }
    }
    assert_eq!(got, reference_lines(input, cap));
}

/// What [`read_line_capped`] must find: a line ending in `\n` within `cap` bytes is complete;
/// `cap` bytes without one are too long (the rest is read next); what is left at the end
/// comes with EOF.
fn reference_lines(mut input: &[u8], cap: usize) -> Vec<(Vec<u8>, Line)> {
    let mut out = Vec::new();
    loop {
        match input[..input.len().min(cap)]
            .iter()
            .position(|&b| b == b'\n')
        {
            Some(i) => {
                out.push((input[..=i].to_vec(), Line::Complete));
                input = &input[i + 1..];
            }
            None if input.len() >= cap => {
                out.push((input[..cap].to_vec(), Line::TooLong));
                input = &input[cap..];
            }
            None => {
                out.push((input.to_vec(), Line::Eof));
                return out;
            }
        }
    }
}

/// An in-memory reader that hands out at most `step` bytes per fill.
struct Pieces<'a> {
    rest: &'a [u8],
    step: usize,
}

impl tokio::io::AsyncRead for Pieces<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self.rest.len().min(self.step).min(buf.remaining());
        buf.put_slice(&self.rest[..n]);
        self.rest = &self.rest[n..];
        Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncBufRead for Pieces<'_> {
    fn poll_fill_buf(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<&[u8]>> {
        let this = self.get_mut();
        let n = this.rest.len().min(this.step);
        Poll::Ready(Ok(&this.rest[..n]))
    }

    fn consume(mut self: Pin<&mut Self>, amt: usize) {
        self.rest = &self.rest[amt..];
    }
}

/// lambda mode: what a runtime sends on the Runtime API, and what a client's request becomes.
pub mod lambda {
    use bytes::Bytes;
    use http::{HeaderMap, HeaderValue};
    use serde_json::Value;

    use crate::config::Trigger;
    use crate::invoke::lambda::{api, events, result};
    use crate::request::Request;

    /// Runtime API bodies and result mapping: an error body (with an error-type header taken
    /// from the input), the result as every trigger maps it, the HTTP-integration prelude read
    /// from every prefix (it must agree with the whole), error trailers, and routes. Any bytes
    /// give a well-formed answer.
    pub fn runtime_api(data: &[u8]) {
        let split = data.iter().position(|&b| b == b'\n').unwrap_or(0);
        let (head, body) = data.split_at(split);
        let header_type = std::str::from_utf8(head).ok();
        let body = Bytes::copy_from_slice(body);

        let err = result::parse_error(header_type, body.clone());
        let reply = result::error_reply(&err);
        assert_eq!(reply.status, 502);
        let doc: Value = serde_json::from_slice(&reply.body).expect("error answers are JSON");
        assert!(doc["error"].is_string() && doc["errorType"].is_string());

        for reply in [
            result::http_reply(&body),
            result::queue_reply(&body, "message-id"),
            result::plain_reply(&body, None),
        ] {
            assert!((100..=999).contains(&reply.status.as_u16()));
        }
        let http = result::http_reply(&body);
        match serde_json::from_slice::<Value>(body.trim_ascii()) {
            Err(_) => assert_eq!(http.status, 502),
            Ok(Value::Object(map)) if map.contains_key("statusCode") => {}
            Ok(_) => {
                assert_eq!(http.status, 200);
                assert_eq!(&http.body[..], body.trim_ascii());
            }
        }

        // Read as it would arrive, one prefix at a time: before the delimiter nothing is
        // decided, after it the same head as the whole gives.
        let start = &body[..body.len().min(result::MAX_PRELUDE + 64)];
        let whole = result::split_prelude(start);
        if let result::Prelude::Head { consumed, .. } = &whole {
            for end in (0..=start.len()).step_by(start.len() / 16 + 1) {
                let part = result::split_prelude(&start[..end]);
                if end < *consumed {
                    assert_eq!(part, result::Prelude::NeedMore, "prefix of {end}");
                } else {
                    assert_eq!(part, whole, "prefix of {end}");
                }
            }
        }

        let mut trailers = HeaderMap::new();
        if let (Ok(t), Ok(b)) = (
            HeaderValue::from_bytes(head),
            HeaderValue::from_bytes(&body),
        ) {
            trailers.insert(result::ERROR_TYPE_TRAILER, t);
            trailers.insert(result::ERROR_BODY_TRAILER, b);
            let _ = result::trailer_error(&trailers);
        }
        if let Ok(path) = std::str::from_utf8(data) {
            let _ = api::route(path);
        }
    }

    /// Requests → events: any target, header value and body give valid JSON events of the
    /// right shape, and an HTTP event's body decodes back to the request's bytes; a header
    /// value as the invoke API's client context is refused or passed as a JSON object.
    pub fn events(data: &[u8]) {
        let mut parts = data.splitn(3, |&b| b == 0);
        let target = String::from_utf8_lossy(parts.next().unwrap_or_default());
        let value = parts.next().unwrap_or_default();
        let body = Bytes::copy_from_slice(parts.next().unwrap_or_default());
        let target = format!("/{}", target.trim_start_matches('/'));

        let mut headers = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_bytes(value) {
            for name in [
                "cookie",
                "host",
                "user-agent",
                "x-any",
                "x-any",
                "ce-id",
                "ce-time",
                "ce-source",
            ] {
                headers.append(name, v.clone());
            }
        }
        let now = std::time::SystemTime::now();
        let req = Request::new(
            Trigger::Http,
            "POST",
            &target,
            headers.clone(),
            body.clone(),
        );
        let ctx = events::HttpContext {
            source_ip: "127.0.0.1",
            protocol: "HTTP/1.1",
            now,
        };
        let event: Value = serde_json::from_slice(&events::http_event(&req, &ctx)).expect("JSON");
        assert_eq!(event["version"], "2.0");
        let sent = match (event["body"].as_str(), event["isBase64Encoded"].as_bool()) {
            (None, _) => Vec::new(),
            (Some(b), Some(true)) => {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .expect("base64")
            }
            (Some(b), _) => b.as_bytes().to_vec(),
        };
        assert_eq!(sent, &body[..]);

        let queued = Request::new(
            Trigger::Queue,
            "POST",
            &target,
            headers.clone(),
            body.clone(),
        );
        let (sqs, id) = events::sqs_event(&queued, "runr", now);
        let sqs: Value = serde_json::from_slice(&sqs).expect("JSON");
        assert_eq!(sqs["Records"][0]["messageId"].as_str(), Some(id.as_str()));
        let tick = Request::new(Trigger::Schedule, "POST", &target, headers, body);
        let _: Value =
            serde_json::from_slice(&events::schedule_event(&tick, "runr", now)).expect("JSON");
        if let Ok(text) = std::str::from_utf8(value) {
            let _ = events::parse_rfc3339_millis(text);
        }
        // The invoke API's client context: refused, or a JSON object the runtime can parse.
        if let Ok(v) = HeaderValue::from_bytes(value) {
            let mut h = HeaderMap::new();
            h.insert(crate::invoke::lambda::CLIENT_CONTEXT, v);
            if let Ok(Some(context)) = crate::invoke::lambda::client_context(&h) {
                let parsed: Value = serde_json::from_slice(context.as_bytes()).expect("JSON");
                assert!(parsed.is_object());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_points_run_on_plain_inputs() {
        envelope(b"\x05/orders?id=1&id=2\nx-user: a\nx_user: b\nce-id: 7\0{\"a\":1}");
        envelope(b"\x00/\0\xff\xfe");
        envelope(b"");
        response(br#"{"statusCode": 201, "body": "x"}"#);
        response(b"\xff");
        line_reader(b"\x43ab\ncdefghij\nk");
        line_reader(b"\x04abcde\n");
        line_reader(b"");
        lambda::runtime_api(
            b"ValueError\n{\"errorMessage\":\"boom\",\"errorType\":\"ValueError\"}",
        );
        lambda::runtime_api(b"\n{\"statusCode\":201,\"cookies\":[\"a=1\"],\"body\":\"/wD+\",\"isBase64Encoded\":true}");
        lambda::runtime_api(b"x\n{\"statusCode\":200}\0\0\0\0\0\0\0\0chunk");
        lambda::runtime_api(b"\n\"Hello from Lambda!\"");
        lambda::runtime_api(b"");
        lambda::events(b"orders/a%20b?x=1&x=2\0c1=v1; c2=v2\0hello");
        lambda::events(b"bin\0\0\xff\x00\xfe");
        lambda::events(b"");
        // {"custom":{"a":1}} as a client context.
        lambda::events(b"x\0eyJjdXN0b20iOnsiYSI6MX19\0{}");
    }
}
