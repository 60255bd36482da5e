//! Entry points for the cargo-fuzz targets in `fuzz/` (feature `fuzz`): each takes the
//! fuzzer's bytes, runs one parser of untrusted input and panics when an invariant breaks.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::config::Trigger;
use crate::envelope::{whole_envelope, Request};
use crate::process::arg_limit::ArgLimit;
use crate::process::{read_line_capped, Line};
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

    let streamed = req.envelope_json();
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

    let env = req.exec_env();
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
    }
}
