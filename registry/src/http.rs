//! A plain [`reqwest::Client`] for the registry requests whose status and headers the caller must
//! see: oci-client folds every answer into its error enum and drops the headers, so it cannot
//! tell "restarting" (connection refused, 502/503/504) from "not there" (404), cannot honour
//! `Retry-After`, and does not let a `GET /v2/` readiness probe see its status.
//!
//! The client trusts the same roots as [`crate::build_client`] (built-in Mozilla roots plus
//! `RUNR_REGISTRY_CA_FILE`) and has a connect timeout only: how long to wait for headers and how
//! long a body may stall are the caller's decisions, since a pull-through cache may sync a whole
//! image before it answers.

use std::time::{Duration, SystemTime};

use crate::client::{install_crypto_provider, ClientError};
use crate::config::RegistryConfig;

/// Builds an HTTP/1.1 client for `cfg` with `connect` as its only timeout. `user_agent` names the
/// binary in the registry's logs.
pub fn build_http_client(
    cfg: &RegistryConfig,
    connect: Duration,
    user_agent: &'static str,
) -> Result<reqwest::Client, ClientError> {
    install_crypto_provider();
    let mut roots = Vec::with_capacity(webpki_root_certs::TLS_SERVER_ROOT_CERTS.len() + 1);
    for der in webpki_root_certs::TLS_SERVER_ROOT_CERTS {
        roots.push(
            reqwest::Certificate::from_der(der.as_ref())
                .map_err(|e| ClientError::Build(e.to_string()))?,
        );
    }
    if let Some(path) = &cfg.ca_file {
        let pem = std::fs::read(path).map_err(|source| ClientError::ReadCaFile {
            path: path.display().to_string(),
            source,
        })?;
        let extra = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| ClientError::Build(format!("{}: {e}", path.display())))?;
        // A file without a single certificate is a mistake, not "no extra roots".
        if extra.is_empty() {
            return Err(ClientError::Build(format!(
                "{}: no PEM certificate in it",
                path.display()
            )));
        }
        roots.extend(extra);
    }
    reqwest::Client::builder()
        .tls_certs_only(roots)
        .connect_timeout(connect)
        .user_agent(user_agent)
        // A cluster-internal registry is reached directly; no proxy variables are consulted.
        .no_proxy()
        .build()
        .map_err(|e| ClientError::Build(e.to_string()))
}

/// `http://host` or `https://host` for a registry `host[:port]`.
pub fn base_url(cfg: &RegistryConfig, host: &str) -> String {
    let scheme = if cfg.plain_http { "http" } else { "https" };
    format!("{scheme}://{host}")
}

/// The wait a `Retry-After` header asks for (delta-seconds or HTTP-date), measured from `now`.
/// A date in the past means "now" (zero); an unreadable header means no advice (`None`).
pub fn retry_after(headers: &reqwest::header::HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(
            retry_after(&headers("120"), now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            retry_after(&headers("Sun, 06 Nov 1994 08:50:07 GMT"), now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after(&headers("Sun, 06 Nov 1994 08:00:00 GMT"), now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(&headers("soon"), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let file = std::env::temp_dir().join(format!("runr-no-cert-{}.pem", std::process::id()));
        std::fs::write(&file, "not a certificate\n").unwrap();
        let cfg = RegistryConfig {
            ca_file: Some(file.clone()),
            ..RegistryConfig::default()
        };
        let err = build_http_client(&cfg, Duration::from_secs(1), "runr-test").unwrap_err();
        std::fs::remove_file(&file).unwrap();
        assert!(err.to_string().contains("no PEM certificate"), "{err}");
    }

    #[test]
    fn builds_with_and_without_tls() {
        for plain_http in [false, true] {
            let cfg = RegistryConfig {
                plain_http,
                ..RegistryConfig::default()
            };
            build_http_client(&cfg, Duration::from_secs(1), "runr-test").expect("client");
            assert!(base_url(&cfg, "r:5000").ends_with("://r:5000"));
        }
    }
}
