//! What an uploaded file is, detected from its content (never its name), and the image graph to
//! push: a WebAssembly module, a classic `docker save` archive (also podman's), or an OCI image
//! layout (also Docker ≥ 25 archives and `ctr export`, where the layout wins over manifest.json),
//! each possibly inside a whole-archive gzip.
//!
//! Everything here is blocking file I/O: callers run it on a blocking thread.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use oci_spec::image::{Descriptor, ImageIndex, ImageManifest};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::archive::{Archive, ArchiveError, Span};
use crate::reference;

/// JSON documents read from an archive (manifests, indexes, configs) are refused above this.
pub const MAX_DOCUMENT: u64 = 4 << 20;
/// Room a whole-archive gzip may take beyond the declared size once decompressed.
pub const DECOMPRESS_HEADROOM: u64 = 512 << 20;
/// How deep indexes may nest inside each other.
const MAX_INDEX_DEPTH: usize = 4;

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
    /// Not a tar, gzip'ed tar or wasm module.
    #[error("the file is neither a docker save archive, an OCI image layout tar (both possibly gzip'ed) nor a WebAssembly module")]
    Unrecognized,
    /// A tar without manifest.json or index.json.
    #[error("the file is a tar archive but neither a docker save archive (no manifest.json) nor an OCI image layout (no index.json)")]
    NotAnImageArchive,
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
    /// A whole-archive gzip could not be decompressed.
    #[error("the gzip'ed file could not be decompressed: {0}")]
    Decompress(String),
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

/// A WebAssembly module: the whole file is the one layer.
#[derive(Debug)]
pub struct WasmModule {
    /// The module file, open.
    pub file: std::sync::Arc<File>,
    /// Its bytes.
    pub span: Span,
    /// A component (`wasip2`) rather than a core module (`wasip1`).
    pub component: bool,
}

/// What the file turned out to be.
#[derive(Debug)]
pub enum Detected {
    /// A classic docker archive.
    Docker(DockerImage),
    /// An OCI layout.
    Oci(OciImage),
    /// A WebAssembly module.
    Wasm(WasmModule),
}

/// Inputs of [`detect`] besides the file.
#[derive(Debug, Clone)]
pub struct DetectOptions<'a> {
    /// Where a decompressed copy of a `.tar.gz` may be written.
    pub work_dir: &'a Path,
    /// The declared size, bounding that copy.
    pub declared_size: u64,
    /// `RUNR_UPLOAD_NAME`, to pick one of several images.
    pub upload_name: Option<&'a str>,
}

/// Works out what `path` holds and what to push.
pub fn detect(path: &Path, opts: &DetectOptions<'_>) -> Result<Detected, FormatError> {
    let file = File::open(path).map_err(|source| FormatError::Io {
        what: format!("open {}", path.display()),
        source,
    })?;
    let len = file
        .metadata()
        .map_err(|source| FormatError::Io {
            what: "stat the upload".into(),
            source,
        })?
        .len();
    let mut magic = [0u8; 8];
    let n = read_prefix(&file, &mut magic)?;
    if n >= 8 && magic[..4] == *b"\0asm" {
        let component = magic[4..8] != [1, 0, 0, 0];
        return Ok(Detected::Wasm(WasmModule {
            file: std::sync::Arc::new(file),
            span: Span { offset: 0, len },
            component,
        }));
    }
    let archive = if n >= 2 && magic[..2] == [0x1f, 0x8b] {
        let limit = opts
            .declared_size
            .max(len)
            .saturating_add(DECOMPRESS_HEADROOM);
        let tar = decompress(&file, opts.work_dir, limit)?;
        index_tar(tar)?
    } else {
        index_tar(file)?
    };
    if archive.contains("index.json") {
        Ok(Detected::Oci(oci(archive, opts.upload_name)?))
    } else if archive.contains("manifest.json") {
        Ok(Detected::Docker(docker(archive, opts.upload_name)?))
    } else {
        Err(FormatError::NotAnImageArchive)
    }
}

fn read_prefix(file: &File, buf: &mut [u8]) -> Result<usize, FormatError> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(FormatError::Io {
                    what: "read the upload".into(),
                    source,
                })
            }
        }
    }
    Ok(n)
}

/// Indexes a tar, turning "this is no tar at all" into [`FormatError::Unrecognized`].
fn index_tar(file: File) -> Result<Archive, FormatError> {
    let mut header = [0u8; 512];
    let n = read_prefix(&file, &mut header)?;
    let ustar = n == 512 && &header[257..262] == b"ustar";
    match Archive::index(file) {
        Ok(a) => Ok(a),
        Err(ArchiveError::Read(_)) if !ustar => Err(FormatError::Unrecognized),
        Err(e) => Err(e.into()),
    }
}

/// Decompresses a whole-archive gzip into an unlinked temporary file in `work_dir`, at most
/// `limit` bytes (a gzip bomb stops there).
fn decompress(file: &File, work_dir: &Path, limit: u64) -> Result<File, FormatError> {
    let name = format!(
        ".runr-decompressed-{}-{}.tar",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    );
    let tmp_path = work_dir.join(name);
    let mut out = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&tmp_path)
        .map_err(|source| FormatError::Io {
            what: format!("create a temporary file in {}", work_dir.display()),
            source,
        })?;
    // The open handle keeps the data; the name goes at once, so nothing is left behind whatever
    // happens next (a crash, a failure, the end of the push).
    let _ = std::fs::remove_file(&tmp_path);
    let reader = io::BufReader::with_capacity(1 << 20, FileReader { file, pos: 0 });
    let mut gz = flate2::read::MultiGzDecoder::new(reader);
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let k = match gz.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FormatError::Decompress(e.to_string())),
        };
        total += k as u64;
        if total > limit {
            return Err(FormatError::Decompress(format!(
                "it expands to more than {limit} bytes (the declared size plus 512 MiB); \
                 upload the .tar itself"
            )));
        }
        out.write_all(&buf[..k]).map_err(|source| FormatError::Io {
            what: format!("write the decompressed archive into {}", work_dir.display()),
            source,
        })?;
    }
    Ok(out)
}

/// `Read` over a shared `&File` with positioned reads (the file may be shared elsewhere).
struct FileReader<'a> {
    file: &'a File,
    pos: u64,
}

impl Read for FileReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// `sha256:…` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(data))
}

/// The archive path of a blob, refusing digests that are not `sha256:<64 hex>`.
fn blob_path(digest: &str) -> Result<String, FormatError> {
    match digest.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(format!("blobs/sha256/{h}"))
        }
        _ => Err(FormatError::Unsupported(format!(
            "digest {digest:?} is not supported (only sha256)"
        ))),
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(name: &str, bytes: &[u8]) -> Result<T, FormatError> {
    serde_json::from_slice(bytes).map_err(|e| FormatError::Document {
        name: name.to_string(),
        reason: e.to_string(),
    })
}

fn is_index_type(t: &str) -> bool {
    t == media::OCI_INDEX || t == media::DOCKER_LIST
}

fn is_manifest_type(t: &str) -> bool {
    t == media::OCI_MANIFEST || t == media::DOCKER_MANIFEST
}

// === OCI layouts ===

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

fn oci(archive: Archive, upload_name: Option<&str>) -> Result<OciImage, FormatError> {
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

#[derive(Deserialize)]
struct ConfigProbe {
    os: Option<String>,
    architecture: Option<String>,
    variant: Option<String>,
}

fn config_platform(archive: &Archive, blobs: &[BlobRef]) -> Option<String> {
    let config = blobs.iter().find(|b| b.what == "config")?;
    let bytes = archive
        .read(&blob_path(&config.digest).ok()?, MAX_DOCUMENT)
        .ok()?;
    let probe: ConfigProbe = serde_json::from_slice(&bytes).ok()?;
    platform_string(probe)
}

fn platform_string(p: ConfigProbe) -> Option<String> {
    let mut s = format!("{}/{}", p.os?, p.architecture?);
    if let Some(v) = p.variant.filter(|v| !v.is_empty()) {
        s.push('/');
        s.push_str(&v);
    }
    Some(s)
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

/// Narrows several images to the one whose names match `upload_name`.
fn select<T>(
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
    let mut matching: Vec<T> = images
        .into_iter()
        .filter(|i| names(i).iter().any(|n| reference::matches(wanted, n)))
        .collect();
    if matching.len() == 1 {
        return Ok(matching.remove(0));
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

// === classic docker save ===

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

fn docker(archive: Archive, upload_name: Option<&str>) -> Result<DockerImage, FormatError> {
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
        let mut magic = [0u8; 4];
        let n = if span.len >= 4 {
            archive
                .file()
                .read_exact_at(&mut magic, span.offset)
                .map_err(|source| FormatError::Io {
                    what: format!("read layer {name}"),
                    source,
                })?;
            4
        } else {
            0
        };
        if n == 4 && magic == [0x28, 0xb5, 0x2f, 0xfd] {
            return Err(FormatError::Unsupported(format!(
                "layer {name} is zstd-compressed, which this receiver does not push from a docker save archive; export the image as an OCI layout instead"
            )));
        }
        layers.push(DockerLayer {
            name: name.clone(),
            span,
            gzipped: n == 4 && magic[..2] == [0x1f, 0x8b],
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_paths_only_for_sha256() {
        assert!(blob_path(&format!("sha256:{}", "a".repeat(64))).is_ok());
        assert!(blob_path("sha256:../../etc").is_err());
        assert!(blob_path(&format!("sha512:{}", "a".repeat(128))).is_err());
    }

    #[test]
    fn random_bytes_are_unrecognized() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        let data: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        std::fs::write(&path, data).unwrap();
        let opts = DetectOptions {
            work_dir: dir.path(),
            declared_size: 4096,
            upload_name: None,
        };
        let err = detect(&path, &opts).unwrap_err();
        assert!(matches!(err, FormatError::Unrecognized), "{err}");
    }

    #[test]
    fn wasm_magic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        std::fs::write(&path, b"\0asm\x01\0\0\0").unwrap();
        let opts = DetectOptions {
            work_dir: dir.path(),
            declared_size: 8,
            upload_name: None,
        };
        match detect(&path, &opts).unwrap() {
            Detected::Wasm(w) => assert!(!w.component),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tar_without_image_documents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.tar");
        let mut b = tar::Builder::new(File::create(&path).unwrap());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        b.append_data(&mut h, "hello", &b"x"[..]).unwrap();
        b.finish().unwrap();
        drop(b);
        let a = Archive::open(&path).unwrap();
        assert!(!a.contains("manifest.json"));
        let opts = DetectOptions {
            work_dir: dir.path(),
            declared_size: 0,
            upload_name: None,
        };
        assert!(matches!(
            detect(&path, &opts),
            Err(FormatError::NotAnImageArchive)
        ));
    }
}
