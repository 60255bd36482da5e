//! Classic `docker save` archives (also podman's): manifest.json lists each image's config and
//! layer tars, and there is no manifest to push: the pipeline writes an OCI one.

use runr_registry::sha256_digest;
use serde::Deserialize;

use super::common::{
    blob_path, parse_json, platform_string, select, ConfigProbe, FormatError, MAX_DOCUMENT,
};
use crate::image::archive::{Archive, ArchiveError};
use crate::image::span::Span;

/// One layer of a classic `docker save` archive.
#[derive(Debug, Clone)]
pub struct DockerLayer {
    /// Its path in the archive (for messages).
    pub name: String,
    /// Where its bytes are.
    pub span: Span,
    /// True when the bytes are gzip'ed already.
    pub gzipped: bool,
    /// The config's `rootfs.diff_ids` entry: sha256 of the uncompressed tar.
    pub diff_id: String,
}

/// A classic `docker save` image: config and layer tars, no manifest of its own.
#[derive(Debug)]
pub struct DockerImage {
    /// The archive the layers are read from.
    pub archive: Archive,
    /// The config JSON, pushed byte for byte (its digest is the image ID).
    pub config: Vec<u8>,
    /// `sha256:…` of `config`.
    pub config_digest: String,
    /// Layers, bottom first.
    pub layers: Vec<DockerLayer>,
    /// `os/arch[/variant]` from the config.
    pub platform: Option<String>,
}

#[derive(Deserialize)]
struct DockerEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

#[derive(Deserialize)]
struct DockerConfig {
    os: Option<String>,
    architecture: Option<String>,
    variant: Option<String>,
    rootfs: Option<RootFs>,
}

#[derive(Deserialize)]
struct RootFs {
    diff_ids: Vec<String>,
}

/// The image of the archive (several: the one `upload_name` names).
pub(super) fn read(
    archive: Archive,
    upload_name: Option<&str>,
) -> Result<DockerImage, FormatError> {
    let bytes = archive.read("manifest.json", MAX_DOCUMENT)?;
    let entries: Vec<DockerEntry> = parse_json("manifest.json", &bytes)?;
    let entry = select(entries, upload_name, |e| {
        e.repo_tags.clone().unwrap_or_default()
    })?;
    let config = archive
        .read(&entry.config, MAX_DOCUMENT)
        .map_err(|e| match e {
            ArchiveError::Missing(_) => FormatError::MissingBlob {
                what: "config",
                digest: entry.config.clone(),
                by: "manifest.json".into(),
            },
            e => e.into(),
        })?;
    let parsed: DockerConfig = parse_json(&entry.config, &config)?;
    let diff_ids = parsed.rootfs.map(|r| r.diff_ids).unwrap_or_default();
    if diff_ids.len() != entry.layers.len() {
        return Err(FormatError::Document {
            name: entry.config.clone(),
            reason: format!(
                "it lists {} layers (rootfs.diff_ids) but manifest.json lists {}",
                diff_ids.len(),
                entry.layers.len()
            ),
        });
    }
    let mut layers = Vec::new();
    for (name, diff_id) in entry.layers.iter().zip(diff_ids) {
        blob_path(&diff_id)?;
        let span = archive.find(name).map_err(|e| match e {
            ArchiveError::Missing(_) => FormatError::MissingBlob {
                what: "layer",
                digest: name.clone(),
                by: "manifest.json".into(),
            },
            e => e.into(),
        })?;
        // The first bytes say whether the layer is compressed already.
        let magic = if span.len >= 4 {
            archive.head(span, 4).map_err(|source| FormatError::Io {
                what: format!("read layer {name}"),
                source,
            })?
        } else {
            Vec::new()
        };
        if magic == [0x28, 0xb5, 0x2f, 0xfd] {
            return Err(FormatError::Unsupported(format!(
                "layer {name} is zstd-compressed, which this receiver does not push from a docker save archive; export the image as an OCI layout instead"
            )));
        }
        layers.push(DockerLayer {
            name: name.clone(),
            span,
            gzipped: magic.starts_with(&[0x1f, 0x8b]),
            diff_id,
        });
    }
    let platform = platform_string(ConfigProbe {
        os: parsed.os,
        architecture: parsed.architecture,
        variant: parsed.variant,
    });
    Ok(DockerImage {
        archive,
        config_digest: sha256_digest(&config),
        config,
        layers,
        platform,
    })
}
