//! TLS set-up for `rediss://`: the crypto provider, and the roots redis-rs trusts (the
//! compiled-in ones, as PEM: a FROM scratch image has no CA store).

/// Every built-in root as one PEM bundle (the workspace's one builder, in runr-base).
pub(crate) use runr_base::roots::pem_bundle;

/// rustls needs one process-wide crypto provider; ring is the one compiled in (no cmake or
/// aws-lc in musl builds). A second install (tests) is a no-op.
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_parses_back_to_every_root() {
        let pem = pem_bundle();
        let parsed: Vec<_> = rustls::pki_types::pem::PemObject::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<rustls::pki_types::CertificateDer<'_>>, _>>()
            .unwrap();
        assert_eq!(parsed.len(), webpki_root_certs::TLS_SERVER_ROOT_CERTS.len());
        assert_eq!(
            parsed[0].as_ref(),
            webpki_root_certs::TLS_SERVER_ROOT_CERTS[0].as_ref()
        );
    }
}
