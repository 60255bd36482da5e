//! One delivery: the CloudEvent POSTed over HTTP/1.1 to the function, over a small pool of
//! keep-alive connections (at most one idle connection per concurrent delivery).
//!
//! The answer's status line and headers decide the entry's fate; its body matters only for the
//! log line and to reuse the connection, so [`Http::finish`] reads it with a bound of bytes and
//! time, and a body that passes either is dropped with its connection.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::answer::Answer;
use crate::config::Target;
use crate::event;

/// Bytes of an answer's body kept: the dead letter's `runr-body` (the log line shows less,
/// [`LOG_SNIPPET`]).
pub(crate) const SNIPPET: usize = 1024;
/// Bytes of an answer's body a log line shows.
pub(crate) const LOG_SNIPPET: usize = 256;
/// Bytes of an answer's body read (and thrown away) so the connection can carry the next
/// event; past this the connection is closed instead.
const DRAIN_LIMIT: usize = 1 << 20;
/// How long the rest of an answer's body may take once its head arrived; past this the
/// connection is closed instead. Short: the entry's slot waits for it (the ack does not).
pub(crate) const BODY_WAIT: Duration = Duration::from_secs(1);

/// One event to send.
pub(crate) struct Event<'a> {
    /// `ce-id`: the entry id.
    pub id: &'a str,
    /// `ce-time`.
    pub time: &'a str,
    /// `X-RunR-Delivery-Attempt`.
    pub attempt: u32,
    /// The entry's fields as JSON.
    pub body: Bytes,
    /// This attempt's W3C `traceparent`.
    pub traceparent: String,
    /// The producer's `tracestate`, with a continued trace.
    pub tracestate: Option<&'a str>,
}

/// How one delivery went.
#[derive(Debug)]
pub(crate) enum Sent {
    /// The function answered with a status line and headers; its body is still to be read
    /// ([`Http::finish`]).
    Answered { answer: Answer, body: AnswerBody },
    /// No status line and headers within the delivery timeout.
    TimedOut,
    /// No answer: the connection failed (refused, reset, not HTTP).
    Failed(String),
}

/// A connection and the task that drives it; dropping it closes the connection.
struct Conn {
    send: SendRequest<Full<Bytes>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The body of an answer whose head arrived, and the connection it arrives on.
pub(crate) struct AnswerBody {
    conn: Conn,
    body: hyper::body::Incoming,
}

impl std::fmt::Debug for AnswerBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnswerBody")
    }
}

/// The function's HTTP side.
pub(crate) struct Http {
    target: Target,
    source: String,
    idle: Mutex<Vec<Conn>>,
    max_idle: usize,
}

impl Http {
    /// A client for `target`; events carry `ce-source: source`.
    pub(crate) fn new(target: Target, source: String, max_idle: usize) -> Http {
        Http {
            target,
            source,
            idle: Mutex::new(Vec::new()),
            max_idle,
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Conn>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `event`; the function has `timeout` to answer with a status line and headers.
    pub(crate) async fn send(&self, event: &Event<'_>, timeout: Duration) -> Sent {
        let head = tokio::time::timeout(timeout, self.head(event)).await;
        let (conn, response) = match head {
            Err(_) => return Sent::TimedOut,
            Ok(Err(e)) => return Sent::Failed(e),
            Ok(Ok(v)) => v,
        };
        let answer = Answer::from_head(
            response.status().as_u16(),
            response.headers(),
            SystemTime::now(),
        );
        Sent::Answered {
            answer,
            body: AnswerBody {
                conn,
                body: response.into_body(),
            },
        }
    }

    /// Reads the rest of an answer, at most [`DRAIN_LIMIT`] bytes within [`BODY_WAIT`], and
    /// returns its first [`SNIPPET`] bytes as text ([`text_prefix`]), or why it was not read; the
    /// connection goes back to the pool only when the body was read to its end.
    pub(crate) async fn finish(&self, body: AnswerBody) -> Result<String, String> {
        let AnswerBody { conn, body } = body;
        match tokio::time::timeout(BODY_WAIT, drain(body)).await {
            Ok(Ok(snippet)) => {
                let mut idle = self.idle();
                if idle.len() < self.max_idle && !conn.send.is_closed() {
                    idle.push(conn);
                }
                Ok(text_prefix(&snippet, SNIPPET))
            }
            Ok(Err(why)) => Err(format!("<body not read: {why}>")),
            Err(_) => Err(format!(
                "<body not read: not complete within {}>",
                runr_base::env::display_duration(BODY_WAIT)
            )),
        }
    }

    /// A response's head over a pooled connection, or a new one. A pooled connection the
    /// function closed while idle fails before any answer: the event then goes once more over a
    /// new connection (at-least-once allows the rare duplicate).
    async fn head(
        &self,
        event: &Event<'_>,
    ) -> Result<(Conn, http::Response<hyper::body::Incoming>), String> {
        let pooled = self.idle().pop();
        if let Some(mut conn) = pooled {
            if let Ok(response) = self.exchange(&mut conn, event).await {
                return Ok((conn, response));
            }
        }
        let mut conn = self.connect().await?;
        let response = self
            .exchange(&mut conn, event)
            .await
            .map_err(|e| runr_base::fmt::error_chain(&e))?;
        Ok((conn, response))
    }

    async fn exchange(
        &self,
        conn: &mut Conn,
        event: &Event<'_>,
    ) -> Result<http::Response<hyper::body::Incoming>, hyper::Error> {
        conn.send.ready().await?;
        conn.send.send_request(self.request(event)).await
    }

    async fn connect(&self) -> Result<Conn, String> {
        let stream = TcpStream::connect((self.target.host.as_str(), self.target.port))
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.target))?;
        let _ = stream.set_nodelay(true);
        let (send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| runr_base::fmt::error_chain(&e))?;
        let task = tokio::spawn(async move {
            // A function closing an idle connection is normal; the next send notices.
            let _ = connection.await;
        });
        Ok(Conn { send, task })
    }

    fn request(&self, event: &Event<'_>) -> http::Request<Full<Bytes>> {
        let mut request = http::Request::new(Full::new(event.body.clone()));
        *request.method_mut() = http::Method::POST;
        // The path was parsed as part of a URI by the config: it is a valid request target.
        *request.uri_mut() = self
            .target
            .path
            .parse()
            .unwrap_or_else(|_| http::Uri::from_static("/"));
        let h = request.headers_mut();
        let mut put = |name: &'static str, value: &str| {
            // Every value is visible ASCII (names are checked by the config, ids and times are
            // digits and punctuation); one that is not is left out rather than sent broken.
            if let Ok(v) = http::HeaderValue::from_str(value) {
                h.insert(name, v);
            }
        };
        put(header::HOST.as_str(), &self.target.authority);
        put("ce-specversion", event::SPECVERSION);
        put("ce-type", event::EVENT_TYPE);
        put("ce-source", &self.source);
        put("ce-id", event.id);
        put("ce-time", event.time);
        put(event::ATTEMPT_HEADER, &event.attempt.to_string());
        put(crate::trace::TRACEPARENT, &event.traceparent);
        if let Some(state) = event.tracestate {
            put(crate::trace::TRACESTATE, state);
        }
        put(header::CONTENT_TYPE.as_str(), event::CONTENT_TYPE);
        put(
            header::CONTENT_LENGTH.as_str(),
            &event.body.len().to_string(),
        );
        put(
            header::USER_AGENT.as_str(),
            concat!("runr-queue/", env!("CARGO_PKG_VERSION")),
        );
        request
    }
}

/// At most `max` bytes of `bytes` as text: valid UTF-8 always (an invalid sequence becomes
/// U+FFFD), a character cut by the bound left out rather than half kept, and never more than
/// `max` bytes once replacements are counted.
pub(crate) fn text_prefix(bytes: &[u8], max: usize) -> String {
    let mut cut = &bytes[..bytes.len().min(max)];
    if cut.len() < bytes.len() {
        // A sequence cut by the bound: its lead byte is among the last three.
        for back in 1..=cut.len().min(3) {
            let b = cut[cut.len() - back];
            if b & 0xC0 == 0x80 {
                continue;
            }
            let want = match b {
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                0xF0..=0xF7 => 4,
                _ => 1,
            };
            if want > back {
                cut = &cut[..cut.len() - back];
            }
            break;
        }
    }
    let text = String::from_utf8_lossy(cut);
    shorten(&text, max).to_string()
}

/// `s` cut to at most `max` bytes at a character boundary.
pub(crate) fn shorten(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut i = max;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    &s[..i]
}

/// Reads a body to its end (up to [`DRAIN_LIMIT`]) and returns its first [`SNIPPET`] bytes;
/// `Err` when it failed or was too long, and the connection must not be reused.
async fn drain(mut body: hyper::body::Incoming) -> Result<Vec<u8>, String> {
    let mut snippet = Vec::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| runr_base::fmt::error_chain(&e))?;
        if let Some(data) = frame.data_ref() {
            total += data.len();
            if total > DRAIN_LIMIT {
                return Err(format!("longer than {DRAIN_LIMIT} bytes"));
            }
            // One byte past the bound: text_prefix then knows whether a character was cut.
            let room = (SNIPPET + 1).saturating_sub(snippet.len());
            snippet.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
    Ok(snippet)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn prefixes_cut_at_a_character() {
        assert_eq!(text_prefix(b"hello", 1024), "hello");
        assert_eq!(text_prefix(b"hello", 3), "hel");
        // "é" is two bytes: cut in its middle, it is left out.
        assert_eq!(text_prefix("aé".as_bytes(), 2), "a");
        assert_eq!(text_prefix("aé".as_bytes(), 3), "aé");
        assert_eq!(text_prefix("a€".as_bytes(), 3), "a");
        assert_eq!(text_prefix("😀".as_bytes(), 3), "");
        // Invalid bytes become U+FFFD, within the bound.
        assert_eq!(text_prefix(b"a\xffb", 1024), "a\u{fffd}b");
        assert_eq!(text_prefix(b"\xff\xff", 4), "\u{fffd}");
    }

    proptest! {
        /// Whatever the bytes: valid UTF-8 (a `String`), at most the bound, and for a valid
        /// body exactly its longest prefix that ends at a character.
        #[test]
        fn any_body(bytes in proptest::collection::vec(any::<u8>(), 0..64), max in 0usize..70) {
            let t = text_prefix(&bytes, max);
            prop_assert!(t.len() <= max);
            if let Ok(s) = std::str::from_utf8(&bytes) {
                prop_assert_eq!(t.as_str(), shorten(s, max));
            }
        }

        #[test]
        fn any_text(s in "\\PC{0,40}", max in 0usize..100) {
            let t = text_prefix(s.as_bytes(), max);
            prop_assert!(s.starts_with(&t));
            prop_assert_eq!(t.as_str(), shorten(&s, max));
        }
    }
}
