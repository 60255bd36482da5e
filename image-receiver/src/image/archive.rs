//! The tar archive's own index: every entry's name → where its bytes sit in the file.
//!
//! Archives are read in place, never extracted: the index records each regular file's data
//! offset and length (the `tar` crate walks the headers, GNU long names and PAX records included,
//! seeking over the data), and blobs are later read with positioned reads. Hard links and symbolic
//! links (`docker save` stores repeated layers as links) are resolved inside the archive only.
//! Names that could point outside the archive (`..`, absolute paths, links leaving it) make the
//! whole archive refused: no well-formed image archive has them.
//!
//! A whole compressed archive is indexed the same way in one pass through its decoder
//! ([`Archive::index_packed`]), holding only what the formats read (the small JSON documents,
//! each file's first bytes): its spans are offsets into the decompressed stream, read later
//! through the decoder again, in order. The follower runs that pass while the archive arrives,
//! its [`Tee`] pushing the blobs from the one decode.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read as _, Seek};
use std::sync::Arc;

use tar::EntryType;

use crate::image::compress::{self, DecompressError, Packed, PackedReader};
use crate::image::span::{Source, Span, SpanReader};

/// An archive with more entries than this is refused (the index lives in memory).
const MAX_ENTRIES: usize = 1_000_000;
/// Links followed before giving up (a loop, or a chain no tool writes).
const MAX_LINK_HOPS: usize = 16;

/// Why an archive could not be indexed or read.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The tar headers could not be read.
    #[error("the file is not a readable tar archive ({0})")]
    Read(#[source] io::Error),
    /// An entry's data runs past the end of the file.
    #[error("the archive is truncated: entry {name:?} needs {need} bytes but the file has {have}")]
    Truncated {
        /// The entry.
        name: String,
        /// The offset its data ends at.
        need: u64,
        /// The file's length.
        have: u64,
    },
    /// An entry's name or link target points outside the archive.
    #[error("the archive entry {name:?} points outside the archive ({why}); refusing the file")]
    UnsafePath {
        /// The entry.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Too many entries to index.
    #[error("the archive has more than {MAX_ENTRIES} entries")]
    TooManyEntries,
    /// A name the caller needs is not in the archive.
    #[error("the archive has no entry {0:?}")]
    Missing(String),
    /// A link leads nowhere, in a loop, or to something that is not a file.
    #[error("the archive entry {name:?} is a link that does not resolve to a file ({why})")]
    BadLink {
        /// The entry.
        name: String,
        /// Why.
        why: &'static str,
    },
    /// A document is larger than the caller allows.
    #[error("the archive entry {name:?} is {size} bytes, more than the {limit} bytes allowed")]
    TooLarge {
        /// The entry.
        name: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Reading an entry's bytes failed.
    #[error("failed to read archive entry {name:?}: {source}")]
    ReadEntry {
        /// The entry.
        name: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

#[derive(Debug, Clone)]
enum Node {
    File(Span),
    /// Target already made archive-relative and normalized.
    Symlink(String),
    Hardlink(String),
    Other,
}

/// What the index pass through a compressed archive kept, so that nothing needs a second look
/// behind the decoder: the JSON documents, each file's first bytes, and the digests of the
/// gzip'ed files outside `blobs/` (a classic archive's compressed layers, whose diff_id is
/// checked before they are pushed).
#[derive(Debug, Clone, Default)]
struct Held {
    /// By offset: every file of at most [`MAX_HELD_DOCUMENT`] bytes that starts like JSON,
    /// [`MAX_HELD`] bytes in all.
    documents: HashMap<u64, Arc<Vec<u8>>>,
    /// By offset: the first [`HEAD`] bytes (fewer when it is shorter) of each file outside
    /// `blobs/`.
    heads: HashMap<u64, Vec<u8>>,
    /// By offset: `(blob digest, digest of what it decompresses to)`.
    gzip: HashMap<u64, (String, String)>,
    /// By offset, when classic layers are to be gzip'ed: `(diff_id, digest, size)` of what
    /// gzip'ing the uncompressed `.tar` entries outside `blobs/` makes.
    made: HashMap<u64, (String, String, u64)>,
}

/// A document larger than this is not held (formats refuse documents over 4 MiB anyway).
const MAX_HELD_DOCUMENT: u64 = 4 << 20;
/// The documents held from one compressed archive, at most: beyond, a document is read again
/// through a new decoder (slow, still correct).
const MAX_HELD: u64 = 16 << 20;
/// First bytes kept of each file (what the formats look at: compression magic).
const HEAD: usize = 16;

/// What the index pass of a compressed archive does with a file entry's bytes, told to its
/// [`Tee`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// A JSON document, held in memory: the formats read it from there.
    Held,
    /// An uncompressed classic layer, gzip'ed to learn what it makes: the sink gets the gzip
    /// members.
    Gzipping,
    /// Anything else: the sink gets its bytes as they are.
    Raw,
}

/// Where the follower sends the entries of a compressed archive it indexes while it arrives:
/// the index pass hands their bytes (or their gzip members) on as it reads them, so the blobs
/// are pushed from the one decode.
pub trait Tee {
    /// At the header of the file entry `name` at `span` of the decompressed stream, whose first
    /// bytes are `head`: where what `reading` makes of it goes, if anywhere.
    fn entry(
        &mut self,
        name: &str,
        span: Span,
        head: &[u8],
        reading: Reading,
    ) -> Option<Box<dyn Sink>>;
}

/// No tee: the index pass after `complete`.
pub struct NoTee;

impl Tee for NoTee {
    fn entry(&mut self, _: &str, _: Span, _: &[u8], _: Reading) -> Option<Box<dyn Sink>> {
        None
    }
}

/// One entry's bytes (or gzip members), in order. Dropped without [`Sink::end`] when the
/// entry could not be read to its end.
pub trait Sink {
    /// The next piece; false once the sink takes no more (its push ended).
    fn piece(&mut self, piece: &[u8]) -> bool;
    /// Every piece was handed over; `made` is what gzip'ing the entry made ([`Reading::Gzipping`]).
    fn end(self: Box<Self>, made: Option<&compress::Made>);
}

/// A reader that hands what it reads to a sink, until the sink takes no more.
struct Teeing<'a, R> {
    inner: R,
    sink: Option<&'a mut (dyn Sink + 'static)>,
}

impl<R: io::Read> io::Read for Teeing<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > 0 && self.sink.as_mut().is_some_and(|s| !s.piece(&buf[..n])) {
            self.sink = None;
        }
        Ok(n)
    }
}

/// The index of one tar archive, with the file kept open for positioned reads.
#[derive(Debug, Clone)]
pub struct Archive {
    file: Source,
    entries: HashMap<String, Node>,
    held: Arc<Held>,
}

/// One header of the walk: the entry's name and what it is.
fn node_of<R: io::Read>(
    entry: &tar::Entry<'_, R>,
    have: Option<u64>,
) -> Result<(String, Node), ArchiveError> {
    let raw = entry.path_bytes();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let name = normalize_name(&raw)?;
    let kind = entry.header().entry_type();
    let node = match kind {
        EntryType::Regular | EntryType::Continuous => {
            let span = Span {
                offset: entry.raw_file_position(),
                len: entry.size(),
            };
            let need = span.offset.saturating_add(span.len);
            if let Some(have) = have.filter(|&have| need > have) {
                return Err(ArchiveError::Truncated {
                    name: raw,
                    need,
                    have,
                });
            }
            Node::File(span)
        }
        EntryType::Symlink | EntryType::Link => {
            let target = entry
                .link_name_bytes()
                .map(|t| String::from_utf8_lossy(&t).into_owned())
                .unwrap_or_default();
            if kind == EntryType::Symlink {
                Node::Symlink(resolve_symlink_target(&raw, &name, &target)?)
            } else {
                Node::Hardlink(normalize_link(&raw, &target)?)
            }
        }
        EntryType::GNUSparse => {
            // Sparse data is not contiguous in the file: no image tool writes it.
            return Err(ArchiveError::BadLink {
                name: raw,
                why: "sparse files are not supported",
            });
        }
        _ => Node::Other,
    };
    Ok((name, node))
}

impl Archive {
    /// Opens `path` and indexes it (the pipeline indexes the file it opened itself).
    #[cfg(test)]
    pub fn open(path: &std::path::Path) -> Result<Archive, ArchiveError> {
        let file = File::open(path).map_err(ArchiveError::Read)?;
        Self::index(Arc::new(file))
    }

    /// Indexes the archive in `file` (which stays open for later reads).
    pub fn index(file: Arc<File>) -> Result<Archive, ArchiveError> {
        let have = file.metadata().map_err(ArchiveError::Read)?.len();
        (&*file)
            .seek(io::SeekFrom::Start(0))
            .map_err(ArchiveError::Read)?;
        let mut entries = HashMap::new();
        {
            let mut tar = tar::Archive::new(&*file);
            for entry in tar.entries_with_seek().map_err(ArchiveError::Read)? {
                let entry = entry.map_err(ArchiveError::Read)?;
                if entries.len() >= MAX_ENTRIES {
                    return Err(ArchiveError::TooManyEntries);
                }
                let (name, node) = node_of(&entry, Some(have))?;
                if !name.is_empty() {
                    entries.insert(name, node);
                }
            }
        }
        Ok(Archive {
            file: Source::File(file),
            entries,
            held: Arc::default(),
        })
    }

    /// Indexes the tar inside a whole compressed archive in one pass through its decoder,
    /// holding what the formats read (see [`Held`]), then reads the stream to its end (a
    /// damaged or truncated end, or a bomb after the tar, fails here, before anything is
    /// pushed). Errors of the decoder come back as `Err(Ok(_))`, in its own terms.
    /// `first` is what was read of the stream already (the format's magic), its first bytes;
    /// with `gzip_layers`, what uncompressed classic layers gzip to is worked out on the way
    /// (see [`Held`]), so that they stream into the registry under a known digest.
    pub fn index_packed(
        packed: Arc<Packed>,
        first: Vec<u8>,
        gzip_layers: bool,
        tee: &mut dyn Tee,
    ) -> Result<Archive, Result<DecompressError, ArchiveError>> {
        let mut entries = HashMap::new();
        let mut held = Held::default();
        let mut held_bytes = 0u64;
        let first_len = first.len() as u64;
        let mut reader = io::Cursor::new(first).chain(PackedReader::at(packed.clone(), first_len));
        let walked = (|| -> Result<(), ArchiveError> {
            let mut tar = tar::Archive::new(&mut reader);
            for entry in tar.entries().map_err(ArchiveError::Read)? {
                let mut entry = entry.map_err(ArchiveError::Read)?;
                if entries.len() >= MAX_ENTRIES {
                    return Err(ArchiveError::TooManyEntries);
                }
                let (name, node) = node_of(&entry, None)?;
                if let Node::File(span) = node {
                    let read_err = |source| ArchiveError::ReadEntry {
                        name: name.clone(),
                        source,
                    };
                    let mut head = Vec::with_capacity(HEAD);
                    (&mut entry)
                        .take(HEAD as u64)
                        .read_to_end(&mut head)
                        .map_err(read_err)?;
                    let json = matches!(
                        head.iter().find(|b| !b.is_ascii_whitespace()),
                        Some(b'{' | b'[')
                    );
                    let document =
                        json && span.len <= MAX_HELD_DOCUMENT && held_bytes + span.len <= MAX_HELD;
                    let gzipped =
                        !document && head.starts_with(&[0x1f, 0x8b]) && !name.starts_with("blobs/");
                    let gzipping = !document
                        && !gzipped
                        && gzip_layers
                        && name.ends_with(".tar")
                        && !name.starts_with("blobs/")
                        && compress::recognise(&head).is_none();
                    let reading = if document {
                        Reading::Held
                    } else if gzipping {
                        Reading::Gzipping
                    } else {
                        Reading::Raw
                    };
                    let mut sink = tee.entry(&name, span, &head, reading);
                    if reading != Reading::Gzipping
                        && sink.as_mut().is_some_and(|s| !s.piece(&head))
                    {
                        sink = None;
                    }
                    let mut made = None;
                    {
                        // Every byte of the entry read from here on goes to the sink as it
                        // is, except for a layer gzip'ed, whose members go instead.
                        let (raw_sink, mut members) = match reading {
                            Reading::Gzipping => (None, sink.as_deref_mut()),
                            _ => (sink.as_deref_mut(), None),
                        };
                        let mut entry = Teeing {
                            inner: &mut entry,
                            sink: raw_sink,
                        };
                        if document {
                            let mut doc = head.clone();
                            entry.read_to_end(&mut doc).map_err(read_err)?;
                            held_bytes += span.len;
                            held.documents.insert(span.offset, Arc::new(doc));
                        } else if gzipped {
                            let rest = io::Cursor::new(head.clone()).chain(&mut entry);
                            // A stream that is not gzip after all is told when it is pushed.
                            if let Ok(digests) = compress::gzip_digests_of(rest) {
                                held.gzip.insert(span.offset, digests);
                            }
                        } else if gzipping {
                            let rest = io::Cursor::new(head.clone()).chain(&mut entry);
                            let got =
                                compress::gzip_layer_digests(rest, span.len, &name, |member| {
                                    if members.as_mut().is_some_and(|s| !s.piece(member)) {
                                        members = None;
                                    }
                                });
                            match got {
                                Ok(m) => {
                                    made = Some(m.clone());
                                    held.made.insert(span.offset, m);
                                }
                                // The decoder's failure is reported as such below.
                                Err(compress::LayerError::Io { source, .. }) => {
                                    return Err(ArchiveError::ReadEntry { name, source })
                                }
                                Err(e) => unreachable!("no digest is checked here: {e}"),
                            }
                        }
                        if entry.sink.is_some() {
                            // The rest of what the sink takes (the tar reader would skip it).
                            io::copy(&mut entry, &mut io::sink()).map_err(read_err)?;
                        }
                    }
                    if let Some(sink) = sink {
                        sink.end(made.as_ref());
                    }
                    // What the formats look at: a classic layer's magic (an OCI blob's type is
                    // in its descriptor). Not every entry's: there may be a million.
                    if !name.starts_with("blobs/") {
                        held.heads.insert(span.offset, head);
                    }
                }
                if !name.is_empty() {
                    entries.insert(name, node);
                }
            }
            Ok(())
        })();
        let drained = walked.and_then(|()| {
            io::copy(&mut reader, &mut io::sink())
                .map(drop)
                .map_err(ArchiveError::Read)
        });
        match drained {
            Ok(()) => {}
            Err(e) => {
                return Err(match packed.failure() {
                    Some(d) => Ok(d),
                    None => Err(e),
                })
            }
        }
        tracing::debug!(
            entries = entries.len(),
            decompressed = reader.get_ref().1.position(),
            held_documents = held.documents.len(),
            "compressed archive indexed"
        );
        Ok(Archive {
            file: Source::Packed(packed),
            entries,
            held: Arc::new(held),
        })
    }

    /// The first `n` (at most 16) bytes of the file at `span`, fewer when it is shorter.
    pub fn head(&self, span: Span, n: usize) -> io::Result<Vec<u8>> {
        let n = n.min(span.len as usize);
        if let Some(head) = self.held.heads.get(&span.offset) {
            if head.len() >= n {
                return Ok(head[..n].to_vec());
            }
        }
        self.reader(Span {
            offset: span.offset,
            len: n as u64,
        })
        .read_block(n)
    }

    /// `(diff_id, digest, size)` of what gzip'ing the file at `span` makes, when the index
    /// pass worked it out.
    pub fn gzip_made(&self, span: Span) -> Option<(String, String, u64)> {
        self.held.made.get(&span.offset).cloned()
    }

    /// `(blob digest, diff_id)` of the gzip'ed file at `span`, when the index pass computed
    /// them.
    pub fn gzip_digests(&self, span: Span) -> Option<(String, String)> {
        self.held.gzip.get(&span.offset).cloned()
    }

    /// The JSON document at `span` when the index pass held it (a config pushed from memory,
    /// not read through the decoder again).
    pub fn held_document(&self, span: Span) -> Option<Arc<Vec<u8>>> {
        self.held
            .documents
            .get(&span.offset)
            .filter(|d| d.len() as u64 == span.len)
            .cloned()
    }

    /// True when the archive holds an entry called `name` (of any type).
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Where the bytes of `name` are, following links inside the archive.
    pub fn find(&self, name: &str) -> Result<Span, ArchiveError> {
        let mut current = normalize_name(name)?;
        for _ in 0..MAX_LINK_HOPS {
            match self.entries.get(&current) {
                None if current == name => return Err(ArchiveError::Missing(name.to_string())),
                None => {
                    return Err(ArchiveError::BadLink {
                        name: name.to_string(),
                        why: "its target is not in the archive",
                    })
                }
                Some(Node::File(span)) => return Ok(*span),
                Some(Node::Symlink(t)) | Some(Node::Hardlink(t)) => current = t.clone(),
                Some(Node::Other) => {
                    return Err(ArchiveError::BadLink {
                        name: name.to_string(),
                        why: "it is not a regular file",
                    })
                }
            }
        }
        Err(ArchiveError::BadLink {
            name: name.to_string(),
            why: "too many links in a row (a loop?)",
        })
    }

    /// Reads the whole of `name`, refusing anything over `limit` bytes (documents only).
    pub fn read(&self, name: &str, limit: u64) -> Result<Vec<u8>, ArchiveError> {
        let span = self.find(name)?;
        if span.len > limit {
            return Err(ArchiveError::TooLarge {
                name: name.to_string(),
                size: span.len,
                limit,
            });
        }
        if let Some(doc) = self.held.documents.get(&span.offset) {
            return Ok(doc.to_vec());
        }
        self.reader(span)
            .read_block(span.len as usize)
            .map_err(|source| ArchiveError::ReadEntry {
                name: name.to_string(),
                source,
            })
    }

    /// Every entry's name (fuzzing looks each one up).
    #[cfg(any(test, feature = "fuzz"))]
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Where the archive's bytes are, for positioned reads of spans.
    pub fn file(&self) -> &Source {
        &self.file
    }

    /// A reader of `span` of the archive.
    pub fn reader(&self, span: Span) -> SpanReader {
        SpanReader::new(self.file.clone(), span)
    }
}

/// Archive-relative name without `./`, duplicate or trailing slashes; refuses absolute names and
/// `..` components.
fn normalize_name(raw: &str) -> Result<String, ArchiveError> {
    if raw.starts_with('/') {
        return Err(ArchiveError::UnsafePath {
            name: raw.to_string(),
            why: "absolute path",
        });
    }
    let mut parts = Vec::new();
    for part in raw.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(ArchiveError::UnsafePath {
                    name: raw.to_string(),
                    why: "contains ..",
                })
            }
            p => parts.push(p),
        }
    }
    Ok(parts.join("/"))
}

/// A symbolic link's target, resolved against the link's directory; it must stay inside.
fn resolve_symlink_target(raw: &str, name: &str, target: &str) -> Result<String, ArchiveError> {
    if target.starts_with('/') {
        return Err(ArchiveError::UnsafePath {
            name: raw.to_string(),
            why: "link to an absolute path",
        });
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    parts.pop();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(ArchiveError::UnsafePath {
                        name: raw.to_string(),
                        why: "link leaves the archive",
                    });
                }
            }
            p => parts.push(p),
        }
    }
    Ok(parts.join("/"))
}

/// A hard link's target is archive-relative already; it may not climb out.
fn normalize_link(raw: &str, target: &str) -> Result<String, ArchiveError> {
    normalize_name(target).map_err(|_| ArchiveError::UnsafePath {
        name: raw.to_string(),
        why: "hard link to a path outside the archive",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn build(f: impl FnOnce(&mut tar::Builder<&mut Vec<u8>>)) -> tempfile::NamedTempFile {
        let mut data = Vec::new();
        {
            let mut b = tar::Builder::new(&mut data);
            f(&mut b);
            b.finish().unwrap();
        }
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&data).unwrap();
        tmp
    }

    fn file(b: &mut tar::Builder<&mut Vec<u8>>, name: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(EntryType::Regular);
        b.append_data(&mut h, name, data).unwrap();
    }

    fn link(b: &mut tar::Builder<&mut Vec<u8>>, kind: EntryType, name: &str, target: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_entry_type(kind);
        b.append_link(&mut h, name, target).unwrap();
    }

    #[test]
    fn finds_files_through_links_and_long_names() {
        let long = format!("{}/layer.tar", "d".repeat(150));
        let tmp = build(|b| {
            file(b, "./manifest.json", b"[1]");
            file(b, &long, b"layer bytes");
            link(b, EntryType::Symlink, "b/layer.tar", &format!("../{long}"));
            link(b, EntryType::Link, "c/layer.tar", "b/layer.tar");
        });
        let a = Archive::open(tmp.path()).unwrap();
        assert_eq!(a.read("manifest.json", 10).unwrap(), b"[1]");
        assert_eq!(a.read("c/layer.tar", 100).unwrap(), b"layer bytes");
        assert_eq!(a.find("b/layer.tar").unwrap(), a.find(&long).unwrap());
        assert!(matches!(
            a.read("manifest.json", 2),
            Err(ArchiveError::TooLarge { .. })
        ));
        assert!(matches!(a.find("nope"), Err(ArchiveError::Missing(_))));
    }

    /// A PAX `path` record (what Python's tarfile and Go's archive/tar write for long names)
    /// names the entry that follows it.
    #[test]
    fn pax_path_records_name_the_next_entry() {
        let long = format!("blobs/sha256/{}/{}", "a".repeat(64), "b".repeat(80));
        let body = format!(" path={long}\n");
        // The record's length counts its own digits.
        let mut len = body.len() + 1;
        while len != format!("{len}{body}").len() {
            len += 1;
        }
        let record = format!("{len}{body}");
        let mut data = Vec::new();
        let mut b = tar::Builder::new(&mut data);
        let mut h = tar::Header::new_ustar();
        h.set_size(record.len() as u64);
        h.set_entry_type(EntryType::XHeader);
        b.append_data(&mut h, "PaxHeaders/x", record.as_bytes())
            .unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_size(5);
        h.set_entry_type(EntryType::Regular);
        b.append_data(&mut h, "short", &b"hello"[..]).unwrap();
        b.finish().unwrap();
        drop(b);
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&data).unwrap();
        let a = Archive::open(tmp.path()).unwrap();
        assert_eq!(a.read(&long, 10).unwrap(), b"hello");
        assert!(!a.contains("short"));
    }

    #[test]
    fn refuses_escapes() {
        for (kind, target) in [
            (EntryType::Symlink, "../../etc/passwd"),
            (EntryType::Symlink, "/etc/passwd"),
            (EntryType::Link, "../x"),
        ] {
            let tmp = build(|b| link(b, kind, "a/l", target));
            let err = Archive::open(tmp.path()).unwrap_err();
            assert!(matches!(err, ArchiveError::UnsafePath { .. }), "{err}");
        }
        // tar::Builder refuses to write `..` names, so write the header by hand.
        let mut data = Vec::new();
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..12].copy_from_slice(b"../../etc/x\0");
        h.set_size(0);
        h.set_entry_type(EntryType::Regular);
        h.set_cksum();
        data.extend_from_slice(h.as_bytes());
        data.extend_from_slice(&[0; 1024]);
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&data).unwrap();
        let err = Archive::open(tmp.path()).unwrap_err();
        assert!(err.to_string().contains("../../etc/x"), "{err}");
    }

    proptest::proptest! {
        /// Whatever a tar names an entry or a link target, what the index keeps stays inside.
        #[test]
        fn names_and_links_never_escape(
            name in "(\\.\\.|\\.|/|[a-z]{1,3}){0,8}",
            target in "(\\.\\.|\\.|/|[a-z]{1,3}){0,8}",
        ) {
            let inside = |p: &str| !p.starts_with('/') && !p.split('/').any(|c| c == "..");
            if let Ok(n) = normalize_name(&name) {
                proptest::prop_assert!(inside(&n), "{n}");
                if let Ok(t) = resolve_symlink_target(&name, &n, &target) {
                    proptest::prop_assert!(inside(&t), "{t}");
                }
            }
            if let Ok(t) = normalize_link(&name, &target) {
                proptest::prop_assert!(inside(&t), "{t}");
            }
        }
    }

    #[test]
    fn link_loops_and_truncation() {
        let tmp = build(|b| {
            link(b, EntryType::Symlink, "a", "b");
            link(b, EntryType::Symlink, "b", "a");
            file(b, "big", &[7; 5000]);
        });
        let a = Archive::open(tmp.path()).unwrap();
        assert!(matches!(a.find("a"), Err(ArchiveError::BadLink { .. })));
        let bytes = std::fs::read(tmp.path()).unwrap();
        let cut = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(cut.path(), &bytes[..3000]).unwrap();
        let err = Archive::open(cut.path()).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}
