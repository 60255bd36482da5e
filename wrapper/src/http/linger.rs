//! The lingering close: a request body the wrapper did not read to its end (the handler
//! answered before reading it, or the request was refused before its body was wanted) is read
//! and thrown away after the answer instead of being left in the socket.
//!
//! Why: hyper 1 stops reading a request body whose receiver is dropped (one cheap read, then
//! `close_read`), and once the answer is written it closes the connection with the rest of the
//! body still unread in the kernel's receive buffer. Closing a socket with unread data makes
//! Linux send a reset instead of a FIN, and a client still sending its body (curl, Python's
//! `http.client` and most SDKs write the whole body before they read) gets `EPIPE` or
//! `ECONNRESET` and never reads the answer that was already on its way (hyperium/hyper#2384,
//! #3078: "the OS will usually send a RST since it is closing the connection with data still
//! unread"; hyper leaves draining to the service). nginx (`lingering_close`) and Go's net/http
//! read the rest for a while before closing; so does the wrapper, here, for every face that
//! takes a request body (exec, persistent and lambda mode's server, the observed proxy).
//!
//! [`Unread`] wraps each request's body. Whoever holds it reads it as usual; when it is dropped
//! before its end, a task goes on reading it (hyper keeps reading from the socket while the
//! body is wanted, interleaved with writing the answer) and discards what comes, until one of:
//! - the end of the body: the connection stays open for the client's next request;
//! - more than [`LINGER_BYTES`] discarded, [`LINGER_IDLE`] without a byte, or the request's
//!   deadline: the task drops the body, hyper closes the connection after the answer (a client
//!   that is still sending by then has had its answer in front of the close).
//!
//! A client that asked `Expect: 100-continue` and was never told to continue is not lingered
//! for: it has not sent the body, and polling the body now would make hyper send a `100` after
//! the final answer. hyper closes that connection as before.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::EXPECT;
use http::HeaderMap;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::Instant;

/// Body bytes read and discarded after the answer at most: the request limit many times over
/// (a client that sends a 100 MiB upload to be refused with 413 still reads that 413), yet a
/// client that streams without end is cut.
pub const LINGER_BYTES: u64 = 128 * 1024 * 1024;

/// How long the lingering read waits for the client's next bytes before it closes.
pub const LINGER_IDLE: Duration = Duration::from_secs(5);

/// The bounds of one lingering read.
#[derive(Debug, Clone, Copy)]
pub struct Linger {
    /// Bytes discarded at most.
    pub max_bytes: u64,
    /// Longest wait for the next bytes.
    pub idle: Duration,
    /// Never past this (the request's deadline).
    pub until: Instant,
}

impl Linger {
    /// The wrapper's bounds, ending at `deadline`.
    pub fn until(deadline: Instant) -> Linger {
        Linger {
            max_bytes: LINGER_BYTES,
            idle: LINGER_IDLE,
            until: deadline,
        }
    }
}

/// A request body that is read to its end (within [`Linger`]) after it is dropped.
pub struct Unread {
    inner: Option<Incoming>,
    linger: Linger,
    /// The client waits for `100 Continue` before sending: set while the body was never polled
    /// (hyper sends the `100` at the first poll).
    awaits_continue: bool,
}

impl Unread {
    /// `body` with its request's `headers` (for `Expect`) and bounds.
    pub fn new(body: Incoming, headers: &HeaderMap, linger: Linger) -> Unread {
        let awaits_continue = headers
            .get(EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        Unread {
            inner: Some(body),
            linger,
            awaits_continue,
        }
    }
}

impl Body for Unread {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        this.awaits_continue = false;
        match &mut this.inner {
            Some(inner) => Pin::new(inner).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for Unread {
    fn drop(&mut self) {
        let Some(body) = self.inner.take() else {
            return;
        };
        if body.is_end_stream() || self.awaits_continue {
            return;
        }
        // Outside a runtime (never in the servers) the body is simply dropped.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(discard(body, self.linger));
        }
    }
}

/// How a lingering read ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The whole body was read: the connection can be kept.
    Whole,
    /// Cut at a bound (bytes, idle time, deadline) or by the client: the connection closes.
    Cut,
}

/// Reads `body` to its end within `linger`, throwing the bytes away.
pub async fn discard<B>(mut body: B, linger: Linger) -> Ended
where
    B: Body + Unpin,
{
    use http_body_util::BodyExt;
    let mut discarded = 0u64;
    loop {
        let wait = (Instant::now() + linger.idle).min(linger.until);
        match tokio::time::timeout_at(wait, body.frame()).await {
            Ok(None) => return Ended::Whole,
            Ok(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    discarded += bytes::Buf::remaining(data) as u64;
                    if discarded > linger.max_bytes {
                        tracing::debug!(discarded, "lingering read cut at its byte bound");
                        return Ended::Cut;
                    }
                }
            }
            Ok(Some(Err(_))) => return Ended::Cut,
            Err(_elapsed) => {
                tracing::debug!(discarded, "lingering read cut at its time bound");
                return Ended::Cut;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::future::Future;

    fn linger(max_bytes: u64, until: Duration) -> Linger {
        Linger {
            max_bytes,
            idle: Duration::from_secs(5),
            until: Instant::now() + until,
        }
    }

    /// A body of `pieces` pieces of `size` bytes, one every `every`, then its end.
    struct Trickle {
        pieces: usize,
        size: usize,
        every: Duration,
        sleep: Pin<Box<tokio::time::Sleep>>,
    }

    fn body(pieces: usize, size: usize, every: Duration) -> Trickle {
        Trickle {
            pieces,
            size,
            every,
            sleep: Box::pin(tokio::time::sleep(every)),
        }
    }

    impl Body for Trickle {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            if self.pieces == 0 {
                return Poll::Ready(None);
            }
            std::task::ready!(self.sleep.as_mut().poll(cx));
            let next = Instant::now() + self.every;
            self.sleep.as_mut().reset(next);
            self.pieces -= 1;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![0; self.size])))))
        }
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn reads_a_whole_body_within_the_bounds() {
        let b = body(100, 1024, Duration::from_millis(10));
        assert_eq!(
            discard(b, linger(1 << 20, Duration::from_secs(30))).await,
            Ended::Whole
        );
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn cuts_past_the_byte_bound() {
        let b = body(100, 1024, Duration::from_millis(10));
        assert_eq!(
            discard(b, linger(50 * 1024, Duration::from_secs(30))).await,
            Ended::Cut
        );
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn cuts_a_client_that_goes_quiet_and_at_the_deadline() {
        let start = Instant::now();
        let quiet = body(2, 1, Duration::from_secs(60));
        assert_eq!(
            discard(quiet, linger(1 << 20, Duration::from_secs(300))).await,
            Ended::Cut
        );
        assert_eq!(start.elapsed(), LINGER_IDLE);
        // A trickle that never goes quiet for long still ends at the deadline.
        let start = Instant::now();
        let trickle = body(1000, 1, Duration::from_secs(1));
        assert_eq!(
            discard(trickle, linger(1 << 20, Duration::from_secs(12))).await,
            Ended::Cut
        );
        assert_eq!(start.elapsed(), Duration::from_secs(12));
    }
}
