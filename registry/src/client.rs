//! An [`oci_client::Client`] that works in a FROM scratch image.
//!
//! Scratch has no CA store and no `/etc/ssl`: the Mozilla roots are compiled in
//! (`webpki-root-certs`) and passed as the only roots, which also keeps reqwest from reaching for
//! the platform verifier. TLS uses rustls on ring, which builds for musl without cmake.

use std::sync::Once;
use std::time::Duration;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::Client;

use crate::config::RegistryConfig;

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The CA file named by `RUNR_REGISTRY_CA_FILE` could not be read.
    #[error("failed to read CA file {path}")]
    ReadCaFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP client refused the configuration (e.g. a malformed certificate).
    #[error("failed to build the registry client: {0}")]
    Build(String),
}

/// Network timeouts. There is deliberately no total timeout per request: a pull-through cache may
/// sync a whole image before it sends headers, and a large blob may stream for minutes.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Time to establish a TCP (+TLS) connection.
    pub connect: Duration,
    /// Longest pause between two reads (headers included) before the request fails.
    pub read: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            read: Duration::from_secs(120),
        }
    }
}

/// Builds a client for `cfg`. `user_agent` names the binary in the registry's logs.
pub fn build_client(
    cfg: &RegistryConfig,
    timeouts: Timeouts,
    user_agent: &'static str,
) -> Result<Client, ClientError> {
    client_from(client_config(cfg, timeouts, user_agent)?)
}

/// The configuration [`build_client`] uses, for callers that change a knob of it (e.g.
/// `use_monolithic_push`) before building with [`client_from`].
pub fn client_config(
    cfg: &RegistryConfig,
    timeouts: Timeouts,
    user_agent: &'static str,
) -> Result<ClientConfig, ClientError> {
    let mut roots: Vec<Certificate> = webpki_root_certs::TLS_SERVER_ROOT_CERTS
        .iter()
        .map(|der| Certificate {
            encoding: CertificateEncoding::Der,
            data: der.as_ref().to_vec(),
        })
        .collect();
    if let Some(path) = &cfg.ca_file {
        let data = std::fs::read(path).map_err(|source| ClientError::ReadCaFile {
            path: path.display().to_string(),
            source,
        })?;
        roots.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data,
        });
    }
    Ok(ClientConfig {
        protocol: if cfg.plain_http {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        },
        tls_certs_only: roots,
        connect_timeout: Some(timeouts.connect),
        read_timeout: Some(timeouts.read),
        user_agent,
        // Blobs of an image go one after another per client call; callers run several calls at
        // once where they want parallelism.
        max_concurrent_upload: 4,
        max_concurrent_download: 4,
        ..ClientConfig::default()
    })
}

/// Builds a client from a configuration made by [`client_config`].
pub fn client_from(config: ClientConfig) -> Result<Client, ClientError> {
    install_crypto_provider();
    Client::try_from(config).map_err(|e| ClientError::Build(e.to_string()))
}

/// rustls needs one process-wide crypto provider; several features in the tree could each pick
/// one, so install ring explicitly (a second install is a harmless no-op).
pub(crate) fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_for_https_and_plain_http() {
        for plain_http in [false, true] {
            let cfg = RegistryConfig {
                plain_http,
                ..RegistryConfig::default()
            };
            build_client(&cfg, Timeouts::default(), "runr-test").expect("client");
        }
    }

    #[test]
    fn unreadable_ca_file_is_named() {
        let cfg = RegistryConfig {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..RegistryConfig::default()
        };
        let Err(err) = build_client(&cfg, Timeouts::default(), "runr-test") else {
            panic!("a missing CA file must fail");
        };
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }
}
