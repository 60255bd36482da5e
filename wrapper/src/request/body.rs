//! A request body still on the connection, read only once a handler can take it, and why it
//! cannot be taken (413, 400, 408).

use bytes::Bytes;
use http::StatusCode;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;

use crate::response::{ErrorClass, Reply};

/// Largest request body; larger ones answer 413 (a declared `Content-Length` before a byte is
/// read).
pub const MAX_BODY: usize = 10 * 1024 * 1024;

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
    /// Boxed: the server's body type (its lingering close) belongs to the layer above.
    inner: UnsyncBoxBody<Bytes, hyper::Error>,
    /// Bytes received so far.
    seen: u64,
    /// The first bytes, kept for a replay capture when streamed (up to `keep`).
    kept: Vec<u8>,
    keep: usize,
    done: bool,
}

impl BodyReader {
    /// A reader of `inner` that keeps the first `keep` bytes it streams aside.
    pub fn new<B>(inner: B, keep: usize) -> BodyReader
    where
        B: hyper::body::Body<Data = Bytes, Error = hyper::Error> + Send + 'static,
    {
        BodyReader {
            inner: inner.boxed_unsync(),
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
