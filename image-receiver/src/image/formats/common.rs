//! What the formats share: the media types, the error that names what is wrong, blob and
//! manifest references, the JSON documents read from the archive, and picking one image out of
//! several by name.

use std::io;

use runr_registry::reference::{is_bare_tag, names_match};
use serde::Deserialize;

use crate::image::archive::ArchiveError;
use crate::image::compress::DecompressError;
use crate::image::span::Span;

/// JSON documents read from an archive (manifests, indexes, configs) are refused above this.
pub const MAX_DOCUMENT: u64 = 4 << 20;

/// OCI and Docker media types of the documents we walk.
pub mod media {
    /// OCI image manifest.
    pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    /// OCI image index.
    pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
    /// Docker image manifest v2 schema 2.
    pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
    /// Docker manifest list.
    pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
    /// OCI image config.
    pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    /// Uncompressed OCI layer.
    pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
    /// gzip'ed OCI layer.
    pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    /// CNCF wasm artifact config.
    pub const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
    /// CNCF wasm artifact layer.
    pub const WASM_LAYER: &str = "application/wasm";
}

/// Why a file is not an image we can push; every message names the entry or digest at fault.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The tar itself is unreadable, truncated or unsafe.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// Not a tar, compressed tar or wasm module.
    #[error("the file is neither a docker save archive, an OCI image layout tar (both possibly compressed with gzip, xz or zstd) nor a WebAssembly module")]
    Unrecognized,
    /// Compressed with something the receiver does not unpack.
    #[error("the file is {0}-compressed, which the receiver does not unpack: upload the tar itself, or compressed once with gzip, xz or zstd")]
    Compression(&'static str),
    /// Compressed, and what it holds is compressed again.
    #[error("the file is {outer}-compressed and what it holds is {inner}-compressed again: upload the tar itself, or compressed once with gzip, xz or zstd")]
    CompressedTwice {
        /// The compression of the file.
        outer: &'static str,
        /// The compression of what it holds.
        inner: &'static str,
    },
    /// A tar without manifest.json or index.json.
    #[error("the file is a tar archive but neither a docker save archive (no manifest.json) nor an OCI image layout (no index.json)")]
    NotAnImageArchive,
    /// `\0asm` followed by version bytes of neither a core module nor a component.
    #[error("the file starts with the WebAssembly magic \\0asm but its {0} are neither a WebAssembly core module (01 00 00 00, wasip1) nor a component (0d 00 01 00, wasip2)")]
    WasmVersion(String),
    /// A JSON document is malformed.
    #[error("{name} in the archive is not valid: {reason}")]
    Document {
        /// Which document.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// Something a manifest names is not in the file.
    #[error("{what} {digest} is not in the file (named by {by})")]
    MissingBlob {
        /// `layer`, `config`, `manifest`…
        what: &'static str,
        /// Its digest or path.
        digest: String,
        /// The document that names it.
        by: String,
    },
    /// A blob's bytes do not match its digest or size.
    #[error(
        "{what} {digest} in the file does not match its digest ({detail}): the file is damaged"
    )]
    Corrupt {
        /// `layer`, `config`, `manifest`…
        what: &'static str,
        /// The digest it should have.
        digest: String,
        /// What was found instead.
        detail: String,
    },
    /// Several images and no (matching) name to pick one.
    #[error("the file holds {count} images ({names}); {hint}")]
    SeveralImages {
        /// How many.
        count: usize,
        /// Their names, as found.
        names: String,
        /// What to do.
        hint: String,
    },
    /// A whole compressed archive could not be decompressed.
    #[error(transparent)]
    Decompress(#[from] DecompressError),
    /// Anything else about the content.
    #[error("{0}")]
    Unsupported(String),
    /// Reading or writing our own files failed.
    #[error("failed to {what}: {source}")]
    Io {
        /// The operation.
        what: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// A blob stored in the archive under its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobRef {
    /// `sha256:…`.
    pub digest: String,
    /// Its size (checked against the archive entry).
    pub size: u64,
    /// Where it is in the archive.
    pub span: Span,
    /// `config` or `layer`, for messages.
    pub what: &'static str,
}

/// A manifest or index document, pushed byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawManifest {
    /// `sha256:…` of `bytes`.
    pub digest: String,
    /// Its media type (the Content-Type of the push).
    pub media_type: String,
    /// The exact bytes.
    pub bytes: Vec<u8>,
}

/// The archive path of a blob, refusing digests that are not `sha256:<64 lowercase hex>` (the
/// only form a layout names blobs by, and the only one a digest we compute can equal).
pub(super) fn blob_path(digest: &str) -> Result<String, FormatError> {
    match runr_registry::digest::sha256_hex(digest) {
        Some(h) => Ok(format!("blobs/sha256/{h}")),
        None => Err(FormatError::Unsupported(format!(
            "digest {digest:?} is not supported (only sha256)"
        ))),
    }
}

pub(super) fn parse_json<T: serde::de::DeserializeOwned>(
    name: &str,
    bytes: &[u8],
) -> Result<T, FormatError> {
    serde_json::from_slice(bytes).map_err(|e| FormatError::Document {
        name: name.to_string(),
        reason: e.to_string(),
    })
}

/// The platform fields of an image config.
#[derive(Deserialize)]
pub(super) struct ConfigProbe {
    pub(super) os: Option<String>,
    pub(super) architecture: Option<String>,
    pub(super) variant: Option<String>,
}

/// `os/arch[/variant]`, when the config names both os and architecture.
pub(super) fn platform_string(p: ConfigProbe) -> Option<String> {
    let mut s = format!("{}/{}", p.os?, p.architecture?);
    if let Some(v) = p.variant.filter(|v| !v.is_empty()) {
        s.push('/');
        s.push_str(&v);
    }
    Some(s)
}

/// Narrows several images to the one `upload_name` names.
///
/// A full name (`io.containerd.image.name`, a `ref.name` or `RepoTags` entry that names a
/// repository) decides first: exactly one image must carry a matching one. Only when no image
/// matches by full name does a tag-only `ref.name` (`v1`) count, and only on an image that has
/// no full name at all (a full name that differs says the image is another one), and again only
/// when exactly one image matches. `ctr export` and Docker's containerd store give every image
/// both, the same tag on each.
pub(super) fn select<T>(
    mut images: Vec<T>,
    upload_name: Option<&str>,
    names: impl Fn(&T) -> Vec<String>,
) -> Result<T, FormatError> {
    match images.len() {
        0 => {
            return Err(FormatError::Unsupported(
                "the archive lists no image".to_string(),
            ))
        }
        1 => return Ok(images.remove(0)),
        _ => {}
    }
    let all: Vec<String> = images
        .iter()
        .map(|i| {
            let n = names(i);
            if n.is_empty() {
                "unnamed".to_string()
            } else {
                n.join(" = ")
            }
        })
        .collect();
    let count = images.len();
    let Some(wanted) = upload_name else {
        return Err(FormatError::SeveralImages {
            count,
            names: all.join(", "),
            hint: "upload one image per file".into(),
        });
    };
    let by_full: Vec<usize> = (0..count)
        .filter(|&i| {
            names(&images[i])
                .iter()
                .any(|n| !is_bare_tag(n) && names_match(wanted, n))
        })
        .collect();
    let matching = if by_full.is_empty() {
        (0..count)
            .filter(|&i| {
                let n = names(&images[i]);
                n.iter().all(|n| is_bare_tag(n)) && n.iter().any(|n| names_match(wanted, n))
            })
            .collect()
    } else {
        by_full
    };
    if let [one] = matching[..] {
        return Ok(images.swap_remove(one));
    }
    Err(FormatError::SeveralImages {
        count,
        names: all.join(", "),
        hint: format!(
            "{} of them named like {wanted:?}; upload one image per file",
            if matching.is_empty() {
                "none"
            } else {
                "more than one"
            }
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_paths_only_for_sha256() {
        assert!(blob_path(&format!("sha256:{}", "a".repeat(64))).is_ok());
        assert!(blob_path("sha256:../../etc").is_err());
        assert!(blob_path(&format!("sha512:{}", "a".repeat(128))).is_err());
        assert!(blob_path(&format!("sha256:{}", "A".repeat(64))).is_err());
    }

    fn pick(images: &[&[&str]], wanted: &str) -> Result<usize, String> {
        let images: Vec<(usize, Vec<String>)> = images
            .iter()
            .enumerate()
            .map(|(i, n)| (i, n.iter().map(|s| s.to_string()).collect()))
            .collect();
        select(images, Some(wanted), |(_, n)| n.clone())
            .map(|(i, _)| i)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn full_names_decide_before_tags() {
        let ctr: &[&[&str]] = &[
            &["docker.io/corpus/alpha:v1", "v1"],
            &["docker.io/corpus/beta:v1", "v1"],
        ];
        assert_eq!(pick(ctr, "corpus/beta:v1"), Ok(1));
        assert_eq!(pick(ctr, "corpus/alpha:v1"), Ok(0));
        // Neither full name: the shared tag does not pick one.
        assert!(pick(ctr, "corpus/gamma:v1")
            .unwrap_err()
            .contains("none of them"));
        // Tags only (umoci, skopeo oci-archive:): the tag decides when it is unambiguous.
        let tags: &[&[&str]] = &[&["v1"], &["v2"]];
        assert_eq!(pick(tags, "corpus/app:v2"), Ok(1));
        let same: &[&[&str]] = &[&["v1"], &["v1"]];
        assert!(pick(same, "app:v1").unwrap_err().contains("more than one"));
        // An image known only by its tag is picked when no full name matches; one whose full
        // name differs is not, whatever its tag.
        let mixed: &[&[&str]] = &[&["docker.io/corpus/alpha:v1", "v1"], &["v1"]];
        assert_eq!(pick(mixed, "corpus/beta:v1"), Ok(1));
        assert_eq!(pick(mixed, "corpus/alpha:v1"), Ok(0));
        // Two images with the same full name are ambiguous.
        let twice: &[&[&str]] = &[&["corpus/a:v1"], &["docker.io/corpus/a:v1"]];
        assert!(pick(twice, "corpus/a:v1")
            .unwrap_err()
            .contains("more than one"));
    }
}
