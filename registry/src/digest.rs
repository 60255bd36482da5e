//! SHA-256 digests in the form OCI content is addressed by, `sha256:<64 lowercase hex>`.
//!
//! The only algorithm either binary writes or checks is SHA-256. `oci_spec`'s reference grammar
//! also accepts `sha384`/`sha512` and upper-case hex (`[[:xdigit:]]`), so a digest that passed
//! [`oci_spec::distribution::Reference`] is checked again with [`is_sha256`] before it is used:
//! the OCI image spec requires the encoded part of a `sha256` digest to be `[a-f0-9]{64}`, and
//! content that arrives with any other spelling cannot be compared with what we compute.

use sha2::Digest as _;

/// The algorithm prefix of every digest we handle.
pub const SHA256_PREFIX: &str = "sha256:";

/// True for `sha256:` followed by exactly 64 lowercase hex digits.
pub fn is_sha256(digest: &str) -> bool {
    sha256_hex(digest).is_some()
}

/// The 64 hex digits of a `sha256:<hex>` digest, `None` when `digest` is not one (wrong
/// algorithm, length or case): safe to use as a file name.
pub fn sha256_hex(digest: &str) -> Option<&str> {
    digest.strip_prefix(SHA256_PREFIX).filter(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// A SHA-256 a person typed (the receiver's `RUNR_UPLOAD_SHA256`): 64 hex digits in any case,
/// with or without the `sha256:` prefix, surrounding blanks ignored. Returns the 64 digits in
/// lowercase, without the prefix.
pub fn parse_sha256(value: &str) -> Result<String, String> {
    let value = value.trim();
    let hex = value.strip_prefix(SHA256_PREFIX).unwrap_or(value);
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex.to_ascii_lowercase())
    } else {
        Err("expected a SHA-256 digest: 64 hex digits".into())
    }
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    let mut h = Sha256Hasher::new();
    h.update(data);
    h.finish()
}

/// A SHA-256 computed piece by piece (a blob as it streams), finished as `sha256:<hex>`.
#[derive(Clone, Default)]
pub struct Sha256Hasher(sha2::Sha256);

impl Sha256Hasher {
    /// An empty hash.
    pub fn new() -> Sha256Hasher {
        Sha256Hasher(sha2::Sha256::new())
    }

    /// Adds `data`.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// The digest of everything added, `sha256:<64 lowercase hex>`.
    pub fn finish(self) -> String {
        format!("{SHA256_PREFIX}{}", runr_base::fmt::hex(&self.0.finalize()))
    }
}

impl std::fmt::Debug for Sha256Hasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sha256Hasher")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUM: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn digests_of_known_content() {
        assert_eq!(
            sha256_digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(sha256_digest(b"test"), format!("sha256:{SUM}"));
        let mut h = Sha256Hasher::new();
        h.update(b"te");
        h.update(b"");
        h.update(b"st");
        assert_eq!(h.finish(), format!("sha256:{SUM}"));
    }

    #[test]
    fn only_lowercase_sha256_is_a_digest() {
        assert!(is_sha256(&format!("sha256:{SUM}")));
        assert_eq!(sha256_hex(&format!("sha256:{SUM}")), Some(SUM));
        for bad in [
            SUM.to_string(),
            format!("sha256:{}", SUM.to_uppercase()),
            format!("sha256:{}", &SUM[1..]),
            format!("sha256:{SUM}0"),
            format!("sha256:{}g", &SUM[1..]),
            format!("sha512:{SUM}{SUM}"),
            format!("SHA256:{SUM}"),
            "sha256:../../etc/passwd".to_string(),
            String::new(),
        ] {
            assert!(!is_sha256(&bad), "{bad}");
            assert_eq!(sha256_hex(&bad), None, "{bad}");
        }
    }

    // The receiver's RUNR_UPLOAD_SHA256 forms (moved from image-receiver's config tests).
    #[test]
    fn typed_sha256_forms() {
        assert_eq!(parse_sha256(SUM).unwrap(), SUM);
        assert_eq!(parse_sha256(&format!("sha256:{SUM}")).unwrap(), SUM);
        assert_eq!(parse_sha256(&SUM.to_uppercase()).unwrap(), SUM);
        assert_eq!(parse_sha256(&format!(" {SUM}\n")).unwrap(), SUM);
        assert!(parse_sha256(&SUM[1..]).is_err());
        assert!(parse_sha256(&format!("{}g", &SUM[1..])).is_err());
        assert!(parse_sha256(&format!("md5:{SUM}")).is_err());
        assert_eq!(
            parse_sha256("abc").unwrap_err(),
            "expected a SHA-256 digest: 64 hex digits"
        );
    }
}
