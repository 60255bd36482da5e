//! Where the upload is in its life: what `GET /status` (and every chunk and complete answer)
//! says, and what the upload directory keeps of it across restarts ([`Store`]).
//!
//! Two files. The snapshot ([`STATE_FILE`]) is JSON with the declared size and digest, the byte
//! ranges held, the phase (`open`, `verifying`, `pushing`, `completed`, `failed`) with its
//! message and image, and the epoch of the journal that goes with it; it is replaced whole by
//! rename, so a reader never sees half of one. The journal ([`JOURNAL_FILE`]) holds what chunks
//! added since: one appended record per chunk, so recording a chunk costs one small write
//! whatever the number of ranges, where rewriting the snapshot costs all of them.
//!
//! - Journal: a 16-byte header (magic, epoch), then records `[len u32][crc32 u32][payload]`,
//!   little endian, the payload a count and that many `(start, end)` pairs of u64. Replayed at
//!   start onto the snapshot of the same epoch. A record cut short or damaged (a write the
//!   process did not finish, a disk that filled up) fails its length or CRC check and ends the
//!   replay there: it, and anything after it, is ignored, never misread.
//! - Compaction: a new snapshot with the next epoch, then a fresh journal of that epoch (written
//!   aside, then renamed). A crash between the two leaves a journal of the old epoch, which the
//!   snapshot already contains and which is therefore ignored. It happens at every phase change,
//!   at start, and once the journal holds as many records as the snapshot has ranges (at least
//!   [`COMPACT_AFTER`]), which keeps recording O(1) amortised.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ranges::Ranges;

/// The ranges held and the upload's state, inside the upload directory.
pub const STATE_FILE: &str = "upload.state.json";
/// Written then renamed over [`STATE_FILE`].
const STATE_TMP: &str = "upload.state.json.tmp";
/// The records of chunks recorded since the snapshot, inside the upload directory.
pub const JOURNAL_FILE: &str = "upload.journal";
/// Written then renamed over [`JOURNAL_FILE`].
const JOURNAL_TMP: &str = "upload.journal.tmp";
/// The journal's first 8 bytes; the epoch follows.
const JOURNAL_MAGIC: &[u8; 8] = b"runrjnl1";
/// The journal is compacted once it holds this many records (or as many as the snapshot has
/// ranges, if more).
pub(crate) const COMPACT_AFTER: u64 = 4096;
/// A chunk that wrote more pieces than this is recorded by a new snapshot instead of a record
/// (bounds a record, and the memory replaying one takes).
const MAX_RECORD_PIECES: usize = 4096;

/// Where the upload is in its life, as the control plane reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Waiting for chunks; nothing held (also after a digest mismatch reopened the upload).
    Ready,
    /// Some chunks are held.
    Receiving,
    /// `complete` was accepted: size and SHA-256 are being checked.
    Verifying,
    /// Verified: the format is being detected and the image pushed.
    Pushing,
    /// Pushed and read back; `image` says what.
    Completed,
    /// The file could not be turned into an image; `message` says why. Final.
    Failed,
}

impl State {
    /// The name `GET /status` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Ready => "ready",
            State::Receiving => "receiving",
            State::Verifying => "verifying",
            State::Pushing => "pushing",
            State::Completed => "completed",
            State::Failed => "failed",
        }
    }

    /// True while chunks are accepted.
    pub fn is_open(self) -> bool {
        matches!(self, State::Ready | State::Receiving)
    }
}

/// The body of `GET /status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// Where the upload is.
    pub status: State,
    /// The declared size in bytes.
    pub size: u64,
    /// Bytes from 0 without a gap: where a client goes on after a broken connection.
    pub uploaded_bytes: u64,
    /// Every distinct byte held.
    pub received_bytes: u64,
    /// What the user should know: progress of the work, a digest mismatch, why it failed.
    pub message: Option<String>,
    /// What was pushed, once `completed` (the pipeline's `ImageInfo`).
    pub image: Option<serde_json::Value>,
    /// How far the push of this run has come: blobs and bytes the registry has of those known so
    /// far. Absent before the push starts, so every answer before it is what it always was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<crate::progress::PushProgress>,
}

/// Where the upload is, as persisted (ready and receiving are both `open`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Phase {
    Open,
    Verifying,
    Pushing,
    Completed,
    Failed,
}

/// The state file's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Persisted {
    pub(crate) size: u64,
    pub(crate) sha256: String,
    pub(crate) phase: Phase,
    pub(crate) ranges: Ranges,
    pub(crate) message: Option<String>,
    pub(crate) image: Option<serde_json::Value>,
    /// The epoch of the journal that continues this snapshot (0 in files of receivers that
    /// had no journal).
    #[serde(default)]
    pub(crate) journal: u64,
}

/// The state file's content, when it belongs to this upload.
pub(crate) fn read_state(path: &Path, size: u64, sha256: &str) -> Option<Persisted> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the state file: starting over");
            return None;
        }
    };
    match serde_json::from_slice::<Persisted>(&bytes) {
        Ok(p) if p.size == size && p.sha256 == sha256 => Some(p),
        Ok(p) => {
            tracing::warn!(
                old_size = p.size,
                old_sha256 = %p.sha256,
                "the upload directory holds another upload: starting over"
            );
            None
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the state file is damaged: starting over");
            None
        }
    }
}

/// Replaces the state file in `dir` with `state`.
pub(crate) fn write_state(dir: &Path, state: &Persisted) -> io::Result<()> {
    let json = serde_json::to_vec(state)?;
    let tmp = dir.join(STATE_TMP);
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, dir.join(STATE_FILE))
}

// === impl Store ===

/// The snapshot and journal of one upload directory; all writes of the state go through it.
#[derive(Debug)]
pub(crate) struct Store {
    dir: PathBuf,
    /// The epoch of the current snapshot and journal.
    epoch: u64,
    /// The journal, open for appending; `None` until the first snapshot.
    journal: Option<File>,
    /// Records appended since the last snapshot.
    records: u64,
}

impl Store {
    /// The state kept in `dir` for the upload of `size` bytes with digest `sha256` (the
    /// snapshot with its journal replayed), and the store to go on with. `None` when there is
    /// none, it belongs to another upload, or it cannot be read: the upload starts over.
    pub(crate) fn load(dir: &Path, size: u64, sha256: &str) -> (Option<Persisted>, Store) {
        let mut state = read_state(&dir.join(STATE_FILE), size, sha256);
        let journal = dir.join(JOURNAL_FILE);
        // The next epoch must be new to the journal too: a journal left by another upload (or
        // by a compaction cut short) must never pass for the one of the next snapshot.
        let epoch = state
            .as_ref()
            .map_or(0, |s| s.journal)
            .max(journal_epoch(&journal));
        if let Some(s) = &mut state {
            replay(&journal, s);
        }
        let store = Store {
            dir: dir.to_path_buf(),
            epoch,
            journal: None,
            records: 0,
        };
        (state, store)
    }

    /// Records the pieces a chunk wrote, before the chunk is answered. `spans` is the number of
    /// ranges now held. Returns true when a snapshot is due instead ([`Store::snapshot`]): the
    /// record was not written (too many pieces, or no journal yet) or the journal is long.
    pub(crate) fn append(&mut self, pieces: &[(u64, u64)], spans: usize) -> io::Result<bool> {
        if pieces.is_empty() {
            return Ok(false);
        }
        let Some(journal) = &mut self.journal else {
            return Ok(true);
        };
        if pieces.len() > MAX_RECORD_PIECES {
            return Ok(true);
        }
        journal.write_all(&encode_record(pieces))?;
        self.records += 1;
        Ok(self.records >= COMPACT_AFTER.max(spans as u64))
    }

    /// Compaction: replaces the snapshot with `state` (under the next epoch) and starts an empty
    /// journal of that epoch.
    pub(crate) fn snapshot(&mut self, state: &Persisted) -> io::Result<()> {
        let epoch = self.epoch + 1;
        let mut with_epoch = state.clone();
        with_epoch.journal = epoch;
        write_state(&self.dir, &with_epoch)?;
        // The snapshot holds everything now: until the rename below, the old journal stays
        // and is ignored (its epoch is the old one).
        self.epoch = epoch;
        self.journal = None;
        let tmp = self.dir.join(JOURNAL_TMP);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&tmp)?;
        let mut header = JOURNAL_MAGIC.to_vec();
        header.extend_from_slice(&epoch.to_le_bytes());
        file.write_all(&header)?;
        std::fs::rename(&tmp, self.dir.join(JOURNAL_FILE))?;
        // Appends go to the end whatever the file offset (one handle, one writer at a time).
        drop(file);
        self.journal = Some(
            std::fs::OpenOptions::new()
                .append(true)
                .open(self.dir.join(JOURNAL_FILE))?,
        );
        self.records = 0;
        Ok(())
    }
}

/// The epoch in the header of the journal at `path`; 0 when there is none.
fn journal_epoch(path: &Path) -> u64 {
    let mut header = [0u8; 16];
    match File::open(path).and_then(|mut f| f.read_exact(&mut header)) {
        Ok(()) if header[..8] == *JOURNAL_MAGIC => {
            u64::from_le_bytes(header[8..].try_into().expect("8 bytes"))
        }
        _ => 0,
    }
}

/// One journal record: `[len][crc32][count, (start, end)…]`.
fn encode_record(pieces: &[(u64, u64)]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(4 + pieces.len() * 16);
    payload.extend_from_slice(&(pieces.len() as u32).to_le_bytes());
    for &(s, e) in pieces {
        payload.extend_from_slice(&s.to_le_bytes());
        payload.extend_from_slice(&e.to_le_bytes());
    }
    let mut crc = flate2::Crc::new();
    crc.update(&payload);
    let mut record = Vec::with_capacity(8 + payload.len());
    record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    record.extend_from_slice(&crc.sum().to_le_bytes());
    record.extend_from_slice(&payload);
    record
}

/// Applies the records of the journal at `path` to `state` when the journal continues it (same
/// epoch), up to the first record that is cut short or damaged.
fn replay(path: &Path, state: &mut Persisted) {
    let mut bytes = Vec::new();
    match File::open(path).and_then(|mut f| f.read_to_end(&mut bytes)) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the journal: using the snapshot alone");
            return;
        }
    }
    let (applied, end) = replay_bytes(&bytes, state);
    if end < bytes.len() {
        tracing::warn!(
            path = %path.display(),
            records = applied,
            offset = end,
            ignored_bytes = bytes.len() - end,
            "the journal ends in a record cut short or damaged: ignored from there"
        );
    }
}

/// [`replay`] on the journal's bytes: the number of records applied and the offset where the
/// replay stopped (the length of `bytes` when every record was whole).
pub(crate) fn replay_bytes(bytes: &[u8], state: &mut Persisted) -> (usize, usize) {
    let mut epoch = JOURNAL_MAGIC.to_vec();
    epoch.extend_from_slice(&state.journal.to_le_bytes());
    // Another epoch's journal (the snapshot already holds it), or none of ours.
    if state.journal == 0 || !bytes.starts_with(&epoch) {
        return (0, bytes.len());
    }
    let mut pos = epoch.len();
    let mut applied = 0;
    while let Some((pieces, next)) = decode_record(bytes, pos, state.size) {
        for (s, e) in pieces {
            state.ranges.insert(s, e);
        }
        applied += 1;
        pos = next;
    }
    (applied, pos)
}

/// The record at `pos` and where the next one starts, when it is whole and intact and names
/// ranges inside the file.
fn decode_record(bytes: &[u8], pos: usize, size: u64) -> Option<(Vec<(u64, u64)>, usize)> {
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let len = u32_at(pos)? as usize;
    let crc = u32_at(pos + 4)?;
    let payload = bytes.get(pos + 8..(pos + 8).checked_add(len)?)?;
    let mut actual = flate2::Crc::new();
    actual.update(payload);
    if actual.sum() != crc {
        return None;
    }
    let count = u32::from_le_bytes(payload.get(..4)?.try_into().ok()?) as usize;
    if count > MAX_RECORD_PIECES || payload.len() != 4 + count * 16 {
        return None;
    }
    let mut pieces = Vec::with_capacity(count);
    for pair in payload[4..].chunks_exact(16) {
        let s = u64::from_le_bytes(pair[..8].try_into().ok()?);
        let e = u64::from_le_bytes(pair[8..].try_into().ok()?);
        if s >= e || e > size {
            return None;
        }
        pieces.push((s, e));
    }
    Some((pieces, pos + 8 + len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SIZE: u64 = 1 << 16;
    const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn empty() -> Persisted {
        Persisted {
            size: SIZE,
            sha256: SHA.into(),
            phase: Phase::Open,
            ranges: Ranges::new(),
            message: None,
            image: None,
            journal: 0,
        }
    }

    /// What a restart finds in `dir`, without the epoch (which differs by construction).
    fn loaded(dir: &Path) -> (Persisted, Store) {
        let (state, store) = Store::load(dir, SIZE, SHA);
        let mut state = state.expect("a state for this upload");
        state.journal = 0;
        (state, store)
    }

    fn journal_len(dir: &Path) -> usize {
        std::fs::metadata(dir.join(JOURNAL_FILE)).unwrap().len() as usize
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A chunk recorded with these pieces.
        Chunk(Vec<(u64, u64)>),
        /// A phase change or a due compaction.
        Snapshot,
        /// kill -9 and start again.
        Restart,
        /// kill -9 while the last record was being written: only its first bytes (or, with
        /// `flip`, all of it with one byte wrong) reached the file.
        Torn { keep: usize, flip: bool },
    }

    fn op() -> impl Strategy<Value = Op> {
        let piece = (0..SIZE - 1, 1u64..300).prop_map(|(s, l)| (s, (s + l).min(SIZE)));
        prop_oneof![
            6 => prop::collection::vec(piece, 1..5).prop_map(Op::Chunk),
            1 => Just(Op::Snapshot),
            1 => Just(Op::Restart),
            1 => (0usize..80, any::<bool>()).prop_map(|(keep, flip)| Op::Torn { keep, flip }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Differential: whatever chunks, compactions and kills happen, what a restart replays
        /// from snapshot + journal equals the state file rewritten whole after every chunk (the
        /// way the receiver kept it before the journal); a record torn by a kill is dropped
        /// whole, and only it.
        #[test]
        fn journal_replay_equals_the_full_state_it_replaces(ops in prop::collection::vec(op(), 1..50)) {
            let journal = tempfile::tempdir().unwrap();
            let full = tempfile::tempdir().unwrap();
            let (none, mut store) = Store::load(journal.path(), SIZE, SHA);
            prop_assert!(none.is_none());
            let mut model = empty();
            store.snapshot(&model).unwrap();
            write_state(full.path(), &model).unwrap();
            for op in ops {
                match op {
                    Op::Chunk(pieces) => {
                        let mut added = Ranges::new();
                        for &(s, e) in &pieces {
                            model.ranges.insert(s, e);
                            added.insert(s, e);
                        }
                        // Pieces a chunk writes are disjoint: claims never overlap.
                        let pieces = added.spans().to_vec();
                        if store.append(&pieces, model.ranges.spans().len()).unwrap() {
                            store.snapshot(&model).unwrap();
                        }
                        write_state(full.path(), &model).unwrap();
                    }
                    Op::Snapshot => store.snapshot(&model).unwrap(),
                    Op::Restart => {
                        drop(store);
                        let (state, s) = loaded(journal.path());
                        let reference = read_state(&full.path().join(STATE_FILE), SIZE, SHA).unwrap();
                        prop_assert_eq!(&state.ranges, &reference.ranges);
                        prop_assert_eq!(&state, &model);
                        store = s;
                        store.snapshot(&state).unwrap();
                    }
                    Op::Torn { keep, flip } => {
                        // One more chunk whose record the kill cut.
                        let before = journal_len(journal.path());
                        let piece = (SIZE - 1 - (keep as u64 % 1000), SIZE);
                        let record = encode_record(&[piece]);
                        let mut bytes = std::fs::read(journal.path().join(JOURNAL_FILE)).unwrap();
                        prop_assert_eq!(bytes.len(), before);
                        if flip {
                            let mut damaged = record.clone();
                            let at = keep % damaged.len();
                            damaged[at] ^= 0x20;
                            bytes.extend_from_slice(&damaged);
                        } else {
                            bytes.extend_from_slice(&record[..keep % record.len()]);
                        }
                        std::fs::write(journal.path().join(JOURNAL_FILE), &bytes).unwrap();
                        drop(store);
                        let (state, s) = loaded(journal.path());
                        // Nothing of the torn record, everything before it.
                        prop_assert_eq!(&state, &model);
                        store = s;
                        store.snapshot(&state).unwrap();
                    }
                }
            }
        }
    }

    /// A journal another upload left (its snapshot replaced, the compaction cut before its
    /// journal was) never continues this upload's snapshot, even at the same epoch number.
    #[test]
    fn a_journal_left_by_another_upload_is_never_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let (_, mut other) = Store::load(dir.path(), SIZE + 1, SHA);
        let mut theirs = empty();
        theirs.size = SIZE + 1;
        other.snapshot(&theirs).unwrap();
        assert!(!other.append(&[(0, 100)], 1).unwrap());
        let left = std::fs::read(dir.path().join(JOURNAL_FILE)).unwrap();
        drop(other);
        // This upload starts; its first snapshot lands, then the kill comes before its journal.
        let (none, mut store) = Store::load(dir.path(), SIZE, SHA);
        assert!(none.is_none());
        store.snapshot(&empty()).unwrap();
        std::fs::write(dir.path().join(JOURNAL_FILE), &left).unwrap();
        let (state, _) = loaded(dir.path());
        assert!(state.ranges.is_empty(), "{:?}", state.ranges);
    }

    #[test]
    fn records_round_trip_and_refuse_what_is_not_ours() {
        let mut state = empty();
        state.journal = 7;
        let mut bytes = JOURNAL_MAGIC.to_vec();
        bytes.extend_from_slice(&7u64.to_le_bytes());
        bytes.extend(encode_record(&[(0, 10), (20, 30)]));
        bytes.extend(encode_record(&[(40, 41)]));
        let whole = bytes.len();
        let mut s = state.clone();
        assert_eq!(replay_bytes(&bytes, &mut s), (2, whole));
        assert_eq!(s.ranges.spans(), &[(0, 10), (20, 30), (40, 41)]);
        // Another epoch: the snapshot already holds it.
        let mut other = state.clone();
        other.journal = 8;
        assert_eq!(replay_bytes(&bytes, &mut other).0, 0);
        assert!(other.ranges.is_empty());
        // A record naming bytes past the declared size is damage, not a range.
        let mut past = bytes.clone();
        past.extend(encode_record(&[(SIZE - 1, SIZE + 1)]));
        let mut s = state.clone();
        assert_eq!(replay_bytes(&past, &mut s), (2, whole));
        // Too many pieces for one record: a snapshot instead, nothing written.
        let dir = tempfile::tempdir().unwrap();
        let (_, mut store) = Store::load(dir.path(), SIZE, SHA);
        assert!(
            store.append(&[(0, 1)], 1).unwrap(),
            "no journal before the first snapshot"
        );
        store.snapshot(&empty()).unwrap();
        let header = journal_len(dir.path());
        let many: Vec<(u64, u64)> = (0..MAX_RECORD_PIECES as u64 + 1)
            .map(|i| (2 * i, 2 * i + 1))
            .collect();
        assert!(store.append(&many, 1).unwrap());
        assert_eq!(journal_len(dir.path()), header);
        assert!(!store.append(&many[..10], 10).unwrap());
        assert_eq!(journal_len(dir.path()), header + 8 + 4 + 160);
    }
}
