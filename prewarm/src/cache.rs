//! The cache registry as prewarm talks to it: `GET /v2/`, manifests and blobs (whole or as a
//! one-byte Range probe), each answer classified so the caller can tell "restarting" from "not
//! there" from "slow down".
//!
//! The requests go through a plain reqwest client (`runr_registry::http`) because oci-client's
//! pull functions drop the response headers (no `Retry-After`) and offer no readiness probe;
//! oci-client still does the part that is protocol work, the token flow: it reads the
//! `WWW-Authenticate` challenge and fetches a pull token for each repository.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, RANGE};
use reqwest::{RequestBuilder, Response, StatusCode};
use runr_base::fmt::error_chain;
use runr_registry::failure::quote_answer;
use runr_registry::oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE,
};
use runr_registry::oci_client::secrets::RegistryAuth;
use runr_registry::oci_client::{self, Reference, RegistryOperation};
use runr_registry::{AuthFailure, RefusedBy, RegistryConfig, Timeouts, TlsFailure};

/// Time to establish a TCP (+TLS) connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for response headers. Long on purpose: Zot answers a manifest request only
/// once it has synced the whole image from upstream (minutes for a large one); the per-image
/// timeout bounds it anyway.
const HEADER_WAIT: Duration = Duration::from_secs(15 * 60);
/// Longest pause between two pieces of a body before the transfer counts as stalled.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// A readiness probe is a tiny request; a registry that does not answer it quickly is not ready.
const PING_TIMEOUT: Duration = Duration::from_secs(10);
/// The token flow (oci-client): `GET /v2/` and the token service, both small answers.
const TOKEN_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Manifests larger than this are refused (distribution's own limit is 4 MiB).
const MANIFEST_LIMIT: usize = 4 << 20;
/// Every manifest kind prewarm understands, for the `Accept` header.
const MANIFEST_TYPES: [&str; 4] = [
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
];

/// Why a request to the cache did not give what was asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// No connection could be made (refused, reset, DNS).
    #[error("{what}: cannot reach the registry: {cause}")]
    Connect {
        /// The request, e.g. `blob python@sha256:…`.
        what: String,
        /// The underlying error.
        cause: String,
    },
    /// The connection broke while the body was streaming.
    #[error("{what}: transfer broke after {bytes} bytes: {cause}")]
    Transfer {
        /// The request.
        what: String,
        /// Bytes received before it broke.
        bytes: u64,
        /// The underlying error.
        cause: String,
    },
    /// Nothing arrived for too long (headers or body).
    #[error("{what}: no data for {}s", .secs)]
    Stalled {
        /// The request.
        what: String,
        /// How long it waited.
        secs: u64,
    },
    /// The registry answered with an unexpected status.
    #[error("{what}: HTTP {status}{}", if .detail.is_empty() { String::new() } else { format!(": {}", .detail) })]
    Status {
        /// The request.
        what: String,
        /// The status code.
        status: u16,
        /// What `Retry-After` asked for.
        retry_after: Option<Duration>,
        /// The start of the error body, when there was one.
        detail: String,
    },
    /// The content did not hash to its digest.
    #[error("{what}: digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        /// The request.
        what: String,
        /// The digest asked for.
        expected: String,
        /// The digest of what arrived.
        actual: String,
    },
    /// The content was not as long as its descriptor says.
    #[error("{what}: size mismatch: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        /// The request.
        what: String,
        /// The size in the descriptor.
        expected: u64,
        /// Bytes that arrived (so far, when it was too long).
        actual: u64,
    },
    /// A manifest that cannot be used (unknown kind, bad JSON, no matching platform).
    #[error("{what}: {reason}")]
    BadManifest {
        /// The request.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The cache served the blob but did not hold it within the confirmation wait (its copy
    /// failed or is still running).
    #[error("{what}: not stored by the cache within {}s after it was served", .secs)]
    NotStored {
        /// The request.
        what: String,
        /// How long the confirmation waited.
        secs: u64,
    },
    /// The TLS handshake failed (unknown CA, wrong name, expired, not valid yet, not TLS at
    /// all): a configuration error, neither retried nor waited out.
    #[error("{0}")]
    Tls(TlsFailure),
    /// The token service refused the credentials, or the registry refused the request made
    /// with them (401/403): says so first, names the registry, quotes the refusal.
    #[error("{0}")]
    Auth(AuthFailure),
    /// The token flow failed otherwise (e.g. the token service's answer is not a token).
    #[error("the token flow for {repository} failed: {cause}")]
    Token {
        /// The repository the token was for.
        repository: String,
        /// Why.
        cause: String,
    },
}

impl FetchError {
    /// True when the failure looks like the registry went away (restart, rollout): connection
    /// problems and 502/503/504. Worth waiting for `GET /v2/` before trying again.
    pub fn registry_gone(&self) -> bool {
        match self {
            FetchError::Connect { .. } | FetchError::Transfer { .. } => true,
            FetchError::Stalled { .. } => true,
            FetchError::Status { status, .. } => matches!(status, 502..=504),
            _ => false,
        }
    }

    /// False for failures another attempt cannot cure: a manifest prewarm cannot use, a failed
    /// TLS handshake, a refused login, and 4xx answers other than 404 (a cache whose upstream is
    /// unreachable answers 404 for what it does not hold), 408 and 429.
    pub fn retryable(&self) -> bool {
        match self {
            FetchError::BadManifest { .. }
            | FetchError::Tls(_)
            | FetchError::Auth(_)
            | FetchError::Token { .. } => false,
            FetchError::Status { status, .. } => {
                !matches!(status, 400..=499) || matches!(status, 404 | 408 | 429)
            }
            _ => true,
        }
    }

    /// The wait the registry asked for (`Retry-After`), if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            FetchError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// How requests to one repository authenticate.
#[derive(Debug, Clone)]
enum Authorization {
    Anonymous,
    Basic,
    Bearer(String),
}

/// The answer to a blob HEAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// 200, with the `Content-Length` it announced.
    Present {
        /// The announced size, when there was one.
        size: Option<u64>,
    },
    /// 404.
    Absent,
    /// Another status (405 from a cache that does not take HEAD, a 5xx).
    Other(u16),
}

/// A manifest as the cache served it.
#[derive(Debug, Clone)]
pub struct RawManifest {
    /// The body, at most 4 MiB.
    pub body: Vec<u8>,
    /// `Content-Type`.
    pub media_type: Option<String>,
    /// `Docker-Content-Digest`, when sent.
    pub digest_header: Option<String>,
}

/// A client for one cache registry.
pub struct Cache {
    http: reqwest::Client,
    oci: oci_client::Client,
    base: String,
    host: String,
    auth: RegistryAuth,
    basic: Option<(String, String)>,
    tokens: Mutex<HashMap<String, Authorization>>,
}

impl Cache {
    /// A client for `host` (`host[:port]`) with the access settings in `access`.
    pub fn new(host: &str, access: &RegistryConfig) -> Result<Cache, runr_registry::ClientError> {
        let user_agent = concat!("runr-prewarm/", env!("CARGO_PKG_VERSION"));
        let http = runr_registry::http::build_http_client(access, CONNECT_TIMEOUT, user_agent)?;
        let oci = runr_registry::build_client(
            access,
            Timeouts {
                connect: CONNECT_TIMEOUT,
                read: TOKEN_READ_TIMEOUT,
            },
            user_agent,
        )?;
        Ok(Cache {
            http,
            oci,
            base: runr_registry::http::base_url(access, host),
            host: host.to_string(),
            auth: access.auth(),
            basic: access.credentials.clone(),
            tokens: Mutex::new(HashMap::new()),
        })
    }

    /// `GET /v2/`: the status, or the connection error. 200 and 401 mean the registry is up.
    pub async fn ping(&self) -> Result<u16, FetchError> {
        let what = "GET /v2/";
        let url = format!("{}/v2/", self.base);
        match tokio::time::timeout(PING_TIMEOUT, self.http.get(url).send()).await {
            Err(_) => Err(FetchError::Stalled {
                what: what.into(),
                secs: PING_TIMEOUT.as_secs(),
            }),
            Ok(Err(e)) => Err(self.connect_error(what, &e)),
            Ok(Ok(resp)) => Ok(resp.status().as_u16()),
        }
    }

    /// `GET /v2/<repository>/manifests/<reference>` accepting OCI and Docker manifests and
    /// indexes; the body is read whole (it is small and bounded).
    pub async fn manifest(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<RawManifest, FetchError> {
        let sep = if reference.contains(':') { '@' } else { ':' };
        let what = format!("manifest {repository}{sep}{reference}");
        let url = format!("{}/v2/{repository}/manifests/{reference}", self.base);
        let accept = MANIFEST_TYPES.join(", ");
        let mut resp = self
            .send(repository, &what, |http| {
                http.get(&url).header(ACCEPT, accept.as_str())
            })
            .await?;
        if resp.status() != StatusCode::OK {
            return Err(status_error(&what, resp).await);
        }
        let media_type = header(&resp, CONTENT_TYPE.as_str())
            .map(|t| t.split(';').next().unwrap_or("").trim().to_string());
        let digest_header = header(&resp, "docker-content-digest");
        let mut body = Vec::new();
        while let Some(chunk) = next_chunk(&mut resp, &what, body.len() as u64).await? {
            if body.len() + chunk.len() > MANIFEST_LIMIT {
                return Err(FetchError::BadManifest {
                    what,
                    reason: format!("larger than {MANIFEST_LIMIT} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(RawManifest {
            body,
            media_type,
            digest_header,
        })
    }

    /// `GET /v2/<repository>/blobs/<digest>`, with `Range: bytes=0-0` when `probe`. Returns the
    /// response once its status is 200 or 206; the caller reads (or drops) the body.
    pub async fn blob(
        &self,
        repository: &str,
        digest: &str,
        probe: bool,
    ) -> Result<Response, FetchError> {
        let what = blob_what(repository, digest);
        let url = format!("{}/v2/{repository}/blobs/{digest}", self.base);
        let resp = self
            .send(repository, &what, |http| {
                let req = http.get(&url);
                if probe {
                    req.header(RANGE, HeaderValue::from_static("bytes=0-0"))
                } else {
                    req
                }
            })
            .await?;
        match resp.status() {
            StatusCode::OK | StatusCode::PARTIAL_CONTENT => Ok(resp),
            _ => Err(status_error(&what, resp).await),
        }
    }

    /// `HEAD /v2/<repository>/blobs/<digest>`: what the cache says about the blob without
    /// sending it. Whether that reflects its store or its upstream is for the caller to learn.
    pub async fn head_blob(&self, repository: &str, digest: &str) -> Result<Head, FetchError> {
        let what = format!("HEAD {}", blob_what(repository, digest));
        let url = format!("{}/v2/{repository}/blobs/{digest}", self.base);
        let resp = self.send(repository, &what, |http| http.head(&url)).await?;
        Ok(match resp.status().as_u16() {
            200 => Head::Present {
                size: header(&resp, "content-length").and_then(|v| v.trim().parse().ok()),
            },
            404 => Head::Absent,
            status => Head::Other(status),
        })
    }

    /// Sends the request `build` makes, authenticated for `repository`; on a 401 it fetches a
    /// fresh token once (an expired token) and sends again.
    async fn send(
        &self,
        repository: &str,
        what: &str,
        build: impl Fn(&reqwest::Client) -> RequestBuilder,
    ) -> Result<Response, FetchError> {
        let mut refreshed = false;
        loop {
            let authz = self.authorization(repository, refreshed).await?;
            let req = match (&authz, &self.basic) {
                (Authorization::Bearer(token), _) => {
                    build(&self.http).header(AUTHORIZATION, format!("Bearer {token}"))
                }
                (Authorization::Basic, Some((user, pass))) => {
                    build(&self.http).basic_auth(user, Some(pass))
                }
                _ => build(&self.http),
            };
            let resp = match tokio::time::timeout(HEADER_WAIT, req.send()).await {
                Err(_) => {
                    return Err(FetchError::Stalled {
                        what: what.into(),
                        secs: HEADER_WAIT.as_secs(),
                    })
                }
                Ok(Err(e)) => return Err(self.connect_error(what, &e)),
                Ok(Ok(resp)) => resp,
            };
            let status = resp.status().as_u16();
            if status == 401 && !refreshed {
                refreshed = true;
                continue;
            }
            if matches!(status, 401 | 403) {
                let refused_by = match authz {
                    Authorization::Bearer(_) => RefusedBy::TokenScope { status },
                    _ => RefusedBy::Registry { status },
                };
                let answer = read_answer(resp).await;
                return Err(FetchError::Auth(AuthFailure::new(
                    &self.host, repository, &self.auth, refused_by, &answer,
                )));
            }
            return Ok(resp);
        }
    }

    /// The credentials for `repository`: a cached decision, or a new one from the token flow.
    async fn authorization(
        &self,
        repository: &str,
        refresh: bool,
    ) -> Result<Authorization, FetchError> {
        if !refresh {
            if let Some(a) = self.lock_tokens().get(repository) {
                return Ok(a.clone());
            }
        }
        let reference = Reference::with_tag(self.host.clone(), repository.to_string(), "x".into());
        let authz = match self
            .oci
            .auth(&reference, &self.auth, RegistryOperation::Pull)
            .await
        {
            Ok(Some(token)) => Authorization::Bearer(token),
            Ok(None) if self.basic.is_some() => Authorization::Basic,
            Ok(None) => Authorization::Anonymous,
            Err(oci_client::errors::OciDistributionError::RequestError(e)) => {
                return Err(self.connect_error(&format!("token for {repository}"), &e))
            }
            Err(oci_client::errors::OciDistributionError::AuthenticationFailure(body)) => {
                return Err(FetchError::Auth(AuthFailure::new(
                    &self.host,
                    repository,
                    &self.auth,
                    RefusedBy::TokenService,
                    body.as_bytes(),
                )))
            }
            Err(e) => {
                return Err(FetchError::Token {
                    repository: repository.into(),
                    cause: error_chain(&e),
                })
            }
        };
        self.lock_tokens()
            .insert(repository.to_string(), authz.clone());
        Ok(authz)
    }

    /// A request that got no answer: a TLS failure (configuration) or a connection problem
    /// (worth waiting for the registry to come back).
    fn connect_error(&self, what: &str, e: &reqwest::Error) -> FetchError {
        match TlsFailure::find(&self.host, e) {
            Some(tls) => FetchError::Tls(tls),
            None => FetchError::Connect {
                what: what.into(),
                cause: error_chain(e),
            },
        }
    }

    fn lock_tokens(&self) -> std::sync::MutexGuard<'_, HashMap<String, Authorization>> {
        // A panic while holding this lock cannot leave the map half-updated.
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The next piece of a body, waiting at most [`STALL_TIMEOUT`] for it; `Ok(None)` at the end.
/// `so_far` only goes into the error.
pub async fn next_chunk(
    resp: &mut Response,
    what: &str,
    so_far: u64,
) -> Result<Option<bytes::Bytes>, FetchError> {
    match tokio::time::timeout(STALL_TIMEOUT, resp.chunk()).await {
        Err(_) => Err(FetchError::Stalled {
            what: what.into(),
            secs: STALL_TIMEOUT.as_secs(),
        }),
        Ok(Err(e)) => Err(FetchError::Transfer {
            what: what.into(),
            bytes: so_far,
            cause: error_chain(&e),
        }),
        Ok(Ok(chunk)) => Ok(chunk),
    }
}

/// `blob <repository>@<digest>`, the name of a blob request in errors and logs.
pub fn blob_what(repository: &str, digest: &str) -> String {
    format!("blob {repository}@{digest}")
}

/// Turns a non-success answer into an error carrying its status, `Retry-After` and the start of
/// its body (registries explain 4xx answers in a JSON envelope).
async fn status_error(what: &str, resp: Response) -> FetchError {
    let status = resp.status().as_u16();
    let retry_after = runr_registry::http::retry_after(resp.headers(), SystemTime::now());
    FetchError::Status {
        what: what.into(),
        status,
        retry_after,
        detail: quote_answer(&read_answer(resp).await),
    }
}

/// The start of an error answer's body, for quoting: a proxy's error page can be large and is
/// only there to be recognised, and a slow one is not waited for long.
async fn read_answer(mut resp: Response) -> Vec<u8> {
    let limit = runr_registry::failure::ANSWER_QUOTE_LIMIT;
    let mut body = Vec::new();
    while body.len() < limit {
        match tokio::time::timeout(Duration::from_secs(5), resp.chunk()).await {
            Ok(Ok(Some(chunk))) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(limit);
    body
}

fn header(resp: &Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> FetchError {
        FetchError::Status {
            what: "x".into(),
            status: code,
            retry_after: None,
            detail: String::new(),
        }
    }

    #[test]
    fn classification() {
        for code in [404, 408, 429, 500, 502, 503, 504] {
            assert!(status(code).retryable(), "{code}");
        }
        for code in [400, 401, 403, 405] {
            assert!(!status(code).retryable(), "{code}");
        }
        for code in [502, 503, 504] {
            assert!(status(code).registry_gone(), "{code}");
        }
        for code in [404, 429, 500] {
            assert!(!status(code).registry_gone(), "{code}");
        }
        let connect = FetchError::Connect {
            what: "x".into(),
            cause: "refused".into(),
        };
        assert!(connect.registry_gone() && connect.retryable());
        let bad = FetchError::BadManifest {
            what: "x".into(),
            reason: "y".into(),
        };
        assert!(!bad.retryable());
        let refused = FetchError::Auth(AuthFailure::new(
            "r:5000",
            "a",
            &RegistryAuth::Anonymous,
            RefusedBy::TokenService,
            b"{}\n",
        ));
        assert!(!refused.retryable() && !refused.registry_gone());
        assert!(refused
            .to_string()
            .starts_with("authentication failed at the registry r:5000"));
        let tls = FetchError::Tls(TlsFailure {
            registry: "r:5000".into(),
            problem: runr_registry::TlsProblem::UnknownIssuer,
            detail: "invalid peer certificate: UnknownIssuer".into(),
        });
        assert!(!tls.retryable() && !tls.registry_gone(), "{tls}");
    }

    #[test]
    fn status_error_text() {
        let e = FetchError::Status {
            what: "manifest a:b".into(),
            status: 404,
            retry_after: None,
            detail: "{\"errors\":[]}".into(),
        };
        assert_eq!(e.to_string(), "manifest a:b: HTTP 404: {\"errors\":[]}");
        assert_eq!(status(503).to_string(), "x: HTTP 503");
    }
}
