//! Blobs, then manifests, into the registry through oci-client, with retries of transient
//! failures.
//!
//! - A blob the registry has (HEAD) is not sent again.
//! - Blobs stream from their offsets in the archive in one monolithic `PUT` each (a second
//!   oci-client with `use_monolithic_push`: the chunked mode PATCHes 4 MiB at a time, a size
//!   oci-client fixes, and the distribution registry pays per PATCH — ~2.5× slower on 1 GiB).
//!   Never whole in memory: 4 MiB reads feed the request body. The stream hashes what it sends
//!   and fails before the upload is committed when the bytes do not match the digest, so a
//!   damaged file is reported in its own terms and nothing wrong lands in the registry.
//! - Uncompressed classic layers are gzip'ed first (`RUNR_UPLOAD_COMPRESS=gzip`) into an unlinked
//!   temporary file in `RUNR_UPLOAD_DIR`: 1 MiB blocks, two at a time on two threads, each an
//!   independent gzip member (a multi-member stream, which every gzip reader, Go's included,
//!   reads as one); blocks that do not compress are stored. Then the file is pushed like any
//!   blob, so its digest is known before the push (HEAD-skip, monolithic PUT).
//! - Transient failures (connection, 5xx, 429) are retried [`RETRIES`] times with backoff; then
//!   the registry's own message is reported.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::Stream;
use runr_base::fmt::{error_chain, hex};
use runr_registry::oci_client::errors::OciDistributionError;
use runr_registry::oci_client::secrets::RegistryAuth;
use runr_registry::oci_client::{Client, Reference};
use runr_registry::{
    build_client, client_config, client_from, is_transient, Backoff, RegistryConfig, Timeouts,
};
use sha2::{Digest as _, Sha256};

use crate::image::archive::Span;
use crate::image::formats::{media, RawManifest};

/// Attempts after the first for a transient failure.
pub const RETRIES: u32 = 3;
/// Bytes read (and sent) per step: oci-client PATCHes each stream item of up to 4 MiB as is.
const BLOCK: usize = 4 << 20;
/// Bytes gzip'ed as one member; two are compressed at once. Small enough to keep memory low,
/// large enough that a member's framing and lost context do not matter.
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
    /// Same registry and credentials, pushing blobs in one PUT each.
    blobs: Client,
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
        let blobs = monolithic_client(registry)?;
        let auth = registry.auth();
        for c in [&client, &blobs] {
            c.store_auth_if_needed(target.resolve_registry(), &auth)
                .await;
        }
        Ok(Pusher {
            client,
            blobs,
            auth,
            target,
            backoff,
        })
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
        self.push_stream(file, span, digest, what, true).await
    }

    /// [`Pusher::push_span`] for a file this process wrote and hashed itself (a compressed
    /// layer): no second hash on the way out.
    pub async fn push_own_file(
        &self,
        file: &Arc<File>,
        span: Span,
        digest: &str,
        what: &str,
    ) -> Result<bool, PushError> {
        self.push_stream(file, span, digest, what, false).await
    }

    async fn push_stream(
        &self,
        file: &Arc<File>,
        span: Span,
        digest: &str,
        what: &str,
        check: bool,
    ) -> Result<bool, PushError> {
        if self.blob_exists(digest).await? {
            tracing::info!(what, digest, "blob already in the registry");
            return Ok(false);
        }
        tracing::info!(what, digest, size = span.len, "pushing blob");
        let mismatch = Arc::new(Mutex::new(None));
        let result = self
            .retry(&format!("pushing {what} {digest}"), || {
                let stream = span_stream(
                    file.clone(),
                    span,
                    digest.to_string(),
                    what.to_string(),
                    check,
                    mismatch.clone(),
                );
                self.blobs
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
            self.blobs.push_blob(&self.target, data.clone(), digest)
        })
        .await
        .map(|_| ())
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

/// An oci-client like [`build_client`]'s (same roots, protocol and timeouts) that pushes each
/// blob in one request.
fn monolithic_client(registry: &RegistryConfig) -> Result<Client, PushError> {
    let mut config = client_config(registry, Timeouts::default(), USER_AGENT)
        .map_err(|e| PushError::Client(e.to_string()))?;
    config.use_monolithic_push = true;
    client_from(config).map_err(|e| PushError::Client(e.to_string()))
}

/// gzip's an uncompressed layer (`span` of `file`) into an unlinked temporary file in
/// `work_dir`, checking its uncompressed digest against `diff_id` on the way. Returns the
/// compressed file, its length and its digest. Blocking: run it on a blocking thread.
pub fn compress_layer(
    file: &File,
    span: Span,
    diff_id: &str,
    name: &str,
    work_dir: &std::path::Path,
) -> Result<(Arc<File>, u64, String), PushError> {
    use std::io::Write;
    let io_err = |what: &str, e: std::io::Error| {
        PushError::Content(format!("{what} while compressing layer {name}: {e}"))
    };
    let tmp_path = work_dir.join(format!(
        ".runr-layer-{}-{}.gz",
        std::process::id(),
        TMP_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let out = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&tmp_path)
        .map_err(|e| io_err(&format!("creating {}", tmp_path.display()), e))?;
    // Only the handle keeps the data: nothing is left behind, whatever happens next.
    let _ = std::fs::remove_file(&tmp_path);
    let mut writer = std::io::BufWriter::with_capacity(1 << 20, &out);
    let mut raw = Sha256::new();
    let mut packed = Sha256::new();
    let mut len = 0u64;
    let mut pos = span.offset;
    let end = span.offset + span.len;
    let mut first = true;
    while pos < end || first {
        first = false;
        let mut blocks = Vec::with_capacity(2);
        for _ in 0..2 {
            if pos >= end && !blocks.is_empty() {
                break;
            }
            let n = (end - pos).min(GZIP_BLOCK as u64) as usize;
            let mut buf = vec![0u8; n];
            file.read_exact_at(&mut buf, pos)
                .map_err(|e| io_err("reading the archive", e))?;
            pos += n as u64;
            blocks.push(buf);
        }
        // Both blocks compress on threads of their own while this one hashes them in order.
        let members: Vec<Vec<u8>> = std::thread::scope(|s| {
            let workers: Vec<_> = blocks
                .iter()
                .map(|b| s.spawn(move || gzip_member(b)))
                .collect();
            for b in &blocks {
                raw.update(b);
            }
            workers
                .into_iter()
                .map(|w| w.join().expect("gzip thread"))
                .collect()
        });
        for m in members {
            packed.update(&m);
            len += m.len() as u64;
            writer
                .write_all(&m)
                .map_err(|e| io_err(&format!("writing into {}", work_dir.display()), e))?;
        }
    }
    writer
        .flush()
        .map_err(|e| io_err(&format!("writing into {}", work_dir.display()), e))?;
    drop(writer);
    let actual = format!("sha256:{}", hex(&raw.finalize()));
    if actual != diff_id {
        return Err(PushError::Content(format!(
            "layer {name} in the file does not match its diff_id {diff_id} (its content hashes to {actual}): the file is damaged"
        )));
    }
    Ok((
        Arc::new(out),
        len,
        format!("sha256:{}", hex(&packed.finalize())),
    ))
}

/// Makes temporary names unique within the process.
static TMP_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

type Item = Result<Bytes, OciDistributionError>;

fn stream_error(message: &str) -> OciDistributionError {
    OciDistributionError::GenericError(Some(message.to_string()))
}

/// `span` of `file`, 4 MiB per item, hashed. The last block is checked before it is handed over:
/// on a mismatch with `digest` an error item takes its place (and is recorded in `mismatch`), so
/// the request body ends short and the registry never commits the upload.
fn span_stream(
    file: Arc<File>,
    span: Span,
    digest: String,
    what: String,
    check: bool,
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
            // `None` once the last block (or an error) went out.
            let mut hasher = st.hasher.take()?;
            let n = (st.end - st.pos).min(BLOCK as u64) as usize;
            let last = st.pos + n as u64 >= st.end;
            let (file, pos) = (st.file.clone(), st.pos);
            let read = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; n];
                file.read_exact_at(&mut buf, pos)?;
                if check {
                    hasher.update(&buf);
                }
                let actual =
                    (last && check).then(|| format!("sha256:{}", hex(&hasher.clone().finalize())));
                Ok::<_, std::io::Error>((buf, hasher, actual))
            })
            .await;
            match read {
                Ok(Ok((buf, hasher, actual))) => {
                    st.pos += n as u64;
                    if let Some(actual) = actual.filter(|a| *a != digest) {
                        let message = format!(
                            "{what} {digest} in the file does not match its digest (its content hashes to {actual}): the file is damaged"
                        );
                        *mismatch.lock().expect("mismatch lock") = Some(message.clone());
                        return Some((Err(stream_error(&message)), st));
                    }
                    if !last {
                        st.hasher = Some(hasher);
                    }
                    Some((Ok(Bytes::from(buf)), st))
                }
                Ok(Err(e)) => Some((Err(stream_error(&format!("reading {what}: {e}"))), st)),
                Err(e) => Some((Err(stream_error(&format!("reading {what}: {e}"))), st)),
            }
        }
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

/// Bytes of a block tried first to decide how to compress it (1.6 % of a block: deflating the
/// sample of an incompressible layer is most of what gzip'ing it costs).
const SAMPLE: usize = 16 << 10;

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
