//! What the fuzz targets under `fuzz/` call (feature `fuzz`): the receiver's parsers of bytes
//! that come from outside (the upload itself: its tar index and format detection; the chunk
//! request's offset) and the structures those bytes drive (the range set, the journal replay).
//! Each function checks its own invariants and panics when one breaks: that is the finding.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use crate::image::archive::Archive;
use crate::image::formats::{self, DetectOptions};
use crate::upload::ranges::Ranges;
use crate::upload::state::{replay_bytes, Persisted, Phase};

/// A scratch directory of this process for the files the archive code reads and writes.
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("runr-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// `data` as a file (the archive code reads files with positioned reads).
fn as_file(data: &[u8]) -> (PathBuf, Arc<File>) {
    let path = scratch().join("input");
    let mut f = File::create(&path).expect("the scratch file");
    f.write_all(data).expect("write the scratch file");
    (
        path.clone(),
        Arc::new(File::open(&path).expect("reopen the scratch file")),
    )
}

/// The tar indexer on `data`: indexing either fails with an error or yields entries whose spans
/// lie inside the file, every name is archive-relative without `..`, and every lookup (links
/// followed) ends in a span, a missing entry or a refusal — never a panic or a loop.
pub fn tar_index(data: &[u8]) {
    let (_, file) = as_file(data);
    let Ok(archive) = Archive::index(file) else {
        return;
    };
    let names: Vec<String> = archive.names().map(str::to_string).collect();
    for name in &names {
        assert!(!name.starts_with('/'), "{name:?}");
        assert!(
            !name.split('/').any(|c| c == ".." || c.is_empty()),
            "{name:?}"
        );
        if let Ok(span) = archive.find(name) {
            assert!(
                span.offset.saturating_add(span.len) <= data.len() as u64,
                "{name:?}: {span:?} past {} bytes",
                data.len()
            );
            if span.len <= 1 << 16 {
                let bytes = archive
                    .read(name, 1 << 16)
                    .expect("a span inside the file reads");
                let at = span.offset as usize;
                assert_eq!(&bytes[..], &data[at..at + span.len as usize], "{name:?}");
            }
        }
    }
}

/// Format detection on `data` as an upload, a whole compressed one read through its decoder
/// up to 1 MiB decompressed (a bomb stops there instead of at 64 times its size): an answer or
/// an error, never a panic; nothing is left in the work directory whatever happens.
pub fn detect(data: &[u8], upload_name: Option<&str>) {
    let (path, _) = as_file(data);
    let work = scratch().join("work");
    std::fs::create_dir_all(&work).expect("the work directory");
    let opts = DetectOptions {
        upload_name,
        expansion_limit: |_| 1 << 20,
        gzip_layers: true,
    };
    let _ = formats::detect(&path, &opts);
    let left = std::fs::read_dir(&work)
        .expect("the work directory")
        .count();
    assert_eq!(left, 0, "detection left files in the work directory");
}

/// `PUT /chunk?<query>`'s offset: `Some(n)` exactly when the first `offset=` pair's value is a
/// plain decimal number that fits a u64, and then `n` is that number.
pub fn chunk_offset(query: &str) {
    let got = crate::upload::server::parse_offset(Some(query));
    let value = query.split('&').find_map(|p| p.strip_prefix("offset="));
    match (got, value) {
        (Some(n), Some(v)) => {
            assert!(v.bytes().all(|b| b.is_ascii_digit()), "{query:?}");
            assert_eq!(
                v.trim_start_matches('0').parse::<u64>().unwrap_or(0),
                n,
                "{query:?}"
            );
        }
        (None, Some(v)) => assert!(
            v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) || v.parse::<u64>().is_err(),
            "{query:?} was refused"
        ),
        (Some(_), None) => panic!("{query:?} has no offset"),
        (None, None) => {}
    }
}

/// The range set driven by `ops` (3 bytes each: kind, start, length over a 256-byte file)
/// against a bitmap: the same bytes held after every step, counters and gaps that agree, the
/// invariants (sorted, disjoint, non-adjacent) kept, and its state-file form read back equal.
pub fn range_set(ops: &[u8]) {
    let mut ranges = Ranges::new();
    let mut bits = [false; 512];
    for op in ops.chunks_exact(3) {
        let (start, end) = (u64::from(op[1]), u64::from(op[1]) + u64::from(op[2]));
        match op[0] % 3 {
            0 | 1 => {
                ranges.insert(start, end);
                bits[start as usize..end as usize].fill(true);
            }
            _ => {
                ranges.remove(start, end);
                bits[start as usize..end as usize].fill(false);
            }
        }
        let spans = ranges.spans();
        assert!(spans.iter().all(|&(s, e)| s < e), "{spans:?}");
        assert!(spans.windows(2).all(|w| w[0].1 < w[1].0), "{spans:?}");
        let prefix = bits.iter().take_while(|&&b| b).count() as u64;
        assert_eq!(ranges.contiguous_prefix(), prefix);
        assert_eq!(ranges.total(), bits.iter().filter(|&&b| b).count() as u64);
        let gaps = ranges.gaps(start, end);
        let gap_bytes: u64 = gaps.iter().map(|&(s, e)| e - s).sum();
        let unset = bits[start as usize..end as usize]
            .iter()
            .filter(|&&b| !b)
            .count();
        assert_eq!(gap_bytes, unset as u64, "gaps of {start}..{end}: {gaps:?}");
        for &(s, e) in &gaps {
            assert!(bits[s as usize..e as usize].iter().all(|&b| !b), "{s}..{e}");
        }
    }
    let json = serde_json::to_string(&ranges).expect("ranges serialize");
    let back: Ranges = serde_json::from_str(&json).expect("the state-file form reads back");
    assert_eq!(back, ranges);
    // Whatever a damaged state file says, only a valid set is accepted.
    if let Ok(pairs) = serde_json::from_slice::<Vec<(u64, u64)>>(ops) {
        if let Ok(r) = Ranges::try_from(pairs) {
            assert!(r.spans().windows(2).all(|w| w[0].1 < w[1].0));
        }
    }
}

/// Journal replay of arbitrary bytes after a valid header: never a panic, and what it adds are
/// ranges inside the declared size, applied only from whole, intact records.
pub fn journal_replay(body: &[u8]) {
    let size = 1 << 20;
    let mut state = Persisted {
        size,
        sha256: String::new(),
        phase: Phase::Open,
        ranges: Ranges::new(),
        message: None,
        image: None,
        journal: 3,
    };
    let mut bytes = b"runrjnl1".to_vec();
    bytes.extend_from_slice(&3u64.to_le_bytes());
    bytes.extend_from_slice(body);
    let (_, end) = replay_bytes(&bytes, &mut state);
    assert!(end <= bytes.len() && end >= 16);
    assert!(state.ranges.spans().iter().all(|&(_, e)| e <= size));
    // Replaying the part it accepted gives the same state: the rest was ignored whole.
    let mut again = Persisted {
        ranges: Ranges::new(),
        ..state.clone()
    };
    replay_bytes(&bytes[..end], &mut again);
    assert_eq!(again.ranges, state.ranges);
}

#[cfg(test)]
mod tests {
    /// The committed seeds of every target (fuzz/corpus/<target>/seed-*), through the same
    /// entry points the targets call: the normal suite runs what the fuzzer starts from.
    #[test]
    fn seeds_of_every_target() {
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
        let mut ran = 0;
        for (target, run) in [
            (
                "receiver_tar_index",
                &(|d: &[u8]| super::tar_index(d)) as &dyn Fn(&[u8]),
            ),
            ("receiver_detect", &|d: &[u8]| {
                super::detect(d, None);
                super::detect(d, Some("corpus/app:v1"));
            }),
            ("receiver_chunk_offset", &|d: &[u8]| {
                super::chunk_offset(&String::from_utf8_lossy(d))
            }),
            ("receiver_range_set", &|d: &[u8]| super::range_set(d)),
            ("receiver_journal_replay", &|d: &[u8]| {
                super::journal_replay(d)
            }),
        ] {
            let dir = corpus.join(target);
            let seeds: Vec<_> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .map(|e| e.unwrap().path())
                .filter(|p| {
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with("seed-")
                })
                .collect();
            assert!(!seeds.is_empty(), "no seeds for {target}");
            for seed in seeds {
                run(&std::fs::read(&seed).unwrap());
                ran += 1;
            }
        }
        assert!(ran >= 10, "{ran} seeds");
    }
}
