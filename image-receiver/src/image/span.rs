//! The one reader over a span of a file: a blob, layer or document inside the archive, or the
//! whole upload. Every byte the image half reads from the archive goes through [`SpanReader`].
//!
//! Reads are positioned (`pread`): any number of readers share one open file without a seek
//! position between them, and none reads past the end of its span. A reader can hash what it
//! reads, so a blob is checked against its digest in the same pass that pushes it.
//!
//! What is read is a [`Source`]: the upload's file, or the tar inside a whole compressed upload
//! ([`Packed`]), read through its decoder without a decompressed copy anywhere.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use runr_registry::Sha256Hasher;

use crate::image::compress::Packed;

/// Where an archive's bytes come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A file on disk: positioned reads, any order, any number at once.
    File(Arc<File>),
    /// The tar inside a whole compressed file: cheap when read in order (one decoder moving
    /// forward), correct in any order (reading behind the decoder starts a new one).
    Packed(Arc<Packed>),
}

impl From<Arc<File>> for Source {
    fn from(file: Arc<File>) -> Source {
        Source::File(file)
    }
}

impl Source {
    /// Reads up to `buf.len()` bytes at `pos`; 0 at the end.
    pub fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        match self {
            Source::File(f) => f.read_at(buf, pos),
            Source::Packed(p) => p.read_at(buf, pos),
        }
    }

    /// Fills `buf` from `pos`; an end before it is full is [`io::ErrorKind::UnexpectedEof`].
    pub fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        match self {
            Source::File(f) => f.read_exact_at(buf, pos),
            Source::Packed(p) => {
                let mut done = 0;
                while done < buf.len() {
                    let n = p.read_at(&mut buf[done..], pos + done as u64)?;
                    if n == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    done += n;
                }
                Ok(())
            }
        }
    }

    /// True for the tar inside a compressed file: its reads are best made in order, one blob
    /// at a time.
    pub fn is_packed(&self) -> bool {
        matches!(self, Source::Packed(_))
    }
}

/// How much [`SpanReader::consume`] reads at a time.
const CONSUME_BLOCK: usize = 1 << 20;

/// Where one file's bytes are in the archive (or in the upload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Offset of the first byte in the file.
    pub offset: u64,
    /// Number of bytes.
    pub len: u64,
}

impl Span {
    /// All of a file of `len` bytes.
    pub fn whole(len: u64) -> Span {
        Span { offset: 0, len }
    }
}

/// Reads one span of a shared file from its start to its end, in order.
pub struct SpanReader {
    file: Source,
    pos: u64,
    end: u64,
    /// SHA-256 of what was read so far, when asked for.
    hasher: Option<Sha256Hasher>,
}

impl SpanReader {
    /// A reader of `span` of `file`.
    pub fn new(file: impl Into<Source>, span: Span) -> SpanReader {
        SpanReader {
            file: file.into(),
            pos: span.offset,
            end: span.offset.saturating_add(span.len),
            hasher: None,
        }
    }

    /// A reader of `span` of `file` that hashes what it reads ([`SpanReader::digest`]).
    pub fn hashing(file: impl Into<Source>, span: Span) -> SpanReader {
        SpanReader {
            hasher: Some(Sha256Hasher::new()),
            ..SpanReader::new(file, span)
        }
    }

    /// Offset in the file of the next byte to read.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Bytes of the span not read yet.
    pub fn remaining(&self) -> u64 {
        self.end - self.pos
    }

    /// The next `max` bytes of the span (fewer at its end), all of them: a file that ends
    /// before its span does is an [`io::ErrorKind::UnexpectedEof`] error.
    pub fn read_block(&mut self, max: usize) -> io::Result<Vec<u8>> {
        let n = usize::try_from(self.remaining()).map_or(max, |r| r.min(max));
        let mut buf = vec![0u8; n];
        self.file.read_exact_at(&mut buf, self.pos)?;
        self.advance(&buf);
        Ok(buf)
    }

    /// Fills `buf` with the next `buf.len()` bytes of the span (at most what remains): a file
    /// that ends before its span does is an [`io::ErrorKind::UnexpectedEof`] error.
    pub fn fill(&mut self, buf: &mut [u8]) -> io::Result<()> {
        if buf.len() as u64 > self.remaining() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "more than the span holds",
            ));
        }
        self.file.read_exact_at(buf, self.pos)?;
        self.advance(buf);
        Ok(())
    }

    /// Reads (and hashes) the rest of the span, discarding it.
    pub fn consume(&mut self) -> io::Result<()> {
        let mut buf = vec![0u8; CONSUME_BLOCK];
        loop {
            let n = self.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
        }
    }

    /// `sha256:…` of every byte read so far; `None` for a reader made without hashing.
    pub fn digest(&self) -> Option<String> {
        self.hasher.clone().map(Sha256Hasher::finish)
    }

    fn advance(&mut self, read: &[u8]) {
        if let Some(h) = &mut self.hasher {
            h.update(read);
        }
        self.pos += read.len() as u64;
    }
}

impl Read for SpanReader {
    /// Ends (`Ok(0)`) at the end of the span, or earlier where the file ends.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = usize::try_from(self.remaining()).map_or(buf.len(), |r| r.min(buf.len()));
        if n == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..n], self.pos)?;
        self.advance(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runr_base::fmt::hex;
    use sha2::{Digest as _, Sha256};
    use std::io::Write as _;

    fn file(data: &[u8]) -> Arc<File> {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(data).unwrap();
        Arc::new(f)
    }

    fn sha(data: &[u8]) -> String {
        format!("sha256:{}", hex(&Sha256::digest(data)))
    }

    #[test]
    fn reads_stay_inside_the_span_and_hash_what_they_read() {
        let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let f = file(&data);
        let span = Span {
            offset: 1000,
            len: 5000,
        };
        let mut r = SpanReader::hashing(f.clone(), span);
        assert_eq!(r.read_block(3000).unwrap(), &data[1000..4000]);
        assert_eq!(r.remaining(), 2000);
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, &data[4000..6000]);
        assert_eq!(r.read_block(10).unwrap(), Vec::<u8>::new());
        assert_eq!(r.digest().unwrap(), sha(&data[1000..6000]));

        let mut r = SpanReader::hashing(f.clone(), span);
        r.read_block(7).unwrap();
        r.consume().unwrap();
        assert_eq!(r.digest().unwrap(), sha(&data[1000..6000]));
        assert_eq!(SpanReader::new(f, span).digest(), None);
    }

    #[test]
    fn a_span_past_the_end_of_the_file() {
        let f = file(b"0123456789");
        let span = Span { offset: 6, len: 10 };
        let err = SpanReader::new(f.clone(), span).read_block(10).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        // Read whole, it just ends where the file does.
        let mut out = Vec::new();
        SpanReader::new(f.clone(), span)
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, b"6789");
        let mut empty = SpanReader::hashing(f, Span::whole(0));
        assert_eq!(empty.read_block(4).unwrap(), Vec::<u8>::new());
        assert_eq!(empty.digest().unwrap(), sha(b""));
    }

    proptest::proptest! {
        /// Whatever the span and the block sizes, the reader yields exactly the span's bytes
        /// (cut where the file ends) and their digest.
        #[test]
        fn agrees_with_slicing(
            len in 0usize..3000,
            offset in 0u64..3500,
            span_len in 0u64..3500,
            blocks in proptest::collection::vec(1usize..700, 1..12),
        ) {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let f = file(&data);
            let span = Span { offset, len: span_len };
            let start = (offset as usize).min(len);
            let end = ((offset + span_len) as usize).min(len);
            let want = &data[start..end];
            let mut r = SpanReader::hashing(f, span);
            let mut got = Vec::new();
            for b in blocks.iter().cycle().take(64) {
                let mut buf = vec![0u8; *b];
                let n = r.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            proptest::prop_assert_eq!(&want[..got.len()], &got[..]);
            r.consume().unwrap();
            proptest::prop_assert_eq!(r.digest().unwrap(), sha(want));
            let mut rest = Vec::new();
            r.read_to_end(&mut rest).unwrap();
            proptest::prop_assert!(rest.is_empty());
        }
    }
}
