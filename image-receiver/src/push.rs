//! Blobs, then manifests, into the registry through oci-client, with retries of transient
//! failures.
//!
//! - A blob the registry has (HEAD) is not sent again.
//! - Blobs stream from their offsets in the archive, 4 MiB at a time (oci-client's fixed chunk
//!   size, one PATCH each), never whole in memory; the stream hashes what it sends and fails
//!   before the upload is committed when the bytes do not match the digest, so a damaged file is
//!   reported in its own terms and nothing wrong lands in the registry.
//! - Uncompressed classic layers are gzip'ed on the way (`RUNR_UPLOAD_COMPRESS=gzip`): blocks are
//!   compressed on both cores as independent gzip members (a multi-member gzip stream, which every
//!   gzip reader, Go's included, reads as one) and streamed out as they are ready.
//! - Transient failures (connection, 5xx, 429) are retried [`RETRIES`] times with backoff; then
//!   the registry's own message is reported.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::Stream;
use runr_registry::oci_client::errors::OciDistributionError;
use runr_registry::oci_client::secrets::RegistryAuth;
use runr_registry::oci_client::{Client, Reference};
use runr_registry::{build_client, is_transient, Backoff, RegistryConfig, Timeouts};
use sha2::{Digest as _, Sha256};

use crate::archive::Span;
use crate::formats::{hex, media, RawManifest};

/// Attempts after the first for a transient failure.
pub const RETRIES: u32 = 3;
/// Bytes read (and sent) per step: oci-client PATCHes each stream item of up to 4 MiB as is.
const BLOCK: usize = 4 << 20;
/// Bytes gzip'ed as one member; two are compressed at once. Small enough to keep memory low,
/// large enough that a member's 18 bytes of framing and lost context do not matter.
const GZIP_BLOCK: usize = 1 << 20;
/// Seen in the registry's logs.
const USER_AGENT: &str = concat!("runr-image-upload/", env!("CARGO_PKG_VERSION"));

/// A push that failed; the message is for the user.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// The target reference is malformed.
    #[error("RUNR_UPLOAD_TARGET {0:?} is not a valid image reference")]
    Target(String),
    /// The client could not be built.
    #[error("failed to set up the registry client: {0}")]
    Client(String),
    /// The registry refused or kept failing.
    #[error("the registry {host} failed while {what}: {message}")]
    Registry {
        /// Registry host.
        host: String,
        /// What we were doing.
        what: String,
        /// The registry's (or connection's) own message.
        message: String,
    },
    /// The file's bytes do not match what they claim to be.
    #[error("{0}")]
    Content(String),
    /// The tag does not point at what we pushed.
    #[error("after the push, {tag} points at {found}, not at the pushed {pushed}; another upload may have replaced it")]
    ReadBack {
        /// The tag.
        tag: String,
        /// What the registry answers.
        found: String,
        /// What we pushed.
        pushed: String,
    },
}

/// Pushes into one repository; the tag of [`Pusher::target`] is written last.
pub struct Pusher {
    client: Client,
    auth: RegistryAuth,
    target: Reference,
    backoff: Backoff,
}

impl Pusher {
    /// A pusher for `target` (`host[:port]/path/repo:tag`).
    pub async fn new(
        target: &str,
        registry: &RegistryConfig,
        backoff: Backoff,
    ) -> Result<Pusher, PushError> {
        let target: Reference = target
            .parse()
            .map_err(|_| PushError::Target(target.to_string()))?;
        let client = build_client(registry, Timeouts::default(), USER_AGENT)
            .map_err(|e| PushError::Client(e.to_string()))?;
        let auth = registry.auth();
        client
            .store_auth_if_needed(target.resolve_registry(), &auth)
            .await;
        Ok(Pusher {
            client,
            auth,
            target,
            backoff,
        })
    }

    /// The target reference.
    pub fn target(&self) -> &Reference {
        &self.target
    }

    /// `host/repository:tag`.
    pub fn tag_ref(&self) -> String {
        format!(
            "{}/{}:{}",
            self.target.registry(),
            self.target.repository(),
            self.target.tag().unwrap_or("latest")
        )
    }

    /// `host/repository@digest`.
    pub fn image_ref(&self, digest: &str) -> String {
        format!(
            "{}/{}@{digest}",
            self.target.registry(),
            self.target.repository()
        )
    }

    fn by_digest(&self, digest: &str) -> Reference {
        Reference::with_digest(
            self.target.registry().to_string(),
            self.target.repository().to_string(),
            digest.to_string(),
        )
    }

    /// Runs `op` until it succeeds, fails for good, or failed transiently [`RETRIES`] + 1 times.
    async fn retry<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T, PushError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, OciDistributionError>>,
    {
        let mut attempt = 0;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) if is_transient(&e) && attempt < RETRIES => {
                    let delay = self.backoff.delay(attempt);
                    tracing::warn!(what, attempt, error = %error_chain(&e), ?delay, "registry request failed, retrying");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(e) => {
                    return Err(PushError::Registry {
                        host: self.target.registry().to_string(),
                        what: what.to_string(),
                        message: error_chain(&e),
                    })
                }
            }
        }
    }

    /// True when the repository has the blob already.
    pub async fn blob_exists(&self, digest: &str) -> Result<bool, PushError> {
        self.retry(&format!("checking for blob {digest}"), || {
            self.client.blob_exists(&self.target, digest)
        })
        .await
    }

    /// Pushes `span` of `file` as blob `digest` unless the registry has it; `what` names it in
    /// messages. The bytes are hashed as they go and the upload fails before its commit when they
    /// do not hash to `digest`.
    pub async fn push_span(
        &self,
        file: &Arc<File>,
        span: Span,
        digest: &str,
        what: &str,
    ) -> Result<bool, PushError> {
        if self.blob_exists(digest).await? {
            return Ok(false);
        }
        let mismatch = Arc::new(Mutex::new(None));
        let result = self
            .retry(&format!("pushing {what} {digest}"), || {
                let stream = span_stream(
                    file.clone(),
                    span,
                    digest.to_string(),
                    what.to_string(),
                    mismatch.clone(),
                );
                self.client
                    .push_blob_stream(&self.target, stream, digest, Some(span.len))
            })
            .await;
        if let Some(message) = mismatch.lock().expect("mismatch lock").take() {
            return Err(PushError::Content(message));
        }
        result.map(|_| true)
    }

    /// Pushes a small blob held in memory (a config written here).
    pub async fn push_bytes(&self, data: Bytes, digest: &str, what: &str) -> Result<(), PushError> {
        if self.blob_exists(digest).await? {
            return Ok(());
        }
        self.retry(&format!("pushing {what} {digest}"), || {
            self.client.push_blob(&self.target, data.clone(), digest)
        })
        .await
        .map(|_| ())
    }

    /// gzip's an uncompressed layer on the way (both cores), checking its uncompressed digest
    /// against `diff_id`; returns the compressed blob's digest and size.
    pub async fn push_gzipped(
        &self,
        file: &Arc<File>,
        span: Span,
        diff_id: &str,
        name: &str,
    ) -> Result<(String, u64), PushError> {
        let mismatch = Arc::new(Mutex::new(None));
        let result = self
            .retry(&format!("pushing layer {name} (gzip'ed)"), || {
                let stream = gzip_stream(
                    file.clone(),
                    span,
                    diff_id.to_string(),
                    name.to_string(),
                    mismatch.clone(),
                );
                self.client.push_blob_stream_chunked(&self.target, stream)
            })
            .await;
        if let Some(message) = mismatch.lock().expect("mismatch lock").take() {
            return Err(PushError::Content(message));
        }
        let pushed = result?;
        Ok((pushed.blob_digest, pushed.size))
    }

    /// Pushes a manifest by digest (`tag == false`) or as the target tag.
    pub async fn push_manifest(&self, raw: &RawManifest, tag: bool) -> Result<(), PushError> {
        let reference = if tag {
            self.target.clone()
        } else {
            self.by_digest(&raw.digest)
        };
        let content_type = http::HeaderValue::from_str(&raw.media_type)
            .map_err(|_| PushError::Content(format!("bad media type {:?}", raw.media_type)))?;
        let body = Bytes::from(raw.bytes.clone());
        let what = if tag {
            format!("tagging {} as {}", raw.digest, self.tag_ref())
        } else {
            format!("pushing manifest {}", raw.digest)
        };
        self.retry(&what, || {
            self.client
                .push_manifest_raw(&reference, body.clone(), content_type.clone())
        })
        .await
        .map(|_| ())
    }

    /// Reads the tag back and requires `digest`.
    pub async fn read_back(&self, digest: &str) -> Result<(), PushError> {
        let found = self
            .retry(&format!("reading back {}", self.tag_ref()), || {
                self.client.fetch_manifest_digest(&self.target, &self.auth)
            })
            .await?;
        if found != digest {
            return Err(PushError::ReadBack {
                tag: self.tag_ref(),
                found,
                pushed: digest.to_string(),
            });
        }
        Ok(())
    }

    /// The image manifest the tag points at now, if it is one (not an index).
    pub async fn current_manifest(&self) -> Option<(Vec<u8>, String)> {
        let accept = [media::OCI_MANIFEST, media::DOCKER_MANIFEST];
        match self
            .client
            .pull_manifest_raw(&self.target, &self.auth, &accept)
            .await
        {
            Ok((bytes, digest)) => Some((bytes.to_vec(), digest)),
            Err(_) => None,
        }
    }
}

/// The registry's (or the connection's) own words, with the causes a reqwest error hides.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
        source = cause.source();
    }
    s
}

type Item = Result<Bytes, OciDistributionError>;

fn stream_error(message: &str) -> OciDistributionError {
    OciDistributionError::GenericError(Some(message.to_string()))
}

/// `span` of `file`, 4 MiB per item, hashed; at the end a mismatch with `digest` becomes an error
/// item (and is recorded in `mismatch`), so oci-client never commits the upload.
fn span_stream(
    file: Arc<File>,
    span: Span,
    digest: String,
    what: String,
    mismatch: Arc<Mutex<Option<String>>>,
) -> impl Stream<Item = Item> + Send + 'static {
    struct State {
        file: Arc<File>,
        pos: u64,
        end: u64,
        hasher: Option<Sha256>,
    }
    let state = State {
        file,
        pos: span.offset,
        end: span.offset + span.len,
        hasher: Some(Sha256::new()),
    };
    futures_util::stream::unfold(state, move |mut st| {
        let digest = digest.clone();
        let what = what.clone();
        let mismatch = mismatch.clone();
        async move {
            let mut hasher = st.hasher.take()?;
            if st.pos >= st.end {
                let actual = format!("sha256:{}", hex(&hasher.finalize()));
                if actual == digest {
                    return None;
                }
                let message = format!(
                    "{what} {digest} in the file does not match its digest (its content hashes to {actual}): the file is damaged"
                );
                *mismatch.lock().expect("mismatch lock") = Some(message.clone());
                return Some((Err(stream_error(&message)), st));
            }
            let n = (st.end - st.pos).min(BLOCK as u64) as usize;
            let (file, pos) = (st.file.clone(), st.pos);
            let read = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; n];
                file.read_exact_at(&mut buf, pos)?;
                hasher.update(&buf);
                Ok::<_, std::io::Error>((buf, hasher))
            })
            .await;
            match read {
                Ok(Ok((buf, hasher))) => {
                    st.pos += n as u64;
                    st.hasher = Some(hasher);
                    Some((Ok(Bytes::from(buf)), st))
                }
                Ok(Err(e)) => Some((Err(stream_error(&format!("reading {what}: {e}"))), st)),
                Err(e) => Some((Err(stream_error(&format!("reading {what}: {e}"))), st)),
            }
        }
    })
}

/// The gzip'ed form of `span`, produced on a blocking thread (two blocks at a time on two
/// threads) and handed over through a small channel, so memory stays at a few blocks.
fn gzip_stream(
    file: Arc<File>,
    span: Span,
    diff_id: String,
    name: String,
    mismatch: Arc<Mutex<Option<String>>>,
) -> impl Stream<Item = Item> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<Item>(1);
    tokio::task::spawn_blocking(move || {
        let mut raw = Sha256::new();
        let mut pos = span.offset;
        let end = span.offset + span.len;
        let mut out: Vec<u8> = Vec::with_capacity(BLOCK);
        let mut first = true;
        while pos < end || first {
            first = false;
            // Two blocks: one compressed on a helper thread, one here.
            let mut blocks = Vec::with_capacity(2);
            for _ in 0..2 {
                if pos >= end && !blocks.is_empty() {
                    break;
                }
                let n = (end - pos).min(GZIP_BLOCK as u64) as usize;
                let mut buf = vec![0u8; n];
                if let Err(e) = file.read_exact_at(&mut buf, pos) {
                    let _ =
                        tx.blocking_send(Err(stream_error(&format!("reading layer {name}: {e}"))));
                    return;
                }
                raw.update(&buf);
                pos += n as u64;
                blocks.push(buf);
            }
            let members: Vec<Vec<u8>> = std::thread::scope(|s| {
                let mut it = blocks.iter();
                let a = it.next().expect("a block");
                let helper = it.next().map(|b| s.spawn(move || gzip_member(b)));
                let mut v = vec![gzip_member(a)];
                if let Some(h) = helper {
                    v.push(h.join().expect("gzip thread"));
                }
                v
            });
            drop(blocks);
            for m in members {
                // oci-client sends each item as one PATCH: keep them near 4 MiB, and never let
                // the buffer outgrow its allocation (a doubled Vec would travel on as 8 MiB).
                if out.len() + m.len() > BLOCK && !out.is_empty() {
                    let chunk = std::mem::replace(&mut out, Vec::with_capacity(BLOCK));
                    if tx.blocking_send(Ok(Bytes::from(chunk))).is_err() {
                        return;
                    }
                }
                out.extend_from_slice(&m);
            }
        }
        let actual = format!("sha256:{}", hex(&raw.finalize()));
        if actual != diff_id {
            let message = format!(
                "layer {name} in the file does not match its diff_id {diff_id} (its content hashes to {actual}): the file is damaged"
            );
            *mismatch.lock().expect("mismatch lock") = Some(message.clone());
            let _ = tx.blocking_send(Err(stream_error(&message)));
            return;
        }
        if !out.is_empty() {
            let _ = tx.blocking_send(Ok(Bytes::from(out)));
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        Some((item, rx))
    })
}

/// One self-contained gzip member of `data`: level 1, or stored blocks when a sample shows the
/// data does not compress (random or already-compressed files in a layer are common, and
/// deflating them costs a core for nothing).
fn gzip_member(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    if !compresses(&data[..data.len().min(SAMPLE)]) {
        return gzip_stored(data);
    }
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 2 + 1024),
        flate2::Compression::fast(),
    );
    enc.write_all(data).expect("write to memory");
    enc.finish().expect("finish in memory")
}

/// A gzip member of stored (uncompressed) deflate blocks, RFC 1952 around RFC 1951 §3.2.4.
/// Written here because flate2's level 0 still runs its compressor over every byte; this is a
/// copy and a CRC.
fn gzip_stored(data: &[u8]) -> Vec<u8> {
    const MAX_STORED: usize = 65_535;
    let mut out = Vec::with_capacity(data.len() + data.len() / MAX_STORED * 5 + 32);
    // Magic, deflate, no flags, no mtime, no extra flags, OS unknown.
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
    let mut blocks = data.chunks(MAX_STORED).peekable();
    if blocks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(block) = blocks.next() {
        let last = blocks.peek().is_none();
        let len = block.len() as u16;
        out.push(u8::from(last));
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    let mut crc = flate2::Crc::new();
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// Bytes of a block tried first to decide how to compress it.
const SAMPLE: usize = 64 << 10;

/// True when level 1 saves at least 5 % on `sample`.
fn compresses(sample: &[u8]) -> bool {
    use std::io::Write;
    let mut enc = flate2::write::DeflateEncoder::new(
        Vec::with_capacity(sample.len() + 1024),
        flate2::Compression::fast(),
    );
    enc.write_all(sample).expect("write to memory");
    let out = enc.finish().expect("finish in memory");
    (out.len() as u64) * 100 < (sample.len() as u64) * 95
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn members_decompress_to_the_input_whether_stored_or_deflated() {
        let text: Vec<u8> = b"layer ".iter().cycle().take(300_000).copied().collect();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..300_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        assert!(compresses(&text[..SAMPLE]));
        assert!(!compresses(&noise[..SAMPLE]));
        let mut joined = gzip_member(&text);
        joined.extend(gzip_member(&noise));
        assert!(joined.len() < text.len() / 10 + noise.len() + 1024);
        joined.extend(gzip_stored(&[]));
        joined.extend(gzip_stored(&text[..70_000]));
        let mut back = Vec::new();
        flate2::read::MultiGzDecoder::new(&joined[..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, [&text[..], &noise[..], &text[..70_000]].concat());
    }
}
