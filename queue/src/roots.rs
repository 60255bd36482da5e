//! The built-in roots (Mozilla's, through `webpki-root-certs`) as the PEM bundle redis-rs takes
//! for `rediss://`: a FROM scratch image has no CA store, and with a root store of its own
//! redis-rs trusts exactly these.

use base64::Engine;

/// Every built-in root as one PEM bundle.
pub(crate) fn pem_bundle() -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = String::new();
    for der in webpki_root_certs::TLS_SERVER_ROOT_CERTS {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let text = b64.encode(der.as_ref());
        for line in text.as_bytes().chunks(64) {
            // base64 output is ASCII: every chunk is valid UTF-8.
            out.push_str(std::str::from_utf8(line).unwrap_or_default());
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}

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
