//! What an uploaded file is, detected from its content (never its name), and the image graph to
//! push: a WebAssembly module, a classic `docker save` archive (also podman's), or an OCI image
//! layout (also Docker ≥ 25 archives and `ctr export`, where the layout wins over manifest.json),
//! each possibly compressed whole with gzip, xz or zstd.
//!
//! Everything here is blocking file I/O: callers run it on a blocking thread.

//!
//! `common` holds what every format shares; `oci`, `docker` and `wasm` read one format each,
//! and [`detect`] picks between them.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use self::docker::DockerImage;
use self::oci::OciImage;
use self::wasm::WasmModule;
use crate::image::archive::{Archive, ArchiveError};
#[cfg(doc)]
use crate::image::compress::DECOMPRESS_HEADROOM;
use crate::image::compress::{self, Compression};
use crate::image::span::{Span, SpanReader};

pub(crate) use self::common::{media, FormatError, RawManifest};

pub(crate) mod common;
pub(crate) mod docker;
pub(crate) mod oci;
pub(crate) mod wasm;

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
    /// Where a decompressed copy of a `.tar.gz`, `.tar.xz` or `.tar.zst` may be written.
    pub work_dir: &'a Path,
    /// The declared size, bounding that copy.
    pub declared_size: u64,
    /// `RUNR_UPLOAD_NAME`, to pick one of several images.
    pub upload_name: Option<&'a str>,
    /// Room a decompressed copy may take beyond the declared size ([`DECOMPRESS_HEADROOM`]).
    pub headroom: u64,
}

/// Works out what `path` holds and what to push.
pub fn detect(path: &Path, opts: &DetectOptions<'_>) -> Result<Detected, FormatError> {
    let file = Arc::new(File::open(path).map_err(|source| FormatError::Io {
        what: format!("open {}", path.display()),
        source,
    })?);
    let len = file
        .metadata()
        .map_err(|source| FormatError::Io {
            what: "stat the upload".into(),
            source,
        })?
        .len();
    let magic = head(&file, len, 16)?;
    if let Some(component) = wasm::header(&magic) {
        return Ok(Detected::Wasm(WasmModule {
            file,
            span: Span::whole(len),
            component: component?,
        }));
    }
    let archive = match compress::recognise(&magic) {
        None => index_tar(file, len)?,
        Some(Compression::Other(name)) => return Err(FormatError::Compression(name)),
        Some(kind) => {
            let limit = opts.declared_size.max(len).saturating_add(opts.headroom);
            let (tar, tar_len) =
                compress::decompress_archive(&file, len, kind, opts.work_dir, limit)?;
            if let Some(inner) = compress::recognise(&head(&tar, tar_len, 16)?) {
                return Err(FormatError::CompressedTwice {
                    outer: kind.name(),
                    inner: inner.name(),
                });
            }
            index_tar(tar, tar_len)?
        }
    };
    if archive.contains("index.json") {
        Ok(Detected::Oci(oci::read(archive, opts.upload_name)?))
    } else if archive.contains("manifest.json") {
        Ok(Detected::Docker(docker::read(archive, opts.upload_name)?))
    } else {
        Err(FormatError::NotAnImageArchive)
    }
}

/// The first `n` bytes of `file` (`len` bytes long), fewer when it is shorter.
fn head(file: &Arc<File>, len: u64, n: usize) -> Result<Vec<u8>, FormatError> {
    let span = Span {
        offset: 0,
        len: len.min(n as u64),
    };
    SpanReader::new(file.clone(), span)
        .read_block(n)
        .map_err(|source| FormatError::Io {
            what: "read the upload".into(),
            source,
        })
}

/// Indexes a tar, turning "this is no tar at all" into [`FormatError::Unrecognized`].
fn index_tar(file: Arc<File>, len: u64) -> Result<Archive, FormatError> {
    let header = head(&file, len, 512)?;
    let ustar = header.len() == 512 && &header[257..262] == b"ustar";
    match Archive::index(file) {
        Ok(a) => Ok(a),
        Err(ArchiveError::Read(_)) if !ustar => Err(FormatError::Unrecognized),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            headroom: compress::DECOMPRESS_HEADROOM,
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
            headroom: compress::DECOMPRESS_HEADROOM,
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
            headroom: compress::DECOMPRESS_HEADROOM,
        };
        assert!(matches!(
            detect(&path, &opts),
            Err(FormatError::NotAnImageArchive)
        ));
    }
}
