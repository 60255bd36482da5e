//! gzip, both ways: the uncompressed layers of a classic archive are compressed before they are
//! pushed (`RUNR_UPLOAD_COMPRESS=gzip`), a gzip'ed layer is checked against its diff_id, and a
//! whole archive that arrived gzip'ed is unwrapped before it is indexed.
//!
//! - Layers are compressed into an unlinked temporary file in `RUNR_UPLOAD_DIR`: 1 MiB blocks,
//!   two at a time on two threads, each an independent gzip member (a multi-member stream, which
//!   every gzip reader, Go's included, reads as one); blocks that do not compress are stored.
//!   The file is then pushed like any blob, so its digest is known before the push (HEAD-skip,
//!   monolithic PUT).
//! - A whole-archive gzip is decompressed into another unlinked temporary file, bounded: a gzip
//!   bomb stops at the declared size plus [`DECOMPRESS_HEADROOM`].
//!
//! Everything here is blocking file I/O and CPU: callers run it on a blocking thread.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use runr_registry::Sha256Hasher;

use crate::image::span::{Span, SpanReader};

/// Bytes gzip'ed as one member; two are compressed at once. Small enough to keep memory low,
/// large enough that a member's framing and lost context do not matter.
const GZIP_BLOCK: usize = 1 << 20;
/// Bytes read from the archive and written out per step of a decompression.
const IO_BLOCK: usize = 1 << 20;
/// Room a whole-archive gzip may take beyond the declared size once decompressed.
pub const DECOMPRESS_HEADROOM: u64 = 512 << 20;

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

/// Why a layer could not be compressed; the message names the layer.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// Reading the archive or writing the compressed copy failed.
    #[error("{what} while compressing layer {name}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The layer's path in the archive.
        name: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The layer's bytes do not hash to the diff_id the config names.
    #[error("layer {name} in the file does not match its diff_id {diff_id} (its content hashes to {actual}): the file is damaged")]
    DiffId {
        /// The layer's path in the archive.
        name: String,
        /// What the config says.
        diff_id: String,
        /// What the bytes hash to.
        actual: String,
    },
}

/// gzip's an uncompressed layer (`span` of `file`) into an unlinked temporary file in
/// `work_dir`, checking its uncompressed digest against `diff_id` on the way. Returns the
/// compressed file, its length and its digest.
pub fn compress_layer(
    file: &Arc<File>,
    span: Span,
    diff_id: &str,
    name: &str,
    work_dir: &Path,
) -> Result<(Arc<File>, u64, String), LayerError> {
    let io_err = |what: String, source: io::Error| LayerError::Io {
        what,
        name: name.to_string(),
        source,
    };
    let tmp_path = scratch_path(work_dir, "layer", "gz");
    let out = create_unlinked(&tmp_path)
        .map_err(|e| io_err(format!("creating {}", tmp_path.display()), e))?;
    let mut writer = io::BufWriter::with_capacity(1 << 20, &out);
    // Not a hashing reader: the raw blocks are hashed below while they compress.
    let mut reader = SpanReader::new(file.clone(), span);
    let mut raw = Sha256Hasher::new();
    let mut packed = Sha256Hasher::new();
    let mut len = 0u64;
    let mut first = true;
    while reader.remaining() > 0 || first {
        first = false;
        let mut blocks = Vec::with_capacity(2);
        for _ in 0..2 {
            if reader.remaining() == 0 && !blocks.is_empty() {
                break;
            }
            let block = reader
                .read_block(GZIP_BLOCK)
                .map_err(|e| io_err("reading the archive".into(), e))?;
            blocks.push(block);
        }
        // Both blocks compress on threads of their own while this one hashes them in order.
        let members: Vec<Vec<u8>> = std::thread::scope(|s| {
            let workers: Vec<_> = blocks
                .iter()
                .map(|b| s.spawn(move || gzip_member(b)))
                .collect();
            for b in &blocks {
                raw.update(b);
            }
            workers
                .into_iter()
                .map(|w| w.join().expect("gzip thread"))
                .collect()
        });
        for m in members {
            packed.update(&m);
            len += m.len() as u64;
            writer
                .write_all(&m)
                .map_err(|e| io_err(format!("writing into {}", work_dir.display()), e))?;
        }
    }
    writer
        .flush()
        .map_err(|e| io_err(format!("writing into {}", work_dir.display()), e))?;
    drop(writer);
    let actual = raw.finish();
    if actual != diff_id {
        return Err(LayerError::DiffId {
            name: name.to_string(),
            diff_id: diff_id.to_string(),
            actual,
        });
    }
    Ok((Arc::new(out), len, packed.finish()))
}

/// sha256 of a gzip'ed span (its blob digest) and of what it decompresses to (its diff_id),
/// in one pass.
pub fn gzip_digests(file: &Arc<File>, span: Span) -> io::Result<(String, String)> {
    let src = SpanReader::hashing(file.clone(), span);
    let mut gz = flate2::read::MultiGzDecoder::new(io::BufReader::with_capacity(1 << 20, src));
    let mut raw = Sha256Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = gz.read(&mut buf)?;
        if n == 0 {
            break;
        }
        raw.update(&buf[..n]);
    }
    let mut src = gz.into_inner().into_inner();
    // Trailing bytes after the last member still belong to the blob.
    src.consume()?;
    Ok((src.digest().expect("a hashing reader"), raw.finish()))
}

/// Why a whole-archive gzip could not be unwrapped.
#[derive(Debug, thiserror::Error)]
pub enum DecompressError {
    /// The gzip stream is broken, or expands beyond the limit.
    #[error("the gzip'ed file could not be decompressed: {0}")]
    Gzip(String),
    /// Our own temporary file could not be created or written.
    #[error("failed to {what}: {source}")]
    Io {
        /// The operation.
        what: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Decompresses the whole-archive gzip in `file` (`len` bytes) into an unlinked temporary file
/// in `work_dir`, at most `limit` bytes (a gzip bomb stops there). Returns the file and its
/// length.
pub fn decompress_archive(
    file: &Arc<File>,
    len: u64,
    work_dir: &Path,
    limit: u64,
) -> Result<(Arc<File>, u64), DecompressError> {
    let mut out =
        create_unlinked(&scratch_path(work_dir, "decompressed", "tar")).map_err(|source| {
            DecompressError::Io {
                what: format!("create a temporary file in {}", work_dir.display()),
                source,
            }
        })?;
    let reader =
        io::BufReader::with_capacity(IO_BLOCK, SpanReader::new(file.clone(), Span::whole(len)));
    let mut gz = flate2::read::MultiGzDecoder::new(reader);
    let mut buf = vec![0u8; IO_BLOCK];
    let mut total = 0u64;
    loop {
        let k = match gz.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(DecompressError::Gzip(e.to_string())),
        };
        total += k as u64;
        if total > limit {
            return Err(DecompressError::Gzip(format!(
                "it expands to more than {limit} bytes (the declared size plus 512 MiB); \
                 upload the .tar itself"
            )));
        }
        out.write_all(&buf[..k])
            .map_err(|source| DecompressError::Io {
                what: format!("write the decompressed archive into {}", work_dir.display()),
                source,
            })?;
    }
    Ok((Arc::new(out), total))
}

/// Makes temporary names unique within the process.
static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// `.runr-<what>-<pid>-<n>.<ext>` in `work_dir`: the only place the receiver may write.
fn scratch_path(work_dir: &Path, what: &str, ext: &str) -> PathBuf {
    let n = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    work_dir.join(format!(".runr-{what}-{}-{n}.{ext}", std::process::id()))
}

/// Creates `path` for reading and writing, then removes its name: only the handle keeps the
/// data, so nothing is left behind whatever happens next (a crash, a failure, the end of the
/// push).
fn create_unlinked(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)?;
    let _ = std::fs::remove_file(path);
    Ok(file)
}

/// One self-contained gzip member of `data`: level 1, or stored blocks when a sample shows the
/// data does not compress (random or already-compressed files in a layer are common, and
/// deflating them costs a core for nothing).
fn gzip_member(data: &[u8]) -> Vec<u8> {
    if !compresses(&data[..data.len().min(SAMPLE)]) {
        return gzip_stored(data);
    }
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 2 + 1024),
        flate2::Compression::fast(),
    );
    enc.write_all(data).expect("write to memory");
    enc.finish().expect("finish in memory")
}

/// A gzip member of stored (uncompressed) deflate blocks, RFC 1952 around RFC 1951 §3.2.4.
/// Written here because flate2's level 0 still runs its compressor over every byte; this is a
/// copy and a CRC.
fn gzip_stored(data: &[u8]) -> Vec<u8> {
    const MAX_STORED: usize = 65_535;
    let mut out = Vec::with_capacity(data.len() + data.len() / MAX_STORED * 5 + 32);
    // Magic, deflate, no flags, no mtime, no extra flags, OS unknown.
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
    let mut blocks = data.chunks(MAX_STORED).peekable();
    if blocks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(block) = blocks.next() {
        let last = blocks.peek().is_none();
        let len = block.len() as u16;
        out.push(u8::from(last));
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    let mut crc = flate2::Crc::new();
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// Bytes of a block tried first to decide how to compress it (1.6 % of a block: deflating the
/// sample of an incompressible layer is most of what gzip'ing it costs).
const SAMPLE: usize = 16 << 10;

/// True when level 1 saves at least 5 % on `sample`.
fn compresses(sample: &[u8]) -> bool {
    let mut enc = flate2::write::DeflateEncoder::new(
        Vec::with_capacity(sample.len() + 1024),
        flate2::Compression::fast(),
    );
    enc.write_all(sample).expect("write to memory");
    let out = enc.finish().expect("finish in memory");
    (out.len() as u64) * 100 < (sample.len() as u64) * 95
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_decompress_to_the_input_whether_stored_or_deflated() {
        let text: Vec<u8> = b"layer ".iter().cycle().take(300_000).copied().collect();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..300_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        assert!(compresses(&text[..SAMPLE]));
        assert!(!compresses(&noise[..SAMPLE]));
        let mut joined = gzip_member(&text);
        joined.extend(gzip_member(&noise));
        assert!(joined.len() < text.len() / 10 + noise.len() + 1024);
        joined.extend(gzip_stored(&[]));
        joined.extend(gzip_stored(&text[..70_000]));
        let mut back = Vec::new();
        flate2::read::MultiGzDecoder::new(&joined[..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, [&text[..], &noise[..], &text[..70_000]].concat());
    }
}
