//! The body of a streamed answer: the runtime's chunks go to the client as they arrive
//! (chunked encoding), and the end of the stream is where the invocation is observed. A stream
//! that ends early (error trailers, the runtime exiting, the timeout) ends the client's answer
//! with an error, so hyper cuts the connection instead of sending the last chunk: the client
//! can tell an incomplete answer from a complete one.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};

use super::slot::Chunk;
use crate::invoke::Ended;

/// How a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The runtime finished its response.
    Complete,
    /// Error trailers, or the runtime's request broke off.
    Failed,
    /// `RUNR_TIMEOUT` came first.
    TimedOut,
    /// The client went away first.
    ClientGone,
}

impl End {
    /// What happened to the handler, as the invocation records it: a function that
    /// answered whole, even to a client that left early, answered.
    pub fn ended(self) -> Ended {
        match self {
            End::Complete | End::ClientGone => Ended::Answered,
            End::TimedOut => Ended::TimedOut,
            End::Failed => Ended::WorkerExited,
        }
    }
}

/// Why the client's answer was cut off.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The function's stream failed.
    #[error("the function's streamed response failed")]
    Failed,
    /// The timeout came first.
    #[error("the function's streamed response ran into the timeout")]
    TimedOut,
}

/// Called once with how the stream ended.
type OnEnd = Box<dyn FnOnce(End) + Send>;

/// A streamed answer's body.
pub struct StreamedBody {
    /// Bytes already received with the head (what followed the prelude).
    first: Option<Bytes>,
    chunks: mpsc::Receiver<Chunk>,
    deadline: Pin<Box<Sleep>>,
    on_end: Option<OnEnd>,
}

impl StreamedBody {
    /// The body made of `first`, then `chunks` until their end or `deadline`.
    pub fn new(first: Bytes, chunks: mpsc::Receiver<Chunk>, deadline: Instant) -> StreamedBody {
        StreamedBody {
            first: (!first.is_empty()).then_some(first),
            chunks,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
            on_end: Some(Box::new(|_| {})),
        }
    }

    /// The same body, `on_end` hearing how it ended.
    pub fn on_end(mut self, on_end: impl FnOnce(End) + Send + 'static) -> StreamedBody {
        self.on_end = Some(Box::new(on_end));
        self
    }

    fn end(&mut self, how: End) {
        if let Some(f) = self.on_end.take() {
            f(how);
        }
    }
}

impl std::fmt::Debug for StreamedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamedBody")
            .field("ended", &self.on_end.is_none())
            .finish_non_exhaustive()
    }
}

impl Body for StreamedBody {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        if self.on_end.is_none() {
            return Poll::Ready(None);
        }
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        match self.chunks.poll_recv(cx) {
            Poll::Ready(Some(Chunk::Data(data))) => Poll::Ready(Some(Ok(Frame::data(data)))),
            Poll::Ready(Some(Chunk::End)) => {
                self.end(End::Complete);
                Poll::Ready(None)
            }
            // A channel closed without `End` is a runtime request that went away midway.
            Poll::Ready(Some(Chunk::Failed(_)) | None) => {
                self.end(End::Failed);
                Poll::Ready(Some(Err(StreamError::Failed)))
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.end(End::TimedOut);
                    Poll::Ready(Some(Err(StreamError::TimedOut)))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.on_end.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for StreamedBody {
    fn drop(&mut self) {
        self.end(End::ClientGone);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    fn body(
        first: &'static [u8],
        deadline: Duration,
    ) -> (StreamedBody, mpsc::Sender<Chunk>, Arc<Mutex<Vec<End>>>) {
        let (tx, rx) = mpsc::channel(4);
        let ends = Arc::new(Mutex::new(Vec::new()));
        let seen = ends.clone();
        let b = StreamedBody::new(Bytes::from_static(first), rx, Instant::now() + deadline)
            .on_end(move |e| seen.lock().unwrap().push(e));
        (b, tx, ends)
    }

    #[tokio::test]
    async fn chunks_then_the_end() {
        let (mut b, tx, ends) = body(b"head-rest", Duration::from_secs(60));
        tx.send(Chunk::Data(Bytes::from_static(b"a")))
            .await
            .unwrap();
        tx.send(Chunk::Data(Bytes::from_static(b"b")))
            .await
            .unwrap();
        tx.send(Chunk::End).await.unwrap();
        let mut got = Vec::new();
        while let Some(f) = b.frame().await {
            got.extend_from_slice(&f.unwrap().into_data().unwrap());
        }
        assert_eq!(got, b"head-restab");
        assert!(b.is_end_stream());
        drop(b);
        assert_eq!(*ends.lock().unwrap(), [End::Complete], "observed once");
    }

    #[tokio::test]
    async fn a_closed_channel_without_end_is_a_failure() {
        let (mut b, tx, ends) = body(b"", Duration::from_secs(60));
        tx.send(Chunk::Data(Bytes::from_static(b"a")))
            .await
            .unwrap();
        drop(tx);
        assert!(b.frame().await.unwrap().is_ok());
        assert!(b.frame().await.unwrap().is_err());
        assert!(b.frame().await.is_none());
        assert_eq!(*ends.lock().unwrap(), [End::Failed]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_cuts_the_stream() {
        let (mut b, _tx, ends) = body(b"", Duration::from_millis(500));
        assert!(matches!(b.frame().await, Some(Err(StreamError::TimedOut))));
        assert_eq!(*ends.lock().unwrap(), [End::TimedOut]);
    }

    #[tokio::test]
    async fn a_client_that_goes_away_is_observed() {
        let (b, _tx, ends) = body(b"x", Duration::from_secs(60));
        drop(b);
        assert_eq!(*ends.lock().unwrap(), [End::ClientGone]);
    }
}
