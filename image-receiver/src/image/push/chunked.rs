//! A classic layer pushed while it arrives: its digest is known only at its end, so it goes in
//! a chunked upload of the distribution API — `POST` a session, one `PATCH` whose body follows
//! the upload's contiguous prefix, `PUT ?digest=` with the digest worked out on the way — as it
//! is (`RUNR_UPLOAD_COMPRESS=none`) or gzip'ed as it arrives ([`compress::gzip_blocks`]).
//!
//! The `PATCH` body has no length known in advance: it goes with chunked transfer encoding and
//! without `Content-Range`, the distribution specification's streamed upload, which
//! docker-registry 2.8 (which ignores `Content-Range` anyway), distribution 3 and zot append
//! to the session as it comes. One request for the whole layer, because the registry pays per
//! `PATCH` (oci-client's chunked push, one `PATCH` per 1 MiB piece and one at a time, reached
//! ~40–60 MB/s into docker-registry, behind a loopback upload).
//!
//! Plain reqwest, since oci-client has no request whose body is a stream of unknown length;
//! every request carries the push's grant ([`Pusher::authorized`]), renewed between requests
//! when its token nears its expiry (the `PATCH` of a slow upload may outlast a token). A failed
//! request starts the layer again from its first byte in a new session, with the push's retry
//! policy; the bytes are read again from the file (and gzip'ed again into the same bytes).

use std::fs::File;
use std::io::{Read as _, Seek as _};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use runr_registry::oci_client::errors::OciDistributionError;
use runr_registry::reqwest::{self, header, StatusCode};
use runr_registry::Sha256Hasher;

use super::pieces::{self, Pieces};
use super::{Attempt, Follow, PushError, Pusher, Sent, BLOCK};
use crate::image::compress::{self, Compress};
use crate::image::span::Span;
use crate::prefix::FollowReader;

/// How the producer of one attempt's body ended: what the layer made, or why it could not be
/// read (the upload reopened, the file unreadable). `None` while it runs, and when it stopped
/// because the request was gone.
type Outcome = Arc<Mutex<Option<Result<compress::Made, String>>>>;

impl Pusher {
    /// Pushes the uncompressed classic layer at `span` of `file`, still arriving (each block is
    /// read once the prefix of `follow`'s generation holds it), gzip'ed on the way when
    /// `compress` says so; there is no `HEAD` first (the digest is known only at the end).
    /// Returns what the layer made: `(diff_id, digest, size)`, where digest and diff_id are
    /// one for a layer pushed as it is.
    pub async fn push_arriving(
        &self,
        file: &Arc<File>,
        span: Span,
        what: &str,
        compress: Compress,
        follow: Follow,
    ) -> Result<compress::Made, PushError> {
        let gzip = compress == Compress::Gzip;
        tracing::info!(
            what,
            size = span.len,
            gzip,
            "pushing layer as the upload arrives"
        );
        let label = if gzip {
            format!("pushing layer {what} gzip'ed as it arrives")
        } else {
            format!("pushing layer {what} as it arrives")
        };
        let attempt = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let result = self
            .retry(&label, || {
                self.progress.unsent(attempt.swap(0, Ordering::SeqCst));
                let sent = Sent {
                    progress: self.progress.clone(),
                    attempt: attempt.clone(),
                };
                self.chunked_upload(
                    &label,
                    arriving(file.clone(), span, what, compress, follow.clone(), sent),
                )
            })
            .await;
        match result {
            Ok(made) => {
                if gzip {
                    // Known only now: a layer gzip'ed counts its bytes once compressed.
                    self.progress.add_bytes(made.2);
                }
                self.progress.blob_done();
                Ok(made)
            }
            Err(e) => {
                self.progress.unsent(attempt.swap(0, Ordering::SeqCst));
                Err(e)
            }
        }
    }

    /// One attempt: a new session, the body in one `PATCH`, the commit under the digest its
    /// producer worked out.
    pub(super) async fn chunked_upload(
        &self,
        what: &str,
        (body, outcome): (reqwest::Body, Outcome),
    ) -> Result<compress::Made, Attempt> {
        let base = runr_registry::http::base_url(&self.registry, self.target.resolve_registry());
        let url = format!("{base}/v2/{}/blobs/uploads/", self.target.repository());
        let post = self
            .authorized(&url, self.http.post(&url))
            .await
            .header(header::CONTENT_LENGTH, 0);
        let resp = post.send().await.map_err(OciDistributionError::from)?;
        let location = self.location(resp, StatusCode::ACCEPTED).await?;

        self.authorize(what).await.map_err(Attempt::Final)?;
        let patch = self
            .authorized(&location, self.http.patch(&location))
            .await
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(body);
        let sent = patch.send().await;
        // The producer's own failure is why the request broke, if it failed: no retry cures it.
        let ended = outcome.lock().expect("outcome lock").take();
        if let Some(Err(why)) = ended {
            return Err(Attempt::Final(PushError::Content(why)));
        }
        let resp = sent.map_err(OciDistributionError::from)?;
        let range = resp
            .headers()
            .get(header::RANGE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let location = self.location(resp, StatusCode::ACCEPTED).await?;
        let Some(Ok(made)) = ended else {
            return Err(Attempt::Final(PushError::Content(format!(
                "{what}: the request body ended before the layer did"
            ))));
        };
        // What the registry says it holds of the session: every byte of the body.
        if let Some(range) = range.filter(|r| *r != format!("0-{}", made.2.saturating_sub(1))) {
            return Err(OciDistributionError::SpecViolationError(format!(
                "after a PATCH of {} bytes the upload session holds {range}",
                made.2
            ))
            .into());
        }

        self.authorize(what).await.map_err(Attempt::Final)?;
        let mut commit = reqwest::Url::parse(&location)
            .map_err(|e| OciDistributionError::UrlParseError(e.to_string()))?;
        commit.query_pairs_mut().append_pair("digest", &made.1);
        let commit = commit.to_string();
        let put = self
            .authorized(&commit, self.http.put(&commit))
            .await
            .header(header::CONTENT_LENGTH, 0);
        let resp = put.send().await.map_err(OciDistributionError::from)?;
        self.location(resp, StatusCode::CREATED).await?;
        Ok(made)
    }

    /// The `Location` of an answer that must have status `expected` (absolute, as a relative
    /// one is taken against the registry); the registry's error otherwise, as oci-client reports
    /// it (so the retry policy and the refusal diagnosis read it alike).
    async fn location(
        &self,
        resp: reqwest::Response,
        expected: StatusCode,
    ) -> Result<String, OciDistributionError> {
        let status = resp.status();
        if status == expected {
            let location = resp
                .headers()
                .get(header::LOCATION)
                .ok_or(OciDistributionError::RegistryNoLocationError)?
                .to_str()?;
            return Ok(if location.starts_with('/') {
                let host = self.target.resolve_registry();
                format!(
                    "{}{location}",
                    runr_registry::http::base_url(&self.registry, host)
                )
            } else {
                location.to_string()
            });
        }
        if status.is_success() {
            return Err(OciDistributionError::SpecViolationError(format!(
                "expected HTTP status {expected}, got {status}"
            )));
        }
        let url = resp.url().to_string();
        let code = status.as_u16();
        let message = resp.text().await?;
        Err(OciDistributionError::ServerError { url, code, message })
    }
}

/// The body of one attempt and its outcome: a blocking thread reads `span` of `file` behind the
/// prefix ([`BLOCK`] at a time, hashed) or gzip's it ([`compress::gzip_blocks`]: one member per
/// 1 MiB of input), and hands each piece to the request body through a channel of one, in the
/// body's two buffers ([`Pieces`]: bounded memory whatever the registry's pace, one piece being
/// made while the other is sent). It records the outcome before it drops its end of the
/// channel, so the body ends, and the commit is sent, only once the digest is known; a failure
/// ends the body with an error, so the session is never committed.
fn arriving(
    file: Arc<File>,
    span: Span,
    what: &str,
    compress: Compress,
    (prefix, generation): Follow,
    sent: Sent,
) -> (reqwest::Body, Outcome) {
    let outcome: Outcome = Arc::default();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, String>>(1);
    let what = what.to_string();
    let recorded = outcome.clone();
    tokio::task::spawn_blocking(move || {
        let mut reader = FollowReader::new(
            file,
            prefix,
            generation,
            span.offset.saturating_add(span.len),
        );
        let mut pieces = Pieces::new();
        // Set when the request is gone: the attempt failed already, nothing to record.
        let mut gone = false;
        let mut send = |piece: Bytes| -> bool {
            gone = tx.blocking_send(Ok(piece)).is_err();
            !gone
        };
        let made = match reader.seek(std::io::SeekFrom::Start(span.offset)) {
            Err(e) => Err(format!("reading layer {what}: {e}")),
            Ok(_) => match compress {
                Compress::None => as_it_is(&mut reader, span.len, &mut pieces, &mut send)
                    .map_err(|e| format!("reading layer {what}: {e}")),
                Compress::Gzip => gzipped(&mut reader, span.len, &what, &mut pieces, &mut send),
            },
        };
        match made {
            Ok(Some(made)) => *recorded.lock().expect("outcome lock") = Some(Ok(made)),
            Ok(None) => {}
            Err(_) if gone => {}
            Err(why) => {
                *recorded.lock().expect("outcome lock") = Some(Err(why.clone()));
                let _ = tx.blocking_send(Err(why));
            }
        }
    });
    (reqwest::Body::wrap_stream(pieces::body(rx, sent)), outcome)
}

/// The `len` bytes of `reader` in [`BLOCK`]s, hashed; `None` when `send` found the request gone.
fn as_it_is(
    reader: &mut FollowReader,
    len: u64,
    pieces: &mut Pieces,
    send: &mut impl FnMut(Bytes) -> bool,
) -> std::io::Result<Option<compress::Made>> {
    let mut hasher = Sha256Hasher::new();
    let mut left = len;
    while left > 0 {
        let mut block = pieces.take();
        block.resize(usize::try_from(left).map_or(BLOCK, |l| l.min(BLOCK)), 0);
        reader.read_exact(&mut block)?;
        hasher.update(&block);
        left -= block.len() as u64;
        if !send(pieces.piece(block)) {
            return Ok(None);
        }
    }
    let digest = hasher.finish();
    Ok(Some((digest.clone(), digest, len)))
}

/// The `len` bytes of `reader` gzip'ed, member by member; `None` when `send` found the request
/// gone.
fn gzipped(
    reader: &mut FollowReader,
    len: u64,
    what: &str,
    pieces: &mut Pieces,
    send: &mut impl FnMut(Bytes) -> bool,
) -> Result<Option<compress::Made>, String> {
    let mut packed = Sha256Hasher::new();
    let mut size = 0u64;
    let mut gone = false;
    let diff_id = compress::gzip_blocks(reader.take(len), len, what, |member| {
        packed.update(member);
        size += member.len() as u64;
        if pieces.write(member, send) {
            Ok(())
        } else {
            gone = true;
            Err(compress::LayerError::Io {
                what: "sending".into(),
                name: what.to_string(),
                source: std::io::Error::other("the request ended"),
            })
        }
    });
    match diff_id {
        Ok(_) if !pieces.flush(send) => Ok(None),
        Ok(diff_id) => Ok(Some((diff_id, packed.finish(), size))),
        Err(_) if gone => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}
