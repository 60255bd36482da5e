//! Compression, both ways: the uncompressed layers of a classic archive are gzip'ed before they
//! are pushed (`RUNR_UPLOAD_COMPRESS=gzip`), a gzip'ed layer is checked against its diff_id, and
//! a whole archive that arrived compressed (gzip, xz or zstd) is read through its decoder;
//! other compressions are recognised by their magic ([`recognise`]) to say what the file is.
//!
//! - Layers are compressed into an unlinked temporary file in `RUNR_UPLOAD_DIR`: 1 MiB blocks,
//!   two at a time on the two threads of the process's one compressor (one layer at a time,
//!   whoever asks), each an independent gzip member (a multi-member stream, which every gzip
//!   reader, Go's included, reads as one); blocks that do not compress are stored.
//!   The file is then pushed like any blob, so its digest is known before the push (HEAD-skip,
//!   monolithic PUT). From a compressed archive nothing is written: the index pass runs the same
//!   compressor over the layer only to learn the digest and size ([`gzip_layer_digests`]), and
//!   the push runs it again into the request body ([`gzip_blocks`] makes the same bytes from the
//!   same input).
//! - A whole compressed archive is read through its decoder ([`Packed`]), never decompressed to
//!   disk; a bomb stops at [`EXPANSION`] times the file's size (plus [`EXPANSION_SLACK`]),
//!   which bounds the work, not the disk. The decoders stream with bounded memory: xz needs the stream's dictionary (8 MiB for xz's default preset, at most
//!   64 MiB, xz -9's), zstd its window (at most 8 MiB up to level 19, refused above 128 MiB).
//!
//! Everything here is blocking file I/O and CPU: callers run it on a blocking thread.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use runr_registry::Sha256Hasher;

use crate::image::span::{Source, Span, SpanReader};
use crate::prefix::{FollowReader, Prefix};

/// Bytes gzip'ed as one member; two are compressed at once. Small enough to keep memory low,
/// large enough that a member's framing and lost context do not matter.
const GZIP_BLOCK: usize = 1 << 20;
/// Bytes of the compressed file read per step of a decompression (and skipped at once).
const IO_BLOCK: usize = 1 << 20;

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
    file: &Source,
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
    // Members are about a block each: written as they come, no buffer in between.
    let mut writer = &out;
    let mut packed = Sha256Hasher::new();
    let mut len = 0u64;
    let reader = SpanReader::new(file.clone(), span);
    let actual = gzip_blocks(reader, span.len, name, |member| {
        packed.update(member);
        len += member.len() as u64;
        writer
            .write_all(member)
            .map_err(|e| io_err(format!("writing into {}", work_dir.display()), e))
    })?;
    if actual != diff_id {
        return Err(LayerError::DiffId {
            name: name.to_string(),
            diff_id: diff_id.to_string(),
            actual,
        });
    }
    Ok((Arc::new(out), len, packed.finish()))
}

/// `(diff_id, digest, size)`: an uncompressed layer's digest, and the digest and size of the
/// blob [`gzip_blocks`] makes of it.
pub type Made = (String, String, u64);

/// What [`gzip_blocks`] makes of a layer, without keeping it: `(diff_id, digest, size)` of the
/// gzip'ed blob (the same bytes every time: a second run streams them into the registry under
/// this digest). Each member is handed to `member` as well (the follower pushes them).
pub fn gzip_layer_digests(
    reader: impl Read,
    len: u64,
    name: &str,
    mut member: impl FnMut(&[u8]),
) -> Result<(String, String, u64), LayerError> {
    let mut packed = Sha256Hasher::new();
    let mut size = 0u64;
    let raw = gzip_blocks(reader, len, name, |m| {
        packed.update(m);
        size += m.len() as u64;
        member(m);
        Ok(())
    })?;
    Ok((raw, packed.finish(), size))
}

/// gzip's the `len` bytes of `reader` (a layer called `name`) into members of [`GZIP_BLOCK`]
/// input each, handing each to `out` in order; returns the SHA-256 of the input (its diff_id).
/// The output depends only on the input: the same layer makes the same blob every time.
///
/// Runs on the process's one [`Compressor`], waiting for it while another layer has it: one
/// layer is gzip'ed at a time, whoever asks (the follower, the pass, the index walk).
pub fn gzip_blocks(
    reader: impl Read,
    len: u64,
    name: &str,
    out: impl FnMut(&[u8]) -> Result<(), LayerError>,
) -> Result<String, LayerError> {
    let mut held = COMPRESSOR.lock().unwrap_or_else(|e| e.into_inner());
    // Out of its place while it runs: a compression that panics drops it (its threads end),
    // and the next one starts a new one.
    let mut compressor = match held.take() {
        Some(c) => c,
        None => Compressor::start().map_err(|source| LayerError::Io {
            what: "starting the compressor's threads".into(),
            name: name.to_string(),
            source,
        })?,
    };
    let made = compressor.run(reader, len, name, out);
    *held = Some(compressor);
    made
}

/// The process's gzip compressor, made by the first compression and then kept: every layer
/// after it is gzip'ed on the same two threads with the same buffers (two blocks of input, and
/// two members for what deflates), so compressing more layers, or retrying one, costs no more
/// memory (threads and buffers made anew for each layer would land in other allocator arenas,
/// each keeping what it once held).
static COMPRESSOR: std::sync::Mutex<Option<Compressor>> = std::sync::Mutex::new(None);

/// Two worker threads, block k of a layer on worker k % 2; each is handed its input and output
/// buffers with a block and hands them back with the member (in the output buffer, or in the
/// input buffer when it is stored: see [`gzip_member_in`]).
struct Compressor {
    workers: [Worker; 2],
}

/// A worker's buffers: `(block, member)`.
type Buffers = (Vec<u8>, Vec<u8>);

struct Worker {
    to: std::sync::mpsc::SyncSender<Buffers>,
    /// The buffers back, and whether the member is in the block's.
    back: std::sync::mpsc::Receiver<(Buffers, bool)>,
    /// Its buffers while it is idle.
    spare: Option<Buffers>,
}

impl Worker {
    fn start() -> io::Result<Worker> {
        let (to, inbox) = std::sync::mpsc::sync_channel::<Buffers>(1);
        let (done, back) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("gzip".into())
            .spawn(move || {
                for (mut block, mut member) in inbox {
                    let stored = gzip_member_in(&mut block, &mut member);
                    if done.send(((block, member), stored)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Worker {
            to,
            back,
            spare: Some((Vec::with_capacity(GZIP_BLOCK + STORED_ROOM), Vec::new())),
        })
    }
}

impl Compressor {
    fn start() -> io::Result<Compressor> {
        Ok(Compressor {
            workers: [Worker::start()?, Worker::start()?],
        })
    }

    /// [`gzip_blocks`] on these workers. Whatever fails, every block handed out is taken back
    /// before it returns: the workers are idle with their buffers for the next layer.
    fn run(
        &mut self,
        mut reader: impl Read,
        len: u64,
        name: &str,
        mut out: impl FnMut(&[u8]) -> Result<(), LayerError>,
    ) -> Result<String, LayerError> {
        let mut remaining = len;
        let mut raw = Sha256Hasher::new();
        let mut failed = None;
        let mut in_flight = std::collections::VecDeque::with_capacity(2);
        let mut next = 0usize;
        let mut first = true;
        loop {
            // Keep both workers busy while there is input (an empty layer still gets one
            // member: a gzip stream of nothing).
            while failed.is_none() && in_flight.len() < 2 && (remaining > 0 || first) {
                first = false;
                let worker = &mut self.workers[next];
                let (mut block, member) =
                    worker.spare.take().expect("an idle worker has its buffers");
                block.resize((GZIP_BLOCK as u64).min(remaining) as usize, 0);
                if let Err(source) = reader.read_exact(&mut block) {
                    worker.spare = Some((block, member));
                    failed = Some(LayerError::Io {
                        what: "reading the archive".into(),
                        name: name.to_string(),
                        source,
                    });
                    break;
                }
                remaining -= block.len() as u64;
                raw.update(&block);
                worker.to.send((block, member)).expect("gzip worker");
                in_flight.push_back(next);
                next = (next + 1) % 2;
            }
            let Some(w) = in_flight.pop_front() else {
                break;
            };
            let ((block, member), stored) = self.workers[w].back.recv().expect("gzip worker");
            if failed.is_none() {
                failed = out(if stored { &block } else { &member }).err();
            }
            self.workers[w].spare = Some((block, member));
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(raw.finish()),
        }
    }
}

/// sha256 of a gzip'ed span (its blob digest) and of what it decompresses to (its diff_id),
/// in one pass.
pub fn gzip_digests(file: &Source, span: Span) -> io::Result<(String, String)> {
    gzip_digests_of(SpanReader::new(file.clone(), span))
}

/// [`gzip_digests`] of whatever `src` reads, to its end.
pub fn gzip_digests_of(src: impl Read) -> io::Result<(String, String)> {
    let src = Hashing {
        inner: src,
        hasher: Sha256Hasher::new(),
    };
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
    io::copy(&mut src, &mut io::sink())?;
    Ok((src.hasher.finish(), raw.finish()))
}

/// Hashes what it reads.
struct Hashing<R> {
    inner: R,
    hasher: Sha256Hasher,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// How a whole archive arrived compressed, recognised by its magic bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// gzip (`1f 8b`), also multi-member (pigz, concatenated files).
    Gzip,
    /// xz (`fd 37 7a 58 5a 00`), also multi-block (`xz -T`) and concatenated streams.
    Xz,
    /// zstd (`28 b5 2f fd`), also several frames (`pzstd`, concatenated files, skippable frames).
    Zstd,
    /// A compression recognised but not unpacked; the name is for the message.
    Other(&'static str),
}

impl Compression {
    /// What the user knows it as.
    pub fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Xz => "xz",
            Compression::Zstd => "zstd",
            Compression::Other(name) => name,
        }
    }
}

/// The compression `head` (a file's first 16 bytes or fewer) starts with, if any.
pub fn recognise(head: &[u8]) -> Option<Compression> {
    const BZIP2_BLOCK: &[u8] = &[0x31, 0x41, 0x59, 0x26, 0x53, 0x59];
    const BZIP2_END: &[u8] = &[0x17, 0x72, 0x45, 0x38, 0x50, 0x90];
    let bzip2 = head.len() >= 10
        && head.starts_with(b"BZh")
        && (b'1'..=b'9').contains(&head[3])
        && (head[4..10] == *BZIP2_BLOCK || head[4..10] == *BZIP2_END);
    let kind = if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
        Compression::Xz
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) || is_skippable_zstd(head) {
        Compression::Zstd
    } else if bzip2 {
        Compression::Other("bzip2")
    } else if head.starts_with(&[0x04, 0x22, 0x4d, 0x18])
        || head.starts_with(&[0x02, 0x21, 0x4c, 0x18])
    {
        Compression::Other("lz4")
    } else if head.starts_with(b"LZIP") {
        Compression::Other("lzip")
    } else if head.starts_with(&[0x1f, 0x9d]) {
        Compression::Other("compress (.Z)")
    } else {
        return None;
    };
    Some(kind)
}

/// A zstd skippable frame (`pzstd` starts its files with one): magic `5? 2a 4d 18`.
fn is_skippable_zstd(head: &[u8]) -> bool {
    head.len() >= 4 && head[0] & 0xf0 == 0x50 && head[1..4] == [0x2a, 0x4d, 0x18]
}

/// Largest xz dictionary decompressed with: xz's largest preset (`-9`, 64 MiB). The decoder
/// needs the whole dictionary in memory.
const MAX_XZ_DICT: usize = 64 << 20;
/// Largest zstd window decompressed with: what `zstd -d` accepts without `--memory` (128 MiB,
/// `--long`'s default). Levels up to 19 use 8 MiB at most.
const MAX_ZSTD_WINDOW: u64 = 128 << 20;

/// Why a whole compressed archive could not be unwrapped.
#[derive(Debug, thiserror::Error)]
pub enum DecompressError {
    /// The stream is broken, or expands beyond the limit.
    #[error("the {format}-compressed file could not be decompressed: {reason}")]
    Corrupt {
        /// `gzip`, `xz`, `zstd`.
        format: &'static str,
        /// What went wrong.
        reason: String,
    },
}

/// How far a whole compressed archive may expand: [`EXPANSION`] times the file, plus this. Only
/// a bound on work (nothing decompressed is written anywhere). The old bound, on disk, was the
/// file plus this: every archive accepted then is accepted now.
pub const EXPANSION_SLACK: u64 = 512 << 20;
/// How many times its size a whole compressed archive may expand ([`EXPANSION_SLACK`] added).
/// Real images: gzip 2–5×, xz and zstd -19 up to ~10×; a bomb (gzip reaches 1032×) stops here
/// after reading at most this much through the decoder.
pub const EXPANSION: u64 = 64;

/// The bound of [`EXPANSION`] for a compressed file of `len` bytes.
pub fn expansion_limit(len: u64) -> u64 {
    len.saturating_mul(EXPANSION)
        .saturating_add(EXPANSION_SLACK)
}

/// The tar inside a whole compressed archive, read through its decoder: there is no
/// decompressed copy. One decoder at a time moves forward through the stream (reading in
/// order costs one decode); a read behind it starts a new decoder from the file's first byte
/// and skips up to the offset (a retried blob, a document read again).
pub struct Packed {
    file: Arc<File>,
    len: u64,
    kind: Compression,
    /// Decompressed bytes the stream may reach; a read beyond fails as a bomb.
    limit: u64,
    cursor: std::sync::Mutex<Option<Cursor>>,
    /// The first failure of the decoder, in the user's terms (the tar reader around it may
    /// report it in its own).
    failure: std::sync::Mutex<Option<String>>,
    /// Decoders started (the first included): 2 for an archive indexed then pushed in order.
    opened: AtomicU64,
    /// The upload's prefix and generation when the file is still arriving: the decoder reads
    /// behind the prefix, waiting for it to grow (the follower).
    follow: Option<(Arc<Prefix>, u64)>,
}

struct Cursor {
    decoder: Box<dyn Read + Send>,
    /// Decompressed bytes read so far.
    pos: u64,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed")
            .field("kind", &self.kind)
            .field("len", &self.len)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl Packed {
    /// The archive in `file` (`len` bytes, compressed with `kind`), expanding to at most
    /// `limit` bytes.
    pub fn new(
        file: Arc<File>,
        len: u64,
        kind: Compression,
        limit: u64,
    ) -> Result<Packed, DecompressError> {
        if let Compression::Other(name) = kind {
            return Err(DecompressError::Corrupt {
                format: name,
                reason: format!("{name} is not unpacked here"),
            });
        }
        Ok(Packed {
            file,
            len,
            kind,
            limit,
            cursor: std::sync::Mutex::new(None),
            failure: std::sync::Mutex::new(None),
            opened: AtomicU64::new(0),
            follow: None,
        })
    }

    /// [`Packed::new`] for a file still arriving: its decoders read behind the prefix of
    /// `generation`, waiting for it to grow (a wait that ends, the upload reopened, fails the
    /// read).
    pub fn following(
        file: Arc<File>,
        len: u64,
        kind: Compression,
        limit: u64,
        (prefix, generation): (Arc<Prefix>, u64),
    ) -> Result<Packed, DecompressError> {
        Ok(Packed {
            follow: Some((prefix, generation)),
            ..Packed::new(file, len, kind, limit)?
        })
    }

    /// The decoder's first failure, said as the user should read it.
    pub fn failure(&self) -> Option<DecompressError> {
        let reason = self
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        Some(DecompressError::Corrupt {
            format: self.kind.name(),
            reason,
        })
    }

    /// Decoders started so far.
    pub fn decoders_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    fn open(&self) -> Box<dyn Read + Send> {
        self.opened.fetch_add(1, Ordering::Relaxed);
        let file: Box<dyn Read + Send> = match &self.follow {
            Some((prefix, generation)) => Box::new(FollowReader::new(
                self.file.clone(),
                prefix.clone(),
                *generation,
                self.len,
            )),
            None => Box::new(SpanReader::new(self.file.clone(), Span::whole(self.len))),
        };
        let source = io::BufReader::with_capacity(IO_BLOCK, file);
        match self.kind {
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(source)),
            Compression::Xz => Box::new(XzStreams::new(source)),
            Compression::Zstd => Box::new(ZstdFrames::new(source)),
            Compression::Other(_) => unreachable!("refused by Packed::new"),
        }
    }

    /// Up to `buf.len()` decompressed bytes from `pos`; 0 at the end of the stream.
    pub fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        let mut slot = self.cursor.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_none_or(|c| c.pos > pos) {
            if slot.is_some() {
                tracing::debug!(pos, "reading behind the decoder: starting a new one");
            }
            *slot = Some(Cursor {
                decoder: self.open(),
                pos: 0,
            });
        }
        let cursor = slot.as_mut().expect("set above");
        let step = |cursor: &mut Cursor, buf: &mut [u8]| -> io::Result<usize> {
            let n = loop {
                match cursor.decoder.read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    other => break other,
                }
            };
            let n = n.map_err(|e| self.fail(e))?;
            cursor.pos += n as u64;
            if cursor.pos > self.limit {
                let limit = self.limit;
                return Err(self.fail(io::Error::other(format!(
                    "it expands to more than {limit} bytes ({EXPANSION} times its size plus \
                     {} MiB; a decompression bomb?)",
                    EXPANSION_SLACK >> 20
                ))));
            }
            Ok(n)
        };
        let mut skip = vec![0u8; if cursor.pos < pos { IO_BLOCK } else { 0 }];
        while cursor.pos < pos {
            let want = (pos - cursor.pos).min(IO_BLOCK as u64) as usize;
            if step(cursor, &mut skip[..want])? == 0 {
                return Ok(0);
            }
        }
        let r = step(cursor, buf);
        if r.is_err() {
            // A decoder that failed cannot go on; the next read starts over (and fails again).
            *slot = None;
        }
        r
    }

    /// Records the decoder's first failure in the user's terms, and hands it on.
    fn fail(&self, e: io::Error) -> io::Error {
        let reason = if e.kind() == io::ErrorKind::UnexpectedEof {
            "it ends early (truncated?)".to_string()
        } else {
            e.to_string()
        };
        let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        failure.get_or_insert(reason.clone());
        io::Error::other(format!(
            "the {}-compressed file could not be decompressed: {reason}",
            self.kind.name()
        ))
    }
}

/// Reads a [`Packed`] stream from its start, in order (the index pass).
pub struct PackedReader {
    packed: Arc<Packed>,
    pos: u64,
}

impl PackedReader {
    /// From decompressed byte `pos` on.
    pub fn at(packed: Arc<Packed>, pos: u64) -> PackedReader {
        PackedReader { packed, pos }
    }

    /// Decompressed bytes read so far.
    pub fn position(&self) -> u64 {
        self.pos
    }
}

impl Read for PackedReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.packed.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

// === xz ===

/// Bytes of compressed input the xz decoder is handed at a time.
const XZ_INPUT: usize = 64 << 10;

/// The concatenated xz streams of `source`, decompressed: each stream is decoded to its end,
/// then the NUL padding between streams (a multiple of four bytes, which the decoder leaves to
/// its caller) is skipped and the decoder starts over on the next.
struct XzStreams<R> {
    source: R,
    decoder: Box<xz4rust::XzDecoder<'static>>,
    input: Vec<u8>,
    pos: usize,
    filled: usize,
    /// Between two streams (or before the first): padding may follow, or the end.
    between: bool,
    padding: usize,
    /// At least one stream was decoded whole.
    streams: usize,
}

impl<R: Read> XzStreams<R> {
    fn new(source: R) -> XzStreams<R> {
        XzStreams {
            source,
            // Grows to the dictionary the stream declares, refusing more than MAX_XZ_DICT.
            decoder: xz4rust::XzDecoder::in_heap_with_alloc_dict_size(1 << 20, MAX_XZ_DICT),
            input: vec![0u8; XZ_INPUT],
            pos: 0,
            filled: 0,
            between: false,
            padding: 0,
            streams: 0,
        }
    }

    /// Reads more input after what is left unconsumed; false at the end of the source.
    fn refill(&mut self) -> io::Result<bool> {
        self.input.copy_within(self.pos..self.filled, 0);
        self.filled -= self.pos;
        self.pos = 0;
        if self.filled == self.input.len() {
            self.input.resize(self.input.len() * 2, 0);
        }
        let n = self.source.read(&mut self.input[self.filled..])?;
        self.filled += n;
        Ok(n > 0)
    }
}

fn xz_error(e: xz4rust::XzError) -> io::Error {
    let text = match e {
        xz4rust::XzError::DictionaryTooLarge(n) => format!(
            "its dictionary is {} MiB, more than the {} MiB of xz -9, the largest it is \
             decompressed with; compress it with xz -9 or a lower preset",
            n >> 20,
            MAX_XZ_DICT >> 20
        ),
        e => format!("{e:?}"),
    };
    io::Error::other(text)
}

impl<R: Read> Read for XzStreams<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if self.pos == self.filled && !self.refill()? {
                // The end of the file: only whole streams and whole padding may come before it.
                if !self.between {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                if !self.padding.is_multiple_of(4) {
                    return Err(io::Error::other(
                        "the padding after the last stream is not a multiple of four bytes",
                    ));
                }
                return Ok(0);
            }
            if self.between {
                while self.pos < self.filled && self.input[self.pos] == 0 {
                    self.pos += 1;
                    self.padding += 1;
                }
                if self.pos == self.filled {
                    continue;
                }
                if !self.padding.is_multiple_of(4) {
                    return Err(io::Error::other(
                        "the padding between two streams is not a multiple of four bytes",
                    ));
                }
                self.decoder.reset();
                self.between = false;
                self.padding = 0;
            }
            match self.decoder.decode(&self.input[self.pos..self.filled], buf) {
                Ok(xz4rust::XzNextBlockResult::NeedMoreData(used, made)) => {
                    self.pos += used;
                    if made > 0 {
                        return Ok(made);
                    }
                    if used == 0 && !self.refill()? {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
                Ok(xz4rust::XzNextBlockResult::EndOfStream(used, made)) => {
                    self.pos += used;
                    self.between = true;
                    self.streams += 1;
                    if made > 0 {
                        return Ok(made);
                    }
                }
                Err(xz4rust::XzError::NeedsLargerInputBuffer) => {
                    if !self.refill()? {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
                Err(e) => return Err(xz_error(e)),
            }
        }
    }
}

// === zstd ===

/// The zstd frames of `source`, decompressed one after the other (skippable frames skipped),
/// each checked against its content checksum when it has one.
struct ZstdFrames<R> {
    source: R,
    decoder: ruzstd::decoding::FrameDecoder,
    in_frame: bool,
}

impl<R: io::BufRead> ZstdFrames<R> {
    fn new(source: R) -> ZstdFrames<R> {
        let mut decoder = ruzstd::decoding::FrameDecoder::new();
        decoder.set_max_window_size(MAX_ZSTD_WINDOW);
        ZstdFrames {
            source,
            decoder,
            in_frame: false,
        }
    }

    /// Starts the next frame; false at the end of the source.
    fn next_frame(&mut self) -> io::Result<bool> {
        use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
        loop {
            if self.source.fill_buf()?.is_empty() {
                return Ok(false);
            }
            match self.decoder.reset(&mut self.source) {
                Ok(()) => return Ok(true),
                Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                    length,
                    ..
                })) => {
                    let skipped =
                        io::copy(&mut (&mut self.source).take(length.into()), &mut io::sink())?;
                    if skipped < u64::from(length) {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
                Err(FrameDecoderError::WindowSizeTooBig { requested, max }) => {
                    return Err(io::Error::other(format!(
                        "its window is {} MiB, more than the {} MiB it is decompressed with (what \
                         zstd -d accepts without --memory); compress it without --long or --ultra",
                        requested >> 20,
                        max >> 20
                    )))
                }
                Err(e) => return Err(io::Error::other(e.to_string())),
            }
        }
    }
}

impl<R: io::BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use ruzstd::decoding::BlockDecodingStrategy;
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_frame {
                if !self.next_frame()? {
                    return Ok(0);
                }
                self.in_frame = true;
            }
            let n = self.decoder.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if self.decoder.is_finished() {
                let (found, computed) = (
                    self.decoder.get_checksum_from_data(),
                    self.decoder.get_calculated_checksum(),
                );
                if let (Some(found), Some(computed)) = (found, computed) {
                    if found != computed {
                        return Err(io::Error::other(format!(
                            "a frame's content checksum is {found:08x} but its content hashes to \
                             {computed:08x}: the file is damaged"
                        )));
                    }
                }
                self.in_frame = false;
                continue;
            }
            if let Err(e) = self
                .decoder
                .decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBlocks(1))
            {
                // A frame cut short fails in whichever part it was cut: what tells is that
                // the file has nothing left.
                if self.source.fill_buf()?.is_empty() {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                return Err(io::Error::other(e.to_string()));
            }
        }
    }
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
#[cfg(test)]
fn gzip_member(data: &[u8]) -> Vec<u8> {
    let (mut block, mut member) = (data.to_vec(), Vec::new());
    match gzip_member_in(&mut block, &mut member) {
        true => block,
        false => member,
    }
}

/// [`gzip_member`] of the input in `block`: deflated into `member` (emptied first, its capacity
/// reused), or stored in `block` itself, so that what does not shrink needs no second buffer.
/// True when the member is in `block`.
fn gzip_member_in(block: &mut Vec<u8>, member: &mut Vec<u8>) -> bool {
    if !compresses(&block[..block.len().min(SAMPLE)]) {
        gzip_stored_in_place(block);
        return true;
    }
    member.clear();
    // Room for a block that barely compresses (deflate falls back to stored blocks, a few
    // bytes each), so that the member never grows by doubling past it.
    member.reserve(block.len() + block.len() / 256 + 64);
    let mut enc = flate2::write::GzEncoder::new(member, flate2::Compression::fast());
    enc.write_all(block).expect("write to memory");
    enc.finish().expect("finish in memory");
    false
}

/// A gzip member of stored (uncompressed) deflate blocks, RFC 1952 around RFC 1951 §3.2.4.
/// Written here because flate2's level 0 still runs its compressor over every byte; this is a
/// copy and a CRC.
#[cfg(test)]
fn gzip_stored(data: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    gzip_stored_in_place(&mut out);
    out
}

/// Longest stored deflate block.
const MAX_STORED: usize = 65_535;

/// What a member of stored blocks adds to a [`GZIP_BLOCK`] of input: its header and trailer,
/// and each stored block's header.
const STORED_ROOM: usize = 18 + 5 * (GZIP_BLOCK / MAX_STORED + 1);

/// [`gzip_stored`] of the bytes in `buf`, made in `buf`: each stored block moves right past
/// the headers before it.
fn gzip_stored_in_place(buf: &mut Vec<u8>) {
    let len = buf.len();
    let mut crc = flate2::Crc::new();
    crc.update(buf);
    // An empty input is one empty final block.
    let blocks = len.div_ceil(MAX_STORED).max(1);
    let total = 10 + 5 * blocks + len + 8;
    buf.resize(total, 0);
    // From the last block to the first: a block's new place is right of its old one and left
    // of where the block after it went, and its header lands on bytes already moved.
    for i in (0..blocks).rev() {
        let from = i * MAX_STORED;
        let n = (len - from).min(MAX_STORED);
        let at = 10 + 5 * (i + 1) + from;
        buf.copy_within(from..from + n, at);
        buf[at - 5] = u8::from(i + 1 == blocks);
        buf[at - 4..at - 2].copy_from_slice(&(n as u16).to_le_bytes());
        buf[at - 2..at].copy_from_slice(&(!(n as u16)).to_le_bytes());
    }
    // Magic, deflate, no flags, no mtime, no extra flags, OS unknown.
    buf[..10].copy_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
    buf[total - 8..total - 4].copy_from_slice(&crc.sum().to_le_bytes());
    buf[total - 4..].copy_from_slice(&(len as u32).to_le_bytes());
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

    /// `tool args` with `data` on stdin (the real xz and zstd).
    fn run(tool: &str, args: &[&str], data: &[u8]) -> Vec<u8> {
        use std::process::{Command, Stdio};
        let mut child = Command::new(tool)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{tool}: {e}"));
        let mut stdin = child.stdin.take().unwrap();
        let data = data.to_vec();
        let writer = std::thread::spawn(move || stdin.write_all(&data));
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        assert!(out.status.success(), "{tool} {args:?}");
        out.stdout
    }

    /// Hands out one byte per read: every refill path of the decoders is taken.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match (self.0.split_first(), buf.first_mut()) {
                (Some((b, rest)), Some(out)) => {
                    *out = *b;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    fn sample() -> Vec<u8> {
        let mut x = 7u32;
        (0..300_000u32)
            .map(|i| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                if i % 3 == 0 {
                    (x >> 24) as u8
                } else {
                    b'a' + (i % 7) as u8
                }
            })
            .collect()
    }

    #[test]
    fn xz_streams_and_zstd_frames_decode_whole_whatever_the_reads() {
        let data = sample();
        let (a, b) = data.split_at(123_457);
        let mut xz = run("xz", &["-T1", "-c"], a);
        xz.extend_from_slice(&[0; 8]);
        xz.extend(run("xz", &["-T1", "--check=sha256", "-c"], b));
        let mut zst = run("zstd", &["-q", "-c"], a);
        zst.extend_from_slice(b"\x5f\x2a\x4d\x18\x02\x00\x00\x00zz");
        zst.extend(run("zstd", &["-q", "-19", "-c"], b));
        for reads_of_one in [false, true] {
            let mut out = Vec::new();
            let source: Box<dyn Read> = if reads_of_one {
                Box::new(Trickle(&xz))
            } else {
                Box::new(&xz[..])
            };
            XzStreams::new(source).read_to_end(&mut out).unwrap();
            assert!(out == data, "xz, reads of one byte: {reads_of_one}");
            let mut out = Vec::new();
            let capacity = if reads_of_one { 1 } else { 1 << 16 };
            let source = io::BufReader::with_capacity(capacity, Trickle(&zst));
            ZstdFrames::new(source).read_to_end(&mut out).unwrap();
            assert!(out == data, "zstd, reads of one byte: {reads_of_one}");
        }
        // Padding that is not a multiple of four, and a checksum that does not match.
        let mut bad = run("xz", &["-c"], a);
        bad.extend_from_slice(&[0; 3]);
        let err = XzStreams::new(&bad[..])
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(err.to_string().contains("multiple of four"), "{err}");
        let mut bad = run("zstd", &["-q", "-c"], a);
        let at = bad.len() - 2;
        bad[at] ^= 1;
        let err = ZstdFrames::new(&bad[..])
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
    }

    fn packed(data: &[u8], tool: &str, kind: Compression, limit: u64) -> Packed {
        let packed = run(tool, &["-c"], data);
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&packed).unwrap();
        Packed::new(Arc::new(file), packed.len() as u64, kind, limit).unwrap()
    }

    #[test]
    fn a_packed_stream_reads_in_any_order_and_stops_at_its_limit() {
        let data = sample();
        for (tool, kind) in [
            ("gzip", Compression::Gzip),
            ("xz", Compression::Xz),
            ("zstd", Compression::Zstd),
        ] {
            let p = packed(&data, tool, kind, data.len() as u64);
            let source = Source::Packed(Arc::new(p));
            let Source::Packed(p) = &source else {
                unreachable!()
            };
            // In order: one decoder for the whole stream, skipping what is not asked for.
            let mut at = Vec::new();
            for (offset, len) in [(0u64, 1000usize), (5000, 70_000), (200_000, 100_000)] {
                let mut buf = vec![0u8; len];
                source.read_exact_at(&mut buf, offset).unwrap();
                assert!(buf == data[offset as usize..][..len], "{tool} at {offset}");
                at.push(p.decoders_opened());
            }
            assert_eq!(at, [1, 1, 1], "{tool}");
            // Behind the decoder: a new one, the same bytes.
            let mut buf = vec![0u8; 4096];
            source.read_exact_at(&mut buf, 10).unwrap();
            assert!(buf == data[10..10 + 4096], "{tool}");
            assert_eq!(p.decoders_opened(), 2, "{tool}");
            let mut end = [0u8; 1];
            assert_eq!(source.read_at(&mut end, data.len() as u64).unwrap(), 0);
            // One byte short of the stream: a bomb, said in the user's terms.
            let p = packed(&data, tool, kind, data.len() as u64 - 1);
            let err = PackedReader::at(Arc::new(p), 0)
                .read_to_end(&mut Vec::new())
                .unwrap_err();
            let want = format!(
                "the {tool}-compressed file could not be decompressed: it expands to more than"
            );
            assert!(err.to_string().starts_with(&want), "{err}");
        }
    }

    #[test]
    fn compressions_recognised_by_their_magic() {
        let of = |head: &[u8]| recognise(head).map(Compression::name);
        assert_eq!(of(&[0x1f, 0x8b, 8]), Some("gzip"));
        assert_eq!(of(b"\xfd7zXZ\0\0\x04"), Some("xz"));
        assert_eq!(of(&[0x28, 0xb5, 0x2f, 0xfd, 0x24]), Some("zstd"));
        assert_eq!(of(&[0x50, 0x2a, 0x4d, 0x18, 0, 0, 0, 0]), Some("zstd"));
        assert_eq!(of(b"BZh91AY&SY\0\0"), Some("bzip2"));
        assert_eq!(of(&[0x04, 0x22, 0x4d, 0x18, 0x64]), Some("lz4"));
        assert_eq!(of(b"LZIP\x01"), Some("lzip"));
        assert_eq!(of(&[0x1f, 0x9d, 0x90]), Some("compress (.Z)"));
        // A tar whose first entry is called BZh9 is not bzip2.
        assert_eq!(of(b"BZh9-notes.txt\0\0"), None);
        assert_eq!(of(b"manifest.json\0\0\0"), None);
        assert_eq!(of(b""), None);
    }

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

    #[test]
    fn a_stored_member_is_made_in_its_block_without_growing_it() {
        // Its bytes: header, one final block of three bytes, CRC-32 and length.
        let mut crc = flate2::Crc::new();
        crc.update(b"abc");
        let want = [
            &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255, 1, 3, 0, 0xfc, 0xff][..],
            b"abc",
            &crc.sum().to_le_bytes(),
            &[3, 0, 0, 0],
        ]
        .concat();
        assert_eq!(gzip_stored(b"abc"), want);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let data: Vec<u8> = (0..GZIP_BLOCK)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        let edges = [
            0,
            1,
            MAX_STORED - 1,
            MAX_STORED,
            MAX_STORED + 1,
            2 * MAX_STORED,
        ];
        for len in edges.into_iter().chain([GZIP_BLOCK - 1, GZIP_BLOCK]) {
            let mut block = Vec::with_capacity(GZIP_BLOCK + STORED_ROOM);
            block.extend_from_slice(&data[..len]);
            let room = block.capacity();
            gzip_stored_in_place(&mut block);
            assert_eq!(block.capacity(), room, "{len}: grown");
            assert_eq!(block.len(), 18 + 5 * len.div_ceil(MAX_STORED).max(1) + len);
            let mut back = Vec::new();
            flate2::read::GzDecoder::new(&block[..])
                .read_to_end(&mut back)
                .unwrap();
            assert!(back == data[..len], "{len}");
        }
    }

    #[test]
    fn the_compressor_is_whole_again_after_a_layer_that_failed() {
        let data: Vec<u8> = sample()
            .into_iter()
            .cycle()
            .take(3 * GZIP_BLOCK + 5)
            .collect();
        let len = data.len() as u64;
        let gzip = |reader: &[u8]| {
            let mut blob = Vec::new();
            let diff_id = gzip_blocks(reader, len, "l", |m| {
                blob.extend_from_slice(m);
                Ok(())
            })
            .unwrap();
            (diff_id, blob)
        };
        let first = gzip(&data);
        // The file ends part way: blocks are out on both workers.
        let short = &data[..2 * GZIP_BLOCK + 10];
        let err = gzip_blocks(short, len, "l", |_| Ok(())).unwrap_err();
        assert!(matches!(err, LayerError::Io { .. }), "{err}");
        // The request goes away at the second member.
        let mut members = 0;
        let err = gzip_blocks(&data[..], len, "l", |_| {
            members += 1;
            match members {
                2 => Err(LayerError::Io {
                    what: "sending".into(),
                    name: "l".into(),
                    source: io::Error::other("gone"),
                }),
                _ => Ok(()),
            }
        })
        .unwrap_err();
        assert!(err.to_string().contains("gone"), "{err}");
        assert_eq!(members, 2);
        let again = gzip(&data);
        assert!(again == first, "the same layer, the same blob");
        let mut back = Vec::new();
        flate2::read::MultiGzDecoder::new(&again.1[..])
            .read_to_end(&mut back)
            .unwrap();
        assert!(back == data);
    }
}
