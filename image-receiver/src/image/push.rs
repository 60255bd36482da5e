//! Blobs, then manifests, into the registry through oci-client, with retries of transient
//! failures.
//!
//! - A blob the registry has (HEAD) is not sent again.
//! - Blobs stream from their offsets in the archive in one monolithic `PUT` each (a second
//!   oci-client with `use_monolithic_push`: the chunked mode PATCHes 4 MiB at a time, a size
//!   oci-client fixes, and the distribution registry pays per PATCH — ~2.5× slower on 1 GiB).
//!   Never whole in memory: 1 MiB reads feed the request body. The stream hashes what it sends
//!   and fails before the upload is committed when the bytes do not match the digest, so a
//!   damaged file is reported in its own terms and nothing wrong lands in the registry.
//! - Uncompressed classic layers are gzip'ed first (see `compress`), then pushed like any blob.
//! - Transient failures (connection, 5xx, 429) are retried [`RETRIES`] times with backoff; then
//!   the registry's own message is reported.

use std::fs::File;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::Stream;
use runr_base::fmt::error_chain;
use runr_registry::oci_client::errors::OciDistributionError;
use runr_registry::oci_client::secrets::RegistryAuth;
use runr_registry::oci_client::{Client, Reference, RegistryOperation};
use runr_registry::{
    build_client, client_config, client_from, diagnose, is_transient, Backoff, RegistryConfig,
    Timeouts,
};

use crate::image::formats::{media, RawManifest};
use crate::image::span::{Span, SpanReader};

/// Attempts after the first for a transient failure.
pub const RETRIES: u32 = 3;
/// Bytes read (and sent) per step. One request body per blob (monolithic PUT): the size only
/// sets how much memory each blob in flight holds (a read block, and what hyper has not
/// written to the socket yet).
const BLOCK: usize = 1 << 20;
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
    /// The registry (or its token service) refused the credentials or the access, or the TLS
    /// handshake failed: said first, with whoever refused quoted (runr-registry's reading).
    #[error("{diagnosis} (while {what})")]
    Refused {
        /// What we were doing.
        what: String,
        /// The refusal or the TLS failure.
        diagnosis: Box<runr_registry::Diagnosis>,
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
                    let op = RegistryOperation::Push;
                    let diagnosis = diagnose(&self.client, &self.target, &self.auth, op, &e).await;
                    return Err(match diagnosis {
                        Some(diagnosis) => PushError::Refused {
                            what: what.to_string(),
                            diagnosis: Box::new(diagnosis),
                        },
                        None => PushError::Registry {
                            host: self.target.registry().to_string(),
                            what: what.to_string(),
                            message: error_chain(&e),
                        },
                    });
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

type Item = Result<Bytes, OciDistributionError>;

fn stream_error(message: &str) -> OciDistributionError {
    OciDistributionError::GenericError(Some(message.to_string()))
}

/// `span` of `file`, [`BLOCK`] per item, hashed. The last block is checked before it is handed over:
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
    let reader = if check {
        SpanReader::hashing(file, span)
    } else {
        SpanReader::new(file, span)
    };
    futures_util::stream::unfold(Some(reader), move |state| {
        let digest = digest.clone();
        let what = what.clone();
        let mismatch = mismatch.clone();
        async move {
            // `None` once the last block (or an error) went out.
            let mut reader = state?;
            // Allocated here, on a runtime thread, like the memory hyper frees once it sent
            // the block: the blocking thread only reads into it.
            let mut buf =
                vec![0u8; usize::try_from(reader.remaining()).map_or(BLOCK, |r| r.min(BLOCK))];
            let read = tokio::task::spawn_blocking(move || {
                reader.fill(&mut buf)?;
                Ok::<_, std::io::Error>((buf, reader))
            })
            .await;
            match read {
                Ok(Ok((buf, reader))) => {
                    let last = reader.remaining() == 0;
                    let actual = if last { reader.digest() } else { None };
                    if let Some(actual) = actual.filter(|a| *a != digest) {
                        let message = format!(
                            "{what} {digest} in the file does not match its digest (its content hashes to {actual}): the file is damaged"
                        );
                        *mismatch.lock().expect("mismatch lock") = Some(message.clone());
                        return Some((Err(stream_error(&message)), None));
                    }
                    Some((Ok(Bytes::from(buf)), (!last).then_some(reader)))
                }
                Ok(Err(e)) => Some((Err(stream_error(&format!("reading {what}: {e}"))), None)),
                Err(e) => Some((Err(stream_error(&format!("reading {what}: {e}"))), None)),
            }
        }
    })
}
