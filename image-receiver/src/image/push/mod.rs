//! Blobs, then manifests, into the registry through oci-client, with retries of transient
//! failures.
//!
//! - One grant per push: before its first request the push runs the token flow once for
//!   `pull,push` on the target repository (runr-registry's [`exchange`], which sees the token
//!   service's status), and every request of the push, blob pushes in parallel included, uses
//!   that token from the cache both clients share. A refusal of the token service ends the push
//!   with one request to it; an outage (connection refused, 5xx) is retried like any transient
//!   failure. The first refusal by the registry itself (a token without the scope) is diagnosed
//!   once, and requests refused at the same time report that same refusal. A push that
//!   outlives its token (a layer following a slow upload) renews it before it expires.
//! - A blob the registry has (HEAD) is not sent again.
//! - Blobs stream from their offsets in the archive in one monolithic `PUT` each (a second
//!   oci-client with `use_monolithic_push`: the chunked mode PATCHes 4 MiB at a time, a size
//!   oci-client fixes, and the distribution registry pays per PATCH — ~2.5× slower on 1 GiB).
//!   Never whole in memory: 256 KiB reads feed the request body. The stream hashes what it sends
//!   and fails before the upload is committed when the bytes do not match the digest, so a
//!   damaged file is reported in its own terms and nothing wrong lands in the registry.
//! - Uncompressed classic layers are gzip'ed first (see `compress`), then pushed like any blob;
//!   from a compressed archive, gzip'ed as they stream into the request body, under the digest
//!   the index pass worked out ([`Pusher::push_gzipping`]).
//! - A classic layer still arriving ([`chunked`]) goes in a chunked upload whose one `PATCH`
//!   follows the upload, as it is or gzip'ed, committed under the digest worked out on the way.
//! - Transient failures (connection, 5xx, 429) are retried [`RETRIES`] times with backoff; then
//!   the registry's own message is reported. A blob whose upload failed starts again from its
//!   first byte in a new upload session; the other blobs go on meanwhile.
//! - What is pushed is counted in the [`Progress`] the status shows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use runr_base::fmt::error_chain;
use runr_registry::failure::refusal_status;
use runr_registry::oci_client::errors::OciDistributionError;
use runr_registry::oci_client::secrets::RegistryAuth;
use runr_registry::oci_client::token_cache::{RegistryToken, RegistryTokenType};
use runr_registry::oci_client::{Client, Reference, RegistryOperation};
use runr_registry::{
    build_client, client_config, client_from, diagnose, exchange, is_transient, Backoff, Diagnosis,
    Grant, RegistryConfig, Timeouts, TokenError,
};

use crate::image::compress;
use crate::image::formats::{media, RawManifest};
use crate::image::span::{Source, Span, SpanReader};
use crate::prefix::Prefix;
use crate::progress::Progress;

mod chunked;
mod pieces;
mod teed;

use pieces::Pieces;
pub use teed::{Fed, Feed};

/// Attempts after the first for a transient failure.
pub const RETRIES: u32 = 3;
/// Bytes read (and sent) per step. One request body per blob (monolithic PUT): the size only
/// sets how much memory each blob in flight holds (a block being read or made, and what hyper
/// has not written to the socket yet: it asks for more while it holds less than its buffer's
/// ~400 KiB, so a bigger block only waits in memory).
const BLOCK: usize = 256 << 10;
/// Longest wait for each of the two requests of the token flow (their answers are small).
const TOKEN_TIMEOUT: Duration = Duration::from_secs(30);
/// Seen in the registry's logs.
const USER_AGENT: &str = concat!("runr-image-upload/", env!("CARGO_PKG_VERSION"));

/// A push that failed; the message is for the user.
#[derive(Debug, Clone, thiserror::Error)]
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
        diagnosis: Box<Diagnosis>,
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
    /// Same registry and credentials, pushing blobs in one PUT each; shares `client`'s token
    /// cache.
    blobs: Client,
    auth: RegistryAuth,
    registry: RegistryConfig,
    /// The token flow's client (it sees statuses oci-client hides).
    http: runr_registry::reqwest::Client,
    target: Reference,
    backoff: Backoff,
    /// The push's one grant: the first request runs the token flow, the others wait for it and
    /// share its outcome (a refusal included).
    access: tokio::sync::OnceCell<Result<(), PushError>>,
    /// The grant now, renewed before its token expires (see [`Pusher::authorize`]).
    held: tokio::sync::Mutex<Option<Held>>,
    /// The first refusal the registry answered (diagnosed once): requests refused at the same
    /// time report it without asking the token service again.
    refused: tokio::sync::Mutex<Option<PushError>>,
    progress: Arc<Progress>,
}

/// The grant a push holds and when to ask for a new one.
struct Held {
    grant: Grant,
    /// For a Bearer token, three quarters into its life: early enough that a request started
    /// then still carries a live token, whatever the clocks of the token service and the
    /// registry say.
    renew_at: Option<tokio::time::Instant>,
    /// The renewal failed for good: every request after it fails so too.
    failed: Option<PushError>,
}

impl Held {
    fn new(grant: Grant) -> Held {
        let renew_at = match &grant {
            Grant::Bearer { expires_in, .. } => {
                Some(tokio::time::Instant::now() + expires_in.mul_f64(0.75))
            }
            Grant::Basic | Grant::Anonymous => None,
        };
        Held {
            grant,
            renew_at,
            failed: None,
        }
    }
}

/// How one attempt of a request failed: the registry's (or the connection's) error, retried
/// when transient, or a failure no retry cures (a refused renewal of the grant, the file's own
/// bytes).
enum Attempt {
    Registry(OciDistributionError),
    Final(PushError),
}

impl From<OciDistributionError> for Attempt {
    fn from(e: OciDistributionError) -> Attempt {
        Attempt::Registry(e)
    }
}

impl Pusher {
    /// A pusher for `target` (`host[:port]/path/repo:tag`) counting into `progress`.
    pub async fn new(
        target: &str,
        registry: &RegistryConfig,
        backoff: Backoff,
        progress: Arc<Progress>,
    ) -> Result<Pusher, PushError> {
        let target: Reference = target
            .parse()
            .map_err(|_| PushError::Target(target.to_string()))?;
        let client = build_client(registry, Timeouts::default(), USER_AGENT)
            .map_err(|e| PushError::Client(e.to_string()))?;
        let mut blobs = monolithic_client(registry)?;
        // One cache: the grant stored once serves both clients.
        blobs.tokens = client.tokens.clone();
        let http = runr_registry::http::build_http_client(
            registry,
            Timeouts::default().connect,
            USER_AGENT,
        )
        .map_err(|e| PushError::Client(e.to_string()))?;
        let auth = registry.auth();
        for c in [&client, &blobs] {
            c.store_auth_if_needed(target.resolve_registry(), &auth)
                .await;
        }
        Ok(Pusher {
            client,
            blobs,
            auth,
            registry: registry.clone(),
            http,
            target,
            backoff,
            access: tokio::sync::OnceCell::new(),
            held: tokio::sync::Mutex::new(None),
            refused: tokio::sync::Mutex::new(None),
            progress,
        })
    }

    /// Where the push counts what it sent.
    pub fn progress(&self) -> &Progress {
        &self.progress
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

    /// The grant of this push, got once (see [`Pusher::access`]) and renewed when its token
    /// is about to expire; `what` is what the request was about to do, named in a refusal.
    async fn authorize(&self, what: &str) -> Result<(), PushError> {
        self.access.get_or_init(|| self.grant(what)).await.clone()?;
        self.renew_if_due(what).await
    }

    /// The token flow for `pull,push` on the target repository (outages retried like any
    /// transient failure), its grant installed.
    async fn grant(&self, what: &str) -> Result<(), PushError> {
        let grant = self.exchange(what).await?;
        tracing::debug!(?grant, "registry access granted");
        self.install(grant).await;
        Ok(())
    }

    /// A push that outlives its token (a layer streamed while a slow upload arrives) asks for
    /// a new one before the old one expires: a token is checked when a request starts, so
    /// each request must start with a live one. One renewal at a time (the others wait for
    /// it), and a renewal that failed is the answer of every request after it.
    async fn renew_if_due(&self, what: &str) -> Result<(), PushError> {
        let mut held = self.held.lock().await;
        let Some(h) = held.as_mut() else {
            return Ok(());
        };
        if let Some(failed) = &h.failed {
            return Err(failed.clone());
        }
        let now = tokio::time::Instant::now();
        if h.renew_at.is_none_or(|at| now < at) {
            return Ok(());
        }
        match self.exchange(what).await {
            Ok(grant) => {
                tracing::info!(?grant, "registry token renewed");
                self.cache(&grant).await;
                *h = Held::new(grant);
                Ok(())
            }
            Err(e) => {
                h.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Runs the token flow, retrying outages; a refusal or a TLS failure is final.
    async fn exchange(&self, what: &str) -> Result<Grant, PushError> {
        let host = self.target.resolve_registry();
        let mut attempt = 0;
        loop {
            let got = exchange(
                &self.http,
                &self.registry,
                host,
                self.target.repository(),
                "pull,push",
                TOKEN_TIMEOUT,
            )
            .await;
            match got {
                Ok(grant) => return Ok(grant),
                Err(e) if e.is_transient() && attempt < RETRIES => {
                    let delay = self.backoff.delay(attempt);
                    tracing::warn!(what, attempt, error = %e, ?delay, "token flow failed, retrying");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(e) => {
                    let what = what.to_string();
                    return Err(match e {
                        TokenError::Refused(a) => PushError::Refused {
                            what,
                            diagnosis: Box::new(Diagnosis::Auth(a)),
                        },
                        TokenError::Tls(t) => PushError::Refused {
                            what,
                            diagnosis: Box::new(Diagnosis::Tls(t)),
                        },
                        e => PushError::Registry {
                            host: host.to_string(),
                            what,
                            message: e.to_string(),
                        },
                    });
                }
            }
        }
    }

    /// Makes `grant` the push's: held for the chunked uploads' requests, and in the clients'
    /// token cache.
    async fn install(&self, grant: Grant) {
        self.cache(&grant).await;
        *self.held.lock().await = Some(Held::new(grant));
    }

    /// Puts `grant` into the clients' token cache for both operations (a `pull,push` token
    /// serves the HEADs and the read-back too).
    async fn cache(&self, grant: &Grant) {
        let token = match grant {
            Grant::Bearer { token, .. } => Some(RegistryTokenType::Bearer(RegistryToken::Token {
                token: token.clone(),
            })),
            Grant::Basic => match &self.auth {
                RegistryAuth::Basic(user, password) => {
                    Some(RegistryTokenType::Basic(user.clone(), password.clone()))
                }
                _ => None,
            },
            // Nothing to store: oci-client asks `GET /v2/` before each request, as it always did.
            Grant::Anonymous => None,
        };
        if let Some(token) = token {
            for op in [RegistryOperation::Push, RegistryOperation::Pull] {
                self.client
                    .tokens
                    .insert(&self.target, op, token.clone())
                    .await;
            }
        }
    }

    /// `req` with the push's credentials: its Bearer token, or the Basic credentials the
    /// registry asked for. Only for requests to the registry itself (a `Location` may name
    /// another host, which gets nothing, as oci-client does).
    async fn authorized(
        &self,
        url: &str,
        req: runr_registry::reqwest::RequestBuilder,
    ) -> runr_registry::reqwest::RequestBuilder {
        let own = format!(
            "{}/",
            runr_registry::http::base_url(&self.registry, self.target.resolve_registry())
        );
        if !url.starts_with(&own) {
            return req;
        }
        match self.held.lock().await.as_ref().map(|h| &h.grant) {
            Some(Grant::Bearer { token, .. }) => req.bearer_auth(token),
            Some(Grant::Basic) => match &self.auth {
                RegistryAuth::Basic(user, password) => req.basic_auth(user, Some(password)),
                _ => req,
            },
            Some(Grant::Anonymous) | None => req,
        }
    }

    /// Runs `op` until it succeeds, fails for good, or failed transiently [`RETRIES`] + 1 times.
    async fn retry<T, E, F, Fut>(&self, what: &str, mut op: F) -> Result<T, PushError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
        E: Into<Attempt>,
    {
        let mut attempt = 0;
        loop {
            self.authorize(what).await?;
            match op().await.map_err(Into::into) {
                Ok(v) => return Ok(v),
                Err(Attempt::Final(e)) => return Err(e),
                Err(Attempt::Registry(e)) if is_transient(&e) && attempt < RETRIES => {
                    let delay = self.backoff.delay(attempt);
                    tracing::warn!(what, attempt, error = %error_chain(&e), ?delay, "registry request failed, retrying");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(Attempt::Registry(e)) => return Err(self.failure(what, &e).await),
            }
        }
    }

    /// What a final failure of a request means; a refusal is diagnosed once per push.
    async fn failure(&self, what: &str, e: &OciDistributionError) -> PushError {
        // Held while diagnosing: requests refused at the same time wait for the one diagnosis
        // (a token request) instead of each making their own.
        let mut refused = match refusal_status(e) {
            Some(_) => Some(self.refused.lock().await),
            None => None,
        };
        if let Some(first) = refused.as_ref().and_then(|r| (**r).as_ref()) {
            return first.clone();
        }
        let op = RegistryOperation::Push;
        let failure = match diagnose(&self.client, &self.target, &self.auth, op, e).await {
            Some(diagnosis) => PushError::Refused {
                what: what.to_string(),
                diagnosis: Box::new(diagnosis),
            },
            None => PushError::Registry {
                host: self.target.registry().to_string(),
                what: what.to_string(),
                message: error_chain(e),
            },
        };
        if let Some(first) = refused.as_mut() {
            **first = Some(failure.clone());
        }
        failure
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
        file: &Source,
        span: Span,
        digest: &str,
        what: &str,
    ) -> Result<bool, PushError> {
        self.push_stream(file, span, digest, what, true, None).await
    }

    /// [`Pusher::push_span`] for a blob that is still arriving: each block is sent once the
    /// upload's contiguous prefix (of `follow`'s generation) holds it. A wait that ends (the
    /// upload reopened, or `complete` began before the bytes came) fails this push.
    pub async fn push_following(
        &self,
        file: &Source,
        span: Span,
        digest: &str,
        what: &str,
        follow: Follow,
    ) -> Result<bool, PushError> {
        self.push_stream(file, span, digest, what, true, Some(follow))
            .await
    }

    /// [`Pusher::push_span`] for a file this process wrote and hashed itself (a compressed
    /// layer): no second hash on the way out.
    pub async fn push_own_file(
        &self,
        file: &Source,
        span: Span,
        digest: &str,
        what: &str,
    ) -> Result<bool, PushError> {
        self.push_stream(file, span, digest, what, false, None)
            .await
    }

    /// Whether the registry has blob `digest` already (a `HEAD`): then its `size` bytes count as
    /// pushed, and the caller skips it.
    async fn already_there(&self, digest: &str, size: u64, what: &str) -> Result<bool, PushError> {
        if !self.blob_exists(digest).await? {
            return Ok(false);
        }
        tracing::info!(what, digest, "blob already in the registry");
        self.progress.sent(size);
        self.progress.blob_done();
        Ok(true)
    }

    /// The end of a push whose attempts count their bytes in `attempt`: the blob is done, or
    /// the last attempt's bytes are taken back from the progress.
    fn settle(
        &self,
        result: Result<(), PushError>,
        attempt: &AtomicU64,
    ) -> Result<bool, PushError> {
        match result {
            Ok(()) => {
                self.progress.blob_done();
                Ok(true)
            }
            Err(e) => {
                self.progress.unsent(attempt.swap(0, Ordering::SeqCst));
                Err(e)
            }
        }
    }

    async fn push_stream(
        &self,
        file: &Source,
        span: Span,
        digest: &str,
        what: &str,
        check: bool,
        follow: Option<Follow>,
    ) -> Result<bool, PushError> {
        if self.already_there(digest, span.len, what).await? {
            return Ok(false);
        }
        tracing::info!(what, digest, size = span.len, "pushing blob");
        let mismatch = Arc::new(Mutex::new(None));
        let label = format!("pushing {what} {digest}");
        let (result, attempt) = self
            .push_attempts(&label, digest, span.len, |sent| {
                let reading = Reading {
                    check,
                    follow: follow.clone(),
                };
                let (digest, what) = (digest.to_string(), what.to_string());
                span_stream(
                    file.clone(),
                    span,
                    digest,
                    what,
                    mismatch.clone(),
                    reading,
                    sent,
                )
            })
            .await;
        if let Some(message) = mismatch.lock().expect("mismatch lock").take() {
            return Err(PushError::Content(message));
        }
        self.settle(result, &attempt)
    }

    /// Pushes blob `digest` of `size` bytes with the retry policy, each attempt's body made by
    /// `body` from what it counts as sent. A retry starts again from the blob's first byte, so
    /// what the failed attempt counted is taken back first; the last attempt's count comes
    /// back with the result, for [`Self::settle`].
    async fn push_attempts<S>(
        &self,
        label: &str,
        digest: &str,
        size: u64,
        body: impl Fn(Sent) -> S,
    ) -> (Result<(), PushError>, Arc<AtomicU64>)
    where
        S: Stream<Item = Item> + Send + 'static,
    {
        let attempt = Arc::new(AtomicU64::new(0));
        let result = self
            .retry(label, || {
                self.progress.unsent(attempt.swap(0, Ordering::SeqCst));
                let stream = body(Sent {
                    progress: self.progress.clone(),
                    attempt: attempt.clone(),
                });
                self.blobs
                    .push_blob_stream(&self.target, stream, digest, Some(size))
            })
            .await;
        (result.map(drop), attempt)
    }

    /// Pushes the uncompressed layer at `span` of `file` gzip'ed on the way, as blob `digest`
    /// of `size` bytes (what [`compress::gzip_blocks`] makes of it, worked out before), unless
    /// the registry has it. A retry gzip's it again from its first byte; the registry checks
    /// the digest at the commit.
    pub async fn push_gzipping(
        &self,
        file: &Source,
        span: Span,
        digest: &str,
        size: u64,
        what: &str,
    ) -> Result<bool, PushError> {
        if self.already_there(digest, size, what).await? {
            return Ok(false);
        }
        tracing::info!(what, digest, size, "pushing layer, gzip'ed as it streams");
        let label = format!("pushing layer {what} {digest}");
        let (result, attempt) = self
            .push_attempts(&label, digest, size, |sent| {
                gzip_stream(file.clone(), span, what.to_string(), sent)
            })
            .await;
        self.settle(result, &attempt)
    }

    /// Pushes a small blob held in memory (a config written here).
    pub async fn push_bytes(&self, data: Bytes, digest: &str, what: &str) -> Result<(), PushError> {
        let len = data.len() as u64;
        if !self.blob_exists(digest).await? {
            self.retry(&format!("pushing {what} {digest}"), || {
                self.blobs.push_blob(&self.target, data.clone(), digest)
            })
            .await?;
        }
        self.progress.sent(len);
        self.progress.blob_done();
        Ok(())
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

/// The upload's prefix and the generation a streamed blob belongs to.
pub type Follow = (Arc<Prefix>, u64);

/// Counts the bytes a blob's stream hands to the request body: into the push's progress and
/// into the current attempt's tally.
#[derive(Clone)]
struct Sent {
    progress: Arc<Progress>,
    attempt: Arc<AtomicU64>,
}

impl Sent {
    fn add(&self, n: u64) {
        self.attempt.fetch_add(n, Ordering::SeqCst);
        self.progress.sent(n);
    }
}

/// How a blob's stream reads the file.
struct Reading {
    /// Hash what is read and refuse a mismatch with the digest.
    check: bool,
    /// Wait for each block to be in the upload's prefix (a blob still arriving).
    follow: Option<Follow>,
}

fn stream_error(message: &str) -> OciDistributionError {
    OciDistributionError::GenericError(Some(message.to_string()))
}

/// `span` of `file`, [`BLOCK`] per item, hashed. The last block is checked before it is handed over:
/// on a mismatch with `digest` an error item takes its place (and is recorded in `mismatch`), so
/// the request body ends short and the registry never commits the upload.
fn span_stream(
    file: Source,
    span: Span,
    digest: String,
    what: String,
    mismatch: Arc<Mutex<Option<String>>>,
    Reading { check, follow }: Reading,
    sent: Sent,
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
        let sent = sent.clone();
        let follow = follow.clone();
        async move {
            // `None` once the last block (or an error) went out.
            let mut reader = state?;
            // Allocated here, on a runtime thread, like the memory hyper frees once it sent
            // the block: the blocking thread only reads into it.
            let mut buf =
                vec![0u8; usize::try_from(reader.remaining()).map_or(BLOCK, |r| r.min(BLOCK))];
            let read = tokio::task::spawn_blocking(move || {
                if let Some((prefix, generation)) = follow {
                    let need = reader.position() + buf.len() as u64;
                    prefix
                        .wait(generation, need)
                        .map_err(std::io::Error::other)?;
                }
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
                    sent.add(buf.len() as u64);
                    Some((Ok(Bytes::from(buf)), (!last).then_some(reader)))
                }
                Ok(Err(e)) => Some((Err(stream_error(&format!("reading {what}: {e}"))), None)),
                Err(e) => Some((Err(stream_error(&format!("reading {what}: {e}"))), None)),
            }
        }
    })
}

/// The gzip members of `span` of `file` as they are made on a blocking thread, in the body's
/// two buffers ([`Pieces`]): the request body of [`Pusher::push_gzipping`]. A failure to read
/// ends the stream with an error item, so the registry never commits the upload.
fn gzip_stream(
    file: Source,
    span: Span,
    what: String,
    sent: Sent,
) -> impl Stream<Item = Item> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, String>>(1);
    tokio::task::spawn_blocking(move || {
        let reader = SpanReader::new(file, span);
        let mut pieces = Pieces::new();
        let mut send = |piece: Bytes| tx.blocking_send(Ok(piece)).is_ok();
        let ended = || compress::LayerError::Io {
            what: "sending".into(),
            name: what.clone(),
            source: std::io::Error::other("the request ended"),
        };
        let made = compress::gzip_blocks(reader, span.len, &what, |member| {
            match pieces.write(member, &mut send) {
                true => Ok(()),
                false => Err(ended()),
            }
        })
        .and_then(|_| match pieces.flush(&mut send) {
            true => Ok(()),
            false => Err(ended()),
        });
        if let Err(e) = made {
            let _ = tx.blocking_send(Err(e.to_string()));
        }
    });
    pieces::body(rx, sent)
}
