//! Blobs of a whole compressed archive pushed while it arrives, from the one decode the
//! follower runs behind the prefix (the index pass of `archive`, with a [`Tee`]): the walker
//! hands each blob's bytes (or, for a classic layer gzip'ed, its gzip members) to a [`Feed`],
//! and the push sends them as they come — a blob named by its digest in one `PUT` after a
//! `HEAD`, a classic layer in a chunked upload (see `chunked`) committed under the digest
//! worked out on the way.
//!
//! One attempt each: the decoder moves forward only, so a blob whose push fails is left to the
//! pass after `complete`, which reads it through a decoder of its own (with the retry policy).
//!
//! [`Tee`]: crate::image::archive::Tee

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use runr_registry::reqwest;
use runr_registry::Sha256Hasher;
use tokio::sync::{mpsc, oneshot};

use super::pieces::{self, Pieces};
use super::{Attempt, PushError, Pusher, Sent};
use crate::image::archive::Sink;
use crate::image::compress;

/// What a fed blob is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fed {
    /// An OCI blob: its digest is its name, its bytes come as they are.
    Named(String),
    /// An uncompressed classic layer pushed as it is: its digest is worked out on the way.
    Layer,
    /// An uncompressed classic layer gzip'ed by the index pass: its gzip members come.
    Gzipping,
}

/// How the walker's side of a fed blob ended: what it made, or why it could not go on.
type Outcome = Arc<Mutex<Option<Result<compress::Made, String>>>>;

/// The walker's end of a fed blob: what it reads is gathered into pieces of a block, which go
/// into the request body (through a channel of one, in the body's two buffers: bounded memory
/// whatever the registry's pace). Dropped without [`Sink::end`] (the archive could not be read
/// to the blob's end), it fails the push, which never commits.
pub struct Feed {
    tx: Option<mpsc::Sender<Result<Bytes, String>>>,
    pieces: Pieces,
    fed: Fed,
    len: u64,
    got: u64,
    /// Of what was fed: a named blob's is checked against its name before its last piece
    /// goes, a classic layer's is its digest.
    hasher: Sha256Hasher,
    outcome: Outcome,
}

impl Feed {
    /// Hands `data` to the body, and what is gathered too when `last`; false when the push is
    /// over (it failed), and the walk goes on without it.
    fn send(&mut self, data: &[u8], last: bool) -> bool {
        let Feed { tx, pieces, .. } = self;
        let mut send = |piece: Bytes| {
            tx.as_ref()
                .is_some_and(|tx| tx.blocking_send(Ok(piece)).is_ok())
        };
        let went = pieces.write(data, &mut send) && (!last || pieces.flush(&mut send));
        if !went {
            self.tx = None;
        }
        went
    }

    fn fail(&mut self, why: String) {
        if let Some(tx) = self.tx.take() {
            *self.outcome.lock().expect("outcome lock") = Some(Err(why.clone()));
            let _ = tx.blocking_send(Err(why));
        }
    }
}

impl Sink for Feed {
    fn piece(&mut self, piece: &[u8]) -> bool {
        if self.tx.is_none() {
            return false;
        }
        if self.fed != Fed::Gzipping {
            self.hasher.update(piece);
        }
        self.got += piece.len() as u64;
        if let Fed::Named(digest) = &self.fed {
            if self.got == self.len {
                let actual = self.hasher.clone().finish();
                if actual != *digest {
                    let why = format!(
                        "blob {digest} in the file does not match its digest (its content hashes to {actual}): the file is damaged"
                    );
                    self.fail(why);
                    return false;
                }
            }
        }
        // A blob's last bytes go at once (a layer's gzip members end only at `end`).
        let last = self.fed != Fed::Gzipping && self.got == self.len;
        self.send(piece, last)
    }

    fn end(mut self: Box<Self>, made: Option<&compress::Made>) {
        if self.tx.is_none() {
            return;
        }
        let made = match &self.fed {
            Fed::Gzipping => made.cloned(),
            Fed::Named(digest) => Some((digest.clone(), digest.clone(), self.got)),
            Fed::Layer => {
                let digest = self.hasher.clone().finish();
                Some((digest.clone(), digest, self.got))
            }
        };
        if !self.send(&[], true) {
            return;
        }
        match made {
            Some(made) if self.fed == Fed::Gzipping || self.got == self.len => {
                // Recorded before the channel closes: the body ends, and the commit goes,
                // only after.
                *self.outcome.lock().expect("outcome lock") = Some(Ok(made));
                self.tx = None;
                // The walk moves on once the request took the blob's last bytes, as it did
                // each piece before: a blob is not left in flight behind the next one.
                self.pieces.settle();
            }
            _ => {
                let why = format!("{} of {} bytes came", self.got, self.len);
                self.fail(why);
            }
        }
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.fail("the archive could not be read to the end of this entry".into());
    }
}

impl Pusher {
    /// Pushes the blob `fed` of `len` bytes (`what` names it in messages) from what the walker
    /// feeds: `ready` gets the walker's end, or `None` when a blob named by its digest is in
    /// the registry already (a `HEAD`: then it counts as pushed). One attempt. Returns what the
    /// blob made (`(diff_id, digest, size)`; `None` when it was there already).
    pub async fn push_fed(
        &self,
        fed: Fed,
        len: u64,
        what: &str,
        ready: oneshot::Sender<Option<Feed>>,
    ) -> Result<Option<compress::Made>, PushError> {
        if let Fed::Named(digest) = &fed {
            if self.already_there(digest, len, what).await? {
                return Ok(None);
            }
        }
        let attempt = Arc::new(AtomicU64::new(0));
        let outcome: Outcome = Arc::default();
        let (tx, rx) = mpsc::channel::<Result<Bytes, String>>(1);
        let feed = Feed {
            tx: Some(tx),
            pieces: Pieces::new(),
            fed: fed.clone(),
            len,
            got: 0,
            hasher: Sha256Hasher::new(),
            outcome: outcome.clone(),
        };
        if ready.send(Some(feed)).is_err() {
            return Err(PushError::Content(format!("{what}: the walk ended")));
        }
        let sent = Sent {
            progress: self.progress.clone(),
            attempt: attempt.clone(),
        };
        let body = pieces::body(rx, sent);
        let gzip = fed == Fed::Gzipping;
        let label = match &fed {
            Fed::Named(digest) => format!("pushing {what} {digest} as the archive arrives"),
            Fed::Layer => format!("pushing layer {what} as the archive arrives"),
            Fed::Gzipping => format!("pushing layer {what} gzip'ed as the archive arrives"),
        };
        let pushed = match &fed {
            Fed::Named(digest) => {
                let push = async {
                    let put = self
                        .blobs
                        .push_blob_stream(&self.target, body, digest, Some(len))
                        .await;
                    // The walker's own failure is why the request broke, if it failed.
                    if let Some(Err(why)) = outcome.lock().expect("outcome lock").take() {
                        return Err(Attempt::Final(PushError::Content(why)));
                    }
                    put.map_err(Attempt::from)?;
                    Ok((digest.clone(), digest.clone(), len))
                };
                self.once(&label, push).await
            }
            Fed::Layer | Fed::Gzipping => {
                let push = self
                    .chunked_upload(&label, (reqwest::Body::wrap_stream(body), outcome.clone()));
                self.once(&label, push).await
            }
        };
        match pushed {
            Ok(made) => {
                if gzip {
                    self.progress.add_bytes(made.2);
                }
                self.progress.blob_done();
                Ok(Some(made))
            }
            Err(e) => {
                self.progress.unsent(attempt.swap(0, Ordering::SeqCst));
                Err(e)
            }
        }
    }

    /// One attempt of a request, its failure read as [`Pusher::retry`] reads a final one.
    async fn once<T, E>(
        &self,
        what: &str,
        attempt: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, PushError>
    where
        E: Into<Attempt>,
    {
        self.authorize(what).await?;
        match attempt.await.map_err(Into::into) {
            Ok(v) => Ok(v),
            Err(Attempt::Final(e)) => Err(e),
            Err(Attempt::Registry(e)) => Err(self.failure(what, &e).await),
        }
    }
}
