//! The compiled-in roots (Mozilla's, through `webpki-root-certs`) as one PEM bundle: a FROM
//! scratch image has no CA store, and both redis-rs (runr-queue's `rediss://`) and the system
//! store the registry clients need (`SSL_CERT_FILE`) take roots as PEM text.

use base64::Engine;

/// Every compiled-in root as one PEM bundle, 64 base64 characters a line.
pub fn pem_bundle() -> String {
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

#[cfg(test)]
mod tests {
    use super::pem_bundle;

    #[test]
    fn bundle_holds_every_root_as_pem() {
        let pem = pem_bundle();
        assert_eq!(
            pem.matches("-----BEGIN CERTIFICATE-----").count(),
            webpki_root_certs::TLS_SERVER_ROOT_CERTS.len()
        );
        assert!(pem.lines().all(|l| l.len() <= 64 || l.starts_with("-----")));
    }
}
