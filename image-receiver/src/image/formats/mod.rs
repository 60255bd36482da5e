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
use crate::image::archive::{Archive, ArchiveError, NoTee};
use crate::image::compress::{self, Compression, Packed};
use crate::image::span::{Source, Span, SpanReader};

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
    /// `RUNR_UPLOAD_NAME`, to pick one of several images.
    pub upload_name: Option<&'a str>,
    /// How many bytes the tar inside a `.tar.gz`, `.tar.xz` or `.tar.zst` of `len` bytes may
    /// decompress to ([`compress::expansion_limit`]; the fuzz targets use less).
    pub expansion_limit: fn(u64) -> u64,
    /// Uncompressed classic layers will be gzip'ed (`RUNR_UPLOAD_COMPRESS=gzip`): a compressed
    /// archive's index pass works out what they make.
    pub gzip_layers: bool,
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
            let packed = Arc::new(Packed::new(file, len, kind, (opts.expansion_limit)(len))?);
            let inner = Source::Packed(packed.clone());
            let mut first = vec![0u8; 512];
            let n = read_up_to(&inner, &mut first)
                .map_err(|e| packed.failure().map_or(e, FormatError::from))?;
            first.truncate(n);
            if let Some(twice) = compress::recognise(&first[..n.min(16)]) {
                return Err(FormatError::CompressedTwice {
                    outer: kind.name(),
                    inner: twice.name(),
                });
            }
            let ustar = first.len() == 512 && &first[257..262] == b"ustar";
            match Archive::index_packed(packed, first, opts.gzip_layers, &mut NoTee) {
                Ok(a) => a,
                Err(Ok(decoder)) => return Err(decoder.into()),
                Err(Err(ArchiveError::Read(_))) if !ustar => return Err(FormatError::Unrecognized),
                Err(Err(e)) => return Err(e.into()),
            }
        }
    };
    detect_indexed(archive, opts)
}

/// What the indexed tar `archive` holds and what to push: the rest of [`detect`], for an
/// archive the follower indexed while it arrived.
pub fn detect_indexed(archive: Archive, opts: &DetectOptions<'_>) -> Result<Detected, FormatError> {
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

/// Up to `buf.len()` bytes of `source` from its start: fewer only at its end.
fn read_up_to(source: &Source, buf: &mut [u8]) -> Result<usize, FormatError> {
    let mut done = 0;
    while done < buf.len() {
        match source.read_at(&mut buf[done..], done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(source) => {
                return Err(FormatError::Io {
                    what: "read the upload".into(),
                    source,
                })
            }
        }
    }
    Ok(done)
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
            upload_name: None,
            expansion_limit: compress::expansion_limit,
            gzip_layers: true,
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
            upload_name: None,
            expansion_limit: compress::expansion_limit,
            gzip_layers: true,
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
            upload_name: None,
            expansion_limit: compress::expansion_limit,
            gzip_layers: true,
        };
        assert!(matches!(
            detect(&path, &opts),
            Err(FormatError::NotAnImageArchive)
        ));
    }
}
