//! OCI registry access shared by `runr-image-upload` and `runr-prewarm` (and nothing else: the
//! wrapper is copied into every pod and must stay small).
//!
//! - [`config`]: the registry variables both binaries read (`RUNR_REGISTRY_*`), through
//!   `runr_base::env` like every other variable, and their rows of the `help` table;
//! - [`client`]: an [`oci_client::Client`] built for a scratch image (built-in roots, ring);
//! - [`reference`](mod@reference): image references (prewarm's images, the receiver's push target and upload
//!   name, names inside archives) on top of `oci_spec`'s reference grammar;
//! - [`digest`]: `sha256:<hex>` digests: the one check, parsing a typed one, computing one;
//! - [`retry`]: which failures are worth another attempt and how long to wait before it;
//! - [`failure`]: what a failure means to the operator: an authentication/authorization refusal
//!   (naming the registry, quoting the answer) or a TLS configuration problem;
//! - [`token`]: the token flow done once with every status seen, for a grant shared by many
//!   requests (a refusal is told from an outage);
//! - [`http`]: a plain reqwest client with the same roots, for requests whose status and headers
//!   the caller must see (readiness probes, `Retry-After`, Range probes);
//! - [`roots`]: a system CA store for scratch images, which oci-client needs to build a client;

#![forbid(unsafe_code)]

pub mod client;
pub mod config;
pub mod digest;
pub mod failure;
pub mod http;
pub mod reference;
pub mod retry;
pub mod roots;
pub mod token;

pub use client::{build_client, client_config, client_from, ClientError, Timeouts};
pub use config::RegistryConfig;
pub use digest::{is_sha256, sha256_digest, Sha256Hasher};
pub use failure::{diagnose, AuthFailure, Diagnosis, RefusedBy, TlsFailure, TlsProblem};
pub use reference::ImageRef;
pub use retry::{is_transient, Backoff};
pub use roots::ensure_system_roots;
pub use token::{exchange, Grant, TokenError};

/// Re-exported so that users name the same version of the client crate.
pub use oci_client;
/// Re-exported: the client [`http::build_http_client`] builds and [`token::exchange`] takes.
pub use reqwest;
