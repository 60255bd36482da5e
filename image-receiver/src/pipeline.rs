//! What happens to a verified upload: work out what the file is, push it into the registry and
//! read the tag back.
//!
//! The upload half (`upload`, `server`) calls [`process`] from the background task of
//! `POST /complete` once the size and SHA-256 of the file are verified; what it returns becomes
//! the `image` (or the `message`) of `GET /status`.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// How the layers of a classic `docker save` archive are pushed when they arrive uncompressed
/// (`RUNR_UPLOAD_COMPRESS`). Content that already has a manifest is never recompressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compress {
    /// gzip them (smaller in the registry and on every pull; costs CPU once here).
    #[default]
    Gzip,
    /// Push them as they are (fastest upload; larger pulls).
    None,
}

/// Everything [`process`] needs to know besides the file.
#[derive(Debug, Clone)]
pub struct ProcessOptions {
    /// `RUNR_UPLOAD_DIR`: the only place where temporary files may be written.
    pub work_dir: PathBuf,
    /// `RUNR_UPLOAD_TARGET`: `host[:port]/path/repository:tag`, where the image goes.
    pub target: String,
    /// `RUNR_UPLOAD_NAME`: `repository[:tag]`, picks one image out of an archive of several.
    pub upload_name: Option<String>,
    /// `RUNR_UPLOAD_FILENAME`: the user's file name, only used in messages.
    pub filename: Option<String>,
    /// `RUNR_UPLOAD_COMPRESS`.
    pub compress: Compress,
    /// How to reach the registry.
    pub registry: runr_registry::RegistryConfig,
    /// `RUNR_UPLOAD_SIZE`: bounds the space a decompressed copy of a `.tar.gz` may take.
    pub declared_size: u64,
}

/// What was pushed: the `image` object of `GET /status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageInfo {
    /// Digest of the manifest (or index) the tag points at.
    pub digest: String,
    /// Media type of that manifest (or index).
    pub media_type: String,
    /// `os/arch[/variant]` of every platform pushed (empty for a wasm module).
    pub platforms: Vec<String>,
    /// Number of layers (summed over platforms for an index).
    pub layers: usize,
    /// Bytes of config and layer blobs the image references (each distinct blob once).
    pub size_bytes: u64,
    /// The pushed tag, `host[:port]/path/repository:tag`.
    pub tag_ref: String,
    /// The same image by digest, `host[:port]/path/repository@sha256:…`.
    pub image_ref: String,
    /// `image` or `wasm`.
    pub kind: Kind,
    /// `docker`, `oci` or `wasm`: what the file was.
    pub source_format: SourceFormat,
    /// Anything the user should know, e.g. platforms left out because the file lacks their blobs.
    pub note: Option<String>,
}

/// What kind of artifact was pushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A container image (manifest or index).
    Image,
    /// A WebAssembly module as a CNCF wasm OCI artifact.
    Wasm,
}

/// The format the file was detected as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceFormat {
    /// A classic `docker save` (or podman) archive: manifest.json, no OCI layout.
    Docker,
    /// An OCI image layout (including Docker ≥ 25 archives and `ctr export`).
    Oci,
    /// A WebAssembly module.
    Wasm,
}

/// Why an upload could not be turned into an image in the registry. The message is meant for the
/// user: it names the file, entry or digest at fault and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ProcessError {
    /// The user-facing explanation.
    pub message: String,
}

impl ProcessError {
    /// An error with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        ProcessError {
            message: message.into(),
        }
    }
}

/// Detects what `file` holds, pushes it to `opts.target` and reads the tag back, requiring the
/// digest it pushed. Nothing is tagged unless everything it references was pushed.
pub async fn process(file: &Path, opts: &ProcessOptions) -> Result<ImageInfo, ProcessError> {
    let _ = (file, opts);
    Err(ProcessError::new("not implemented yet"))
}
