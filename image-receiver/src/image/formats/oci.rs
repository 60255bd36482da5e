//! OCI image layouts (also Docker >= 25 archives and `ctr export`): index.json names the images,
//! blobs/sha256/ holds every document and layer. Pushed as found, byte for byte; an index whose
//! platforms are not all in the file becomes the complete platforms only, with a note.

use std::collections::BTreeSet;

use oci_spec::image::{Descriptor, ImageIndex, ImageManifest};
use runr_registry::sha256_digest;
use serde::Deserialize;

use super::common::{
    blob_path, media, parse_json, platform_string, select, BlobRef, ConfigProbe, FormatError,
    RawManifest, MAX_DOCUMENT,
};
use crate::image::archive::{Archive, ArchiveError};

/// How deep indexes may nest inside each other.
const MAX_INDEX_DEPTH: usize = 4;

/// An image whose content already has manifests (OCI layout): pushed as found.
#[derive(Debug)]
pub struct OciImage {
    /// The archive the blobs are read from.
    pub archive: Archive,
    /// Every config and layer blob of the kept platforms, each once.
    pub blobs: Vec<BlobRef>,
    /// Manifests to push by digest before the top one (children before parents).
    pub children: Vec<RawManifest>,
    /// The document the tag will point at.
    pub top: RawManifest,
    /// Platforms pushed.
    pub platforms: Vec<String>,
    /// Layers over all platforms.
    pub layers: usize,
    /// Platforms left out, for the note.
    pub note: Option<String>,
}

fn is_index_type(t: &str) -> bool {
    t == media::OCI_INDEX || t == media::DOCKER_LIST
}

fn is_manifest_type(t: &str) -> bool {
    t == media::OCI_MANIFEST || t == media::DOCKER_MANIFEST
}

/// The media type a document says it has (the descriptor may be vague).
#[derive(Deserialize)]
struct MediaTypeProbe {
    #[serde(rename = "mediaType")]
    media_type: Option<String>,
    manifests: Option<serde_json::Value>,
}

/// A manifest or index, read and checked against its descriptor.
enum Node {
    Manifest {
        raw: RawManifest,
        blobs: Vec<BlobRef>,
        /// First blob the file lacks, if any.
        missing: Option<FormatError>,
        layers: usize,
    },
    Index {
        raw: RawManifest,
        children: Vec<(Descriptor, Node)>,
    },
    /// The manifest document itself is not in the file.
    Absent(FormatError),
}

/// The image of the layout in `archive` (several: the one `upload_name` names).
pub(super) fn read(archive: Archive, upload_name: Option<&str>) -> Result<OciImage, FormatError> {
    let bytes = archive.read("index.json", MAX_DOCUMENT)?;
    let index: ImageIndex = parse_json("index.json", &bytes)?;
    let top = select_oci(index.manifests(), upload_name)?;
    let node = load(&archive, &top, "index.json", 0)?;
    let mut platforms = Vec::new();
    match node {
        Node::Absent(e) => Err(e),
        Node::Manifest {
            raw,
            blobs,
            missing,
            layers,
        } => {
            if let Some(e) = missing {
                return Err(e);
            }
            if let Some(p) = platform_of(&top).or_else(|| config_platform(&archive, &blobs)) {
                platforms.push(p);
            }
            Ok(OciImage {
                archive,
                blobs,
                children: Vec::new(),
                top: raw,
                platforms,
                layers,
                note: None,
            })
        }
        Node::Index { raw, children } => {
            let mut leaves = Vec::new();
            flatten(&children, &mut leaves);
            let complete = leaves.iter().all(|l| l.missing.is_none());
            if complete {
                let mut blobs = Vec::new();
                let mut manifests = Vec::new();
                collect(&children, &mut blobs, &mut manifests);
                let layers = leaves
                    .iter()
                    .filter(|l| !l.attestation)
                    .map(|l| l.layers)
                    .sum();
                let platforms = leaves
                    .iter()
                    .filter(|l| !l.attestation)
                    .filter_map(|l| l.platform.clone())
                    .collect();
                return Ok(OciImage {
                    archive,
                    blobs: dedup(blobs),
                    children: manifests,
                    top: raw,
                    platforms,
                    layers,
                    note: None,
                });
            }
            partial(archive, leaves)
        }
    }
}

/// One image manifest under an index, with what it needs.
struct Leaf<'a> {
    descriptor: &'a Descriptor,
    raw: Option<&'a RawManifest>,
    blobs: &'a [BlobRef],
    missing: Option<&'a FormatError>,
    layers: usize,
    platform: Option<String>,
    attestation: bool,
}

fn flatten<'a>(children: &'a [(Descriptor, Node)], out: &mut Vec<Leaf<'a>>) {
    for (d, node) in children {
        let attestation = d
            .annotations()
            .as_ref()
            .and_then(|a| a.get("vnd.docker.reference.type"))
            .is_some_and(|t| t == "attestation-manifest")
            || platform_of(d).as_deref() == Some("unknown/unknown");
        match node {
            Node::Index { children, .. } => flatten(children, out),
            Node::Manifest {
                raw,
                blobs,
                missing,
                layers,
            } => out.push(Leaf {
                descriptor: d,
                raw: Some(raw),
                blobs,
                missing: missing.as_ref(),
                layers: *layers,
                platform: platform_of(d),
                attestation,
            }),
            Node::Absent(e) => out.push(Leaf {
                descriptor: d,
                raw: None,
                blobs: &[],
                missing: Some(e),
                layers: 0,
                platform: platform_of(d),
                attestation,
            }),
        }
    }
}

/// Every blob and every manifest below `children`, children before parents.
fn collect(children: &[(Descriptor, Node)], blobs: &mut Vec<BlobRef>, out: &mut Vec<RawManifest>) {
    for (_, node) in children {
        match node {
            Node::Manifest { raw, blobs: b, .. } => {
                blobs.extend(b.iter().cloned());
                if !out.iter().any(|m| m.digest == raw.digest) {
                    out.push(raw.clone());
                }
            }
            Node::Index { raw, children } => {
                collect(children, blobs, out);
                if !out.iter().any(|m| m.digest == raw.digest) {
                    out.push(raw.clone());
                }
            }
            Node::Absent(_) => {}
        }
    }
}

fn dedup(blobs: Vec<BlobRef>) -> Vec<BlobRef> {
    let mut seen = BTreeSet::new();
    blobs
        .into_iter()
        .filter(|b| seen.insert(b.digest.clone()))
        .collect()
}

/// Only some platforms are complete: push those (one as the image, several as a new index).
fn partial(archive: Archive, leaves: Vec<Leaf<'_>>) -> Result<OciImage, FormatError> {
    let (kept, dropped): (Vec<_>, Vec<_>) = leaves
        .into_iter()
        .filter(|l| !l.attestation)
        .partition(|l| l.missing.is_none());
    let left_out: Vec<String> = dropped
        .iter()
        .map(|l| {
            l.platform
                .clone()
                .unwrap_or_else(|| l.descriptor.digest().to_string())
        })
        .collect();
    if kept.is_empty() {
        let first = dropped.first().and_then(|l| l.missing);
        return Err(FormatError::Unsupported(format!(
            "no platform of the image is complete in the file ({}): {}",
            left_out.join(", "),
            first.map(|e| e.to_string()).unwrap_or_default()
        )));
    }
    let platforms: Vec<String> = kept.iter().filter_map(|l| l.platform.clone()).collect();
    let layers = kept.iter().map(|l| l.layers).sum();
    let blobs = dedup(kept.iter().flat_map(|l| l.blobs.iter().cloned()).collect());
    let note = Some(format!(
        "pushed {} only: the file lacks blobs of {} (export every platform with skopeo copy --all … oci-archive: or docker buildx --output type=oci)",
        platforms.join(", "),
        left_out.join(", ")
    ));
    let raws: Vec<RawManifest> = kept.iter().filter_map(|l| l.raw.cloned()).collect();
    if raws.len() == 1 {
        let top = raws.into_iter().next().expect("one manifest");
        return Ok(OciImage {
            archive,
            blobs,
            children: Vec::new(),
            top,
            platforms,
            layers,
            note,
        });
    }
    let descriptors: Vec<&Descriptor> = kept.iter().map(|l| l.descriptor).collect();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_INDEX,
        "manifests": descriptors,
    });
    let bytes = serde_json::to_vec(&index).map_err(|e| FormatError::Unsupported(e.to_string()))?;
    let top = RawManifest {
        digest: sha256_digest(&bytes),
        media_type: media::OCI_INDEX.to_string(),
        bytes,
    };
    Ok(OciImage {
        archive,
        blobs,
        children: raws,
        top,
        platforms,
        layers,
        note,
    })
}

fn platform_of(d: &Descriptor) -> Option<String> {
    d.platform().as_ref().map(|p| {
        let mut s = format!("{}/{}", p.os(), p.architecture());
        if let Some(v) = p.variant() {
            s.push('/');
            s.push_str(v);
        }
        s
    })
}

fn config_platform(archive: &Archive, blobs: &[BlobRef]) -> Option<String> {
    let config = blobs.iter().find(|b| b.what == "config")?;
    let bytes = archive
        .read(&blob_path(&config.digest).ok()?, MAX_DOCUMENT)
        .ok()?;
    let probe: ConfigProbe = serde_json::from_slice(&bytes).ok()?;
    platform_string(probe)
}

/// Picks the one top-level image of index.json (several → by `upload_name`).
fn select_oci(
    manifests: &[Descriptor],
    upload_name: Option<&str>,
) -> Result<Descriptor, FormatError> {
    let mut images: Vec<(Descriptor, Vec<String>)> = Vec::new();
    for d in manifests {
        let names: Vec<String> = d
            .annotations()
            .as_ref()
            .map(|a| {
                [
                    "io.containerd.image.name",
                    "org.opencontainers.image.ref.name",
                ]
                .iter()
                .filter_map(|k| a.get(*k).cloned())
                .collect()
            })
            .unwrap_or_default();
        match images.iter_mut().find(|(e, _)| e.digest() == d.digest()) {
            Some((_, n)) => n.extend(names),
            None => images.push((d.clone(), names)),
        }
    }
    let pick = select(images, upload_name, |(_, names)| names.clone())?;
    Ok(pick.0)
}

/// Reads the document `d` names and everything under it.
fn load(archive: &Archive, d: &Descriptor, by: &str, depth: usize) -> Result<Node, FormatError> {
    let digest = d.digest().to_string();
    let path = blob_path(&digest)?;
    if !archive.contains(&path) {
        return Ok(Node::Absent(FormatError::MissingBlob {
            what: "manifest",
            digest,
            by: by.to_string(),
        }));
    }
    let bytes = archive.read(&path, MAX_DOCUMENT)?;
    check_bytes("manifest", &digest, d.size(), &bytes)?;
    let probe: MediaTypeProbe = parse_json(&path, &bytes)?;
    let declared = d.media_type().to_string();
    let media_type = probe
        .media_type
        .clone()
        .filter(|t| is_index_type(t) || is_manifest_type(t))
        .unwrap_or_else(|| {
            if is_index_type(&declared) || is_manifest_type(&declared) {
                declared.clone()
            } else if probe.manifests.is_some() {
                media::OCI_INDEX.to_string()
            } else {
                media::OCI_MANIFEST.to_string()
            }
        });
    let raw = RawManifest {
        digest: digest.clone(),
        media_type: media_type.clone(),
        bytes,
    };
    if is_index_type(&media_type) {
        if depth >= MAX_INDEX_DEPTH {
            return Err(FormatError::Unsupported(format!(
                "indexes nest more than {MAX_INDEX_DEPTH} deep at {digest}"
            )));
        }
        let index: ImageIndex = parse_json(&path, &raw.bytes)?;
        let mut children = Vec::new();
        for child in index.manifests() {
            let node = load(archive, child, &format!("index {digest}"), depth + 1)?;
            children.push((child.clone(), node));
        }
        return Ok(Node::Index { raw, children });
    }
    let manifest: ImageManifest = parse_json(&path, &raw.bytes)?;
    let by = format!("manifest {digest}");
    let mut blobs = Vec::new();
    let mut missing = None;
    let wanted = std::iter::once(("config", manifest.config()))
        .chain(manifest.layers().iter().map(|l| ("layer", l)));
    for (what, b) in wanted {
        let bd = b.digest().to_string();
        let bp = blob_path(&bd)?;
        match archive.find(&bp) {
            Ok(span) => {
                // A config is a JSON document like the manifest naming it: the same bound, the
                // same message (it is read whole for the platform and by every client).
                if what == "config" && span.len > MAX_DOCUMENT {
                    return Err(ArchiveError::TooLarge {
                        name: bp,
                        size: span.len,
                        limit: MAX_DOCUMENT,
                    }
                    .into());
                }
                if span.len != b.size() {
                    return Err(FormatError::Corrupt {
                        what,
                        digest: bd,
                        detail: format!("{} bytes, {by} says {}", span.len, b.size()),
                    });
                }
                blobs.push(BlobRef {
                    digest: bd,
                    size: b.size(),
                    span,
                    what,
                });
            }
            // Foreign layers (Windows base layers) live at their URLs, not in the file.
            Err(ArchiveError::Missing(_)) if b.urls().as_ref().is_some_and(|u| !u.is_empty()) => {}
            Err(ArchiveError::Missing(_)) => {
                if missing.is_none() {
                    missing = Some(FormatError::MissingBlob {
                        what,
                        digest: bd,
                        by: by.clone(),
                    });
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Node::Manifest {
        raw,
        blobs,
        missing,
        layers: manifest.layers().len(),
    })
}

fn check_bytes(
    what: &'static str,
    digest: &str,
    size: u64,
    bytes: &[u8],
) -> Result<(), FormatError> {
    let actual = sha256_digest(bytes);
    if actual != digest {
        return Err(FormatError::Corrupt {
            what,
            digest: digest.to_string(),
            detail: format!("its content hashes to {actual}"),
        });
    }
    if bytes.len() as u64 != size {
        return Err(FormatError::Corrupt {
            what,
            digest: digest.to_string(),
            detail: format!("{} bytes, its descriptor says {size}", bytes.len()),
        });
    }
    Ok(())
}
