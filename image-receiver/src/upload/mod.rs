//! The upload on disk and its life cycle: chunks written at their offsets into one data file,
//! the merged ranges kept in a snapshot and a journal next to it, the SHA-256 computed as the
//! contiguous prefix grows (and the prefix published, [`Prefix`], for the image half's follower),
//! and the background work of `complete` (verify, then process).
//!
//! Files, all in `RUNR_UPLOAD_DIR` and nowhere else:
//! - [`DATA_FILE`]: the upload itself, written with `pwrite` at each chunk's offset;
//! - `upload.state.json` and `upload.journal`: the byte ranges held and the state ([`state`]):
//!   a snapshot, and one record appended per chunk since.
//!
//! Modules: [`ranges`] (the merged byte ranges), [`state`] (what `GET /status` says, the
//! snapshot and the journal), [`hasher`] (the running SHA-256), [`server`] (the HTTP API).
//!
//! Crash safety: a range enters the journal only after `pwrite` returned for every byte of it,
//! and before the chunk is answered; a record cut short is detected by its length and CRC and
//! ignored, and the snapshot is replaced by rename, so neither ever claims bytes that are not in
//! the data file. Both live in the page cache, which outlives the process: a receiver killed with
//! SIGKILL (a container restart inside the pod, where the emptyDir survives) finds exactly what
//! it answered. No fsync: it would halve ingest on this disk and only protects against a
//! kernel crash, after which Kubernetes gives the pod a new emptyDir anyway.
//!
//! Bytes once held never change: a chunk writes only the parts of its range that are neither
//! held nor being written by another chunk (claimed). That is what lets the digest be computed
//! while chunks still arrive, and lets `complete` close the upload without waiting for chunks
//! that are still in flight (once every byte is held, they have nothing left to write).

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use self::hasher::Hasher;
use self::ranges::Ranges;
use self::state::{Persisted, Phase, State, Status, Store, STATE_FILE};
use crate::prefix::Prefix;
use crate::progress::Progress;

pub(crate) mod hasher;
pub(crate) mod ranges;
pub(crate) mod server;
pub(crate) mod state;

/// The uploaded file, inside the upload directory.
pub const DATA_FILE: &str = "upload.data";

/// Writes up to this size go to the page cache from the request's own task: one small `pwrite`
/// costs less than the hop to a blocking thread and back (most of a one-byte chunk's time).
const INLINE_WRITE: usize = 64 * 1024;

/// Largest chunk accepted (`413` above).
pub const MAX_CHUNK: u64 = 16 * 1024 * 1024;

/// What happens to the verified file: detect, push, read back (the pipeline in production, a
/// closure in unit tests). `Ok` is the status's `image`, `Err` its `message`.
pub type Processor = Arc<
    dyn Fn(PathBuf) -> Pin<Box<dyn Future<Output = Result<serde_json::Value, String>> + Send>>
        + Send
        + Sync,
>;

/// Why a chunk was refused or could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    /// The upload is being verified or pushed, or is finished.
    #[error("the upload is {}: no more chunks are accepted", .0.as_str())]
    Closed(State),
    /// The chunk reaches past the declared size.
    #[error(
        "the chunk at offset {offset} with {len} bytes ends past the declared size of {size} bytes"
    )]
    OutOfRange {
        /// Offset of the chunk.
        offset: u64,
        /// Its length (so far, for a chunk without Content-Length).
        len: u64,
        /// The declared size.
        size: u64,
    },
    /// The chunk is larger than [`MAX_CHUNK`].
    #[error("a chunk may hold at most {MAX_CHUNK} bytes (16 MiB); this one has {0} or more")]
    TooLarge(u64),
    /// A digest mismatch reopened the upload while this chunk was arriving.
    #[error("the upload was reopened while this chunk arrived; send it again")]
    Reopened,
    /// Writing the data file failed.
    #[error("cannot write {path}")]
    Write {
        /// The data file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Why the upload directory could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The data file could not be opened or created.
    #[error("cannot open {path}")]
    DataFile {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The hashing thread could not be started.
    #[error("cannot start the hashing thread")]
    Thread(#[source] io::Error),
    /// The state file could not be written.
    #[error("cannot write {path}")]
    StateFile {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// What `POST /complete` answers.
#[derive(Debug)]
pub enum Completion {
    /// Not every byte is there yet.
    Incomplete {
        /// Bytes from 0 without a gap.
        uploaded_bytes: u64,
    },
    /// The work started now, or runs already (`202`).
    Working(Status),
    /// The work is over (`200`).
    Done(Status),
}

/// The mutable part of the upload, under one lock that is never held across an await or I/O
/// on the data file.
#[derive(Debug)]
struct Inner {
    phase: Phase,
    /// Bytes written and held.
    received: Ranges,
    /// Bytes some chunk is writing right now.
    claimed: Ranges,
    message: Option<String>,
    image: Option<serde_json::Value>,
    /// Bumped when a digest mismatch reopens the upload, so writes of the old file stop.
    generation: u64,
}

/// One upload: its files, its ranges, its digest and its state.
pub struct Upload {
    data_path: PathBuf,
    size: u64,
    sha256: String,
    file: File,
    inner: Mutex<Inner>,
    /// The snapshot and journal; its lock also orders their writes (a snapshot reads the
    /// newest state while holding it).
    store: Mutex<Store>,
    hasher: Arc<Hasher>,
    /// What the push counts, shown as `push` in the status.
    progress: Arc<Progress>,
    /// The contiguous prefix as it grows, for the image half's follower.
    prefix: Arc<Prefix>,
}

// === impl Upload ===

impl Upload {
    /// Opens (or creates) the upload in `dir` for a file of `size` bytes with SHA-256 `sha256`
    /// (lowercase hex), taking over what a previous run of the receiver left there, and starts
    /// hashing the contiguous prefix.
    ///
    /// A state file for another upload (other size or digest) or one that cannot be read is
    /// discarded with the data file: this upload starts empty.
    pub fn open(dir: &Path, size: u64, sha256: &str) -> Result<Arc<Upload>, OpenError> {
        let data_path = dir.join(DATA_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&data_path)
            .map_err(|source| OpenError::DataFile {
                path: data_path.clone(),
                source,
            })?;
        let on_disk = file.metadata().map(|m| m.len()).unwrap_or(0);
        let (previous, store) = Store::load(dir, size, sha256);
        let mut inner = Inner {
            phase: Phase::Open,
            received: Ranges::new(),
            claimed: Ranges::new(),
            message: None,
            image: None,
            generation: 0,
        };
        match previous {
            Some(p) => {
                inner.phase = p.phase;
                inner.received = p.ranges;
                inner.message = p.message;
                inner.image = p.image;
                // A data file shorter than the ranges (removed or truncated behind our back)
                // cannot hold them: keep only what it can. A finished upload keeps its result.
                let finished = matches!(inner.phase, Phase::Completed | Phase::Failed);
                if on_disk < size && !finished {
                    inner.received.remove(on_disk, u64::MAX);
                    if inner.phase != Phase::Open && inner.received.contiguous_prefix() < size {
                        tracing::warn!(
                            on_disk,
                            "the data file is shorter than the upload: receiving again"
                        );
                        inner.phase = Phase::Open;
                        inner.message = None;
                    }
                }
                tracing::info!(
                    uploaded_bytes = inner.received.contiguous_prefix(),
                    received_bytes = inner.received.total(),
                    phase = ?inner.phase,
                    "resuming the upload left in the upload directory"
                );
            }
            None => {
                if on_disk > 0 {
                    file.set_len(0).map_err(|source| OpenError::DataFile {
                        path: data_path.clone(),
                        source,
                    })?;
                }
            }
        }
        let reader = file.try_clone().map_err(|source| OpenError::DataFile {
            path: data_path.clone(),
            source,
        })?;
        let prefix = inner.received.contiguous_prefix();
        let upload = Arc::new(Upload {
            data_path,
            size,
            sha256: sha256.to_string(),
            file,
            inner: Mutex::new(inner),
            store: Mutex::new(store),
            hasher: Hasher::start(reader, size).map_err(OpenError::Thread)?,
            progress: Arc::default(),
            prefix: Arc::default(),
        });
        upload.hasher.advance(0, prefix);
        upload.prefix.publish(0, prefix);
        // Compacts what was replayed into a new snapshot, and starts the journal.
        upload.persist().map_err(|source| OpenError::StateFile {
            path: dir.join(STATE_FILE),
            source,
        })?;
        Ok(upload)
    }

    /// The declared size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The current status.
    pub fn status(&self) -> Status {
        status_of(&self.lock(), self.size, &self.progress)
    }

    /// The counters the processor's push fills, for `push` in the status.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// The contiguous prefix as it grows (what the follower reads behind).
    pub fn prefix(&self) -> Arc<Prefix> {
        self.prefix.clone()
    }

    /// The data file.
    pub fn data_path(&self) -> &Path {
        &self.data_path
    }

    /// True when the upload is finished (`completed` or `failed`): nothing is left to push.
    pub fn is_finished(&self) -> bool {
        matches!(self.lock().phase, Phase::Completed | Phase::Failed)
    }

    /// True when a previous run was verifying or pushing when it stopped: the work must be
    /// started again ([`Upload::resume`]).
    pub fn needs_resume(&self) -> bool {
        matches!(self.lock().phase, Phase::Verifying | Phase::Pushing)
    }

    /// Starts a chunk of `len` bytes (when the client said so) at `offset`: refuses it when the
    /// upload is closed, the chunk is too large or reaches past the declared size.
    pub fn begin_chunk(
        self: &Arc<Self>,
        offset: u64,
        len: Option<u64>,
    ) -> Result<ChunkWriter, ChunkError> {
        let inner = self.lock();
        let state = status_of(&inner, self.size, &self.progress).status;
        if !state.is_open() {
            return Err(ChunkError::Closed(state));
        }
        let generation = inner.generation;
        drop(inner);
        if let Some(len) = len {
            if len > MAX_CHUNK {
                return Err(ChunkError::TooLarge(len));
            }
        }
        let len_so_far = len.unwrap_or(0);
        if offset > self.size || offset.saturating_add(len_so_far) > self.size {
            return Err(ChunkError::OutOfRange {
                offset,
                len: len_so_far,
                size: self.size,
            });
        }
        Ok(ChunkWriter {
            upload: self.clone(),
            start: offset,
            pos: offset,
            generation,
            pieces: Vec::new(),
        })
    }

    /// `POST /complete`: refuses while bytes are missing; otherwise closes the upload and starts
    /// the background work (verify, then `process`), or answers where that work is.
    pub fn complete(self: &Arc<Self>, process: &Processor) -> Completion {
        let mut inner = self.lock();
        match inner.phase {
            Phase::Open => {
                let uploaded_bytes = inner.received.contiguous_prefix();
                if uploaded_bytes < self.size {
                    return Completion::Incomplete { uploaded_bytes };
                }
                inner.phase = Phase::Verifying;
                inner.message = Some("checking the size and SHA-256 of the file".into());
                let status = status_of(&inner, self.size, &self.progress);
                drop(inner);
                tracing::info!("upload complete: verifying");
                self.persist_or_log();
                self.resume(process.clone());
                Completion::Working(status)
            }
            Phase::Verifying | Phase::Pushing => {
                Completion::Working(status_of(&inner, self.size, &self.progress))
            }
            Phase::Completed | Phase::Failed => {
                Completion::Done(status_of(&inner, self.size, &self.progress))
            }
        }
    }

    /// Runs the work of a closed upload in the background: verification (unless a previous run
    /// already verified it), then `process`, ending in `completed` or `failed`.
    pub fn resume(self: &Arc<Self>, process: Processor) {
        let upload = self.clone();
        tokio::spawn(async move { upload.work(process).await });
    }

    async fn work(self: Arc<Self>, process: Processor) {
        if self.lock().phase == Phase::Verifying {
            match self.verify().await {
                Ok(()) => {
                    let mut inner = self.lock();
                    inner.phase = Phase::Pushing;
                    inner.message = Some("detecting the format and pushing the image".into());
                }
                Err(Verification::Mismatch(message)) => {
                    tracing::warn!(%message, "verification failed: the upload is reopened");
                    self.reopen(message);
                    self.persist_or_log();
                    return;
                }
                Err(Verification::Unreadable(message)) => {
                    self.finish(Err(message));
                    return;
                }
            }
            self.persist_or_log();
            tracing::info!("upload verified: processing");
        }
        // Its own task, so that a panic in the pipeline becomes `failed` instead of a status
        // stuck at `pushing`.
        let outcome = tokio::spawn(process(self.data_path.clone())).await;
        let outcome = outcome.unwrap_or_else(|e| {
            tracing::error!(error = %e, "processing the upload panicked");
            Err("internal error while processing the upload; see the receiver's log".into())
        });
        self.finish(outcome);
    }

    fn finish(&self, outcome: Result<serde_json::Value, String>) {
        {
            let mut inner = self.lock();
            match outcome {
                Ok(image) => {
                    tracing::info!(%image, "upload completed");
                    inner.phase = Phase::Completed;
                    inner.message = None;
                    inner.image = Some(image);
                }
                Err(message) => {
                    tracing::warn!(%message, "upload failed");
                    inner.phase = Phase::Failed;
                    inner.message = Some(message);
                }
            }
        }
        self.persist_or_log();
    }

    /// Waits for the running digest to reach the end, then checks size and digest.
    async fn verify(&self) -> Result<(), Verification> {
        let hasher = self.hasher.clone();
        let size = self.size;
        let digest = tokio::task::spawn_blocking(move || hasher.wait_final())
            .await
            .map_err(|e| Verification::Unreadable(format!("internal error: {e}")))?
            .map_err(|e| Verification::Unreadable(format!("cannot read the uploaded file: {e}")))?;
        let on_disk = self
            .file
            .metadata()
            .map_err(|e| Verification::Unreadable(format!("cannot read the uploaded file: {e}")))?
            .len();
        if on_disk != size {
            return Err(Verification::Mismatch(format!(
                "the file has {on_disk} bytes but the upload declared {size}; the upload was \
                 reopened with nothing received: send the file again"
            )));
        }
        if digest != self.sha256 {
            return Err(Verification::Mismatch(format!(
                "the file's SHA-256 is sha256:{digest} but the upload declared sha256:{}; the \
                 upload was reopened with nothing received: send the file again",
                self.sha256
            )));
        }
        Ok(())
    }

    /// Back to `ready` with nothing held.
    fn reopen(&self, message: String) {
        let mut inner = self.lock();
        inner.generation += 1;
        inner.received = Ranges::new();
        inner.claimed = Ranges::new();
        inner.phase = Phase::Open;
        inner.message = Some(message);
        // Give the space back now; chunks extend the file again.
        if let Err(e) = self.file.set_len(0) {
            tracing::warn!(error = %e, "cannot truncate the data file");
        }
        self.hasher.reset();
        self.prefix.publish(inner.generation, 0);
    }

    /// Writes `data` at `pos`, only the bytes nobody holds or is writing: those are claimed
    /// for the chunk and returned, to be recorded when the whole chunk is in
    /// ([`ChunkWriter::finish`]) or released when it is not.
    fn write_at(
        &self,
        generation: u64,
        pos: u64,
        data: &[u8],
    ) -> Result<Vec<(u64, u64)>, ChunkError> {
        let end = pos + data.len() as u64;
        let pieces = {
            let mut inner = self.lock();
            if inner.generation != generation {
                return Err(ChunkError::Reopened);
            }
            let mut pieces = Vec::new();
            for (s, e) in inner.received.gaps(pos, end) {
                pieces.extend(inner.claimed.gaps(s, e));
            }
            for &(s, e) in &pieces {
                inner.claimed.insert(s, e);
            }
            pieces
        };
        for &(s, e) in &pieces {
            let piece = &data[(s - pos) as usize..(e - pos) as usize];
            if let Err(source) = self.file.write_all_at(piece, s) {
                self.release(&pieces);
                return Err(ChunkError::Write {
                    path: self.data_path.clone(),
                    source,
                });
            }
        }
        Ok(pieces)
    }

    /// Gives up the claims of a chunk that did not arrive whole.
    fn release(&self, pieces: &[(u64, u64)]) {
        let mut inner = self.lock();
        for &(s, e) in pieces {
            inner.claimed.remove(s, e);
        }
    }

    /// Records the pieces a whole chunk wrote, and moves the hasher on when the contiguous
    /// prefix grew.
    fn record(&self, generation: u64, pieces: &[(u64, u64)]) -> Result<(), ChunkError> {
        let mut inner = self.lock();
        for &(s, e) in pieces {
            inner.claimed.remove(s, e);
        }
        if inner.generation != generation {
            return Err(ChunkError::Reopened);
        }
        let before = inner.received.contiguous_prefix();
        for &(s, e) in pieces {
            inner.received.insert(s, e);
        }
        let after = inner.received.contiguous_prefix();
        if after > before {
            self.hasher.advance(generation, after);
            self.prefix.publish(generation, after);
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent ranges (every update is one call).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes a new snapshot of the current state (and starts a new journal).
    fn persist(&self) -> io::Result<()> {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let state = self.persisted();
        store.snapshot(&state)
    }

    fn persisted(&self) -> Persisted {
        let inner = self.lock();
        Persisted {
            size: self.size,
            sha256: self.sha256.clone(),
            phase: inner.phase,
            ranges: inner.received.clone(),
            message: inner.message.clone(),
            image: inner.image.clone(),
            journal: 0,
        }
    }

    /// Journals the pieces a whole chunk wrote (after [`Upload::record`], before the chunk is
    /// answered), compacting when it is due.
    fn journal(&self, pieces: &[(u64, u64)]) -> io::Result<()> {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let spans = self.lock().received.spans().len();
        if store.append(pieces, spans)? {
            let state = self.persisted();
            store.snapshot(&state)?;
        }
        Ok(())
    }

    fn persist_or_log(&self) {
        if let Err(e) = self.persist() {
            tracing::error!(error = %e, "cannot write the state file");
        }
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        self.hasher.stop();
    }
}

/// Why verification did not pass.
enum Verification {
    /// Size or digest differ from the declared ones: the upload is reopened.
    Mismatch(String),
    /// The file could not be read: the upload fails.
    Unreadable(String),
}

fn status_of(inner: &Inner, size: u64, progress: &Progress) -> Status {
    let status = match inner.phase {
        Phase::Open if inner.received.is_empty() => State::Ready,
        Phase::Open => State::Receiving,
        Phase::Verifying => State::Verifying,
        Phase::Pushing => State::Pushing,
        Phase::Completed => State::Completed,
        Phase::Failed => State::Failed,
    };
    Status {
        status,
        size,
        uploaded_bytes: inner.received.contiguous_prefix(),
        received_bytes: inner.received.total(),
        message: inner.message.clone(),
        image: inner.image.clone(),
        push: progress.view(),
    }
}

// === impl ChunkWriter ===

/// One chunk being received: its bytes go to the data file in batches as they arrive, and are
/// recorded as held only once the whole chunk is in, so a refused or broken chunk leaves
/// nothing behind.
pub struct ChunkWriter {
    upload: Arc<Upload>,
    start: u64,
    pos: u64,
    generation: u64,
    /// Ranges this chunk claimed and wrote.
    pieces: Vec<(u64, u64)>,
}

impl ChunkWriter {
    /// Bytes of this chunk written so far.
    pub fn written(&self) -> u64 {
        self.pos - self.start
    }

    /// Checks that `more` bytes still fit into the chunk and the declared size (for a chunk
    /// without Content-Length, checked as it streams).
    pub fn check_room(&self, more: u64) -> Result<(), ChunkError> {
        let len = self.written() + more;
        if len > MAX_CHUNK {
            return Err(ChunkError::TooLarge(len));
        }
        if self.start + len > self.upload.size {
            return Err(ChunkError::OutOfRange {
                offset: self.start,
                len,
                size: self.upload.size,
            });
        }
        Ok(())
    }

    /// Writes the next bytes of the chunk (on a blocking thread: `pwrite` may wait for the
    /// disk; a small one in place, where the hop would cost more than the write) and hands the
    /// buffer back, emptied, for the next batch.
    pub async fn write(&mut self, data: Vec<u8>) -> Result<Vec<u8>, ChunkError> {
        let len = data.len() as u64;
        self.check_room(len)?;
        let (generation, pos) = (self.generation, self.pos);
        if data.len() <= INLINE_WRITE {
            self.write_in_place(&data)?;
            let mut data = data;
            data.clear();
            return Ok(data);
        }
        let upload = self.upload.clone();
        let (pieces, mut data) = tokio::task::spawn_blocking(move || {
            upload
                .write_at(generation, pos, &data)
                .map(|pieces| (pieces, data))
        })
        .await
        .map_err(|e| ChunkError::Write {
            path: self.upload.data_path.clone(),
            source: io::Error::other(e),
        })??;
        self.pieces.extend(pieces);
        self.pos += len;
        data.clear();
        Ok(data)
    }

    /// Writes `data`, a frame of at most hyper's read buffer, in place (see [`INLINE_WRITE`]);
    /// larger data takes the blocking thread like [`ChunkWriter::write`].
    pub async fn write_small(&mut self, data: &[u8]) -> Result<(), ChunkError> {
        if data.len() > INLINE_WRITE {
            return self.write(data.to_vec()).await.map(drop);
        }
        self.write_in_place(data)
    }

    fn write_in_place(&mut self, data: &[u8]) -> Result<(), ChunkError> {
        self.check_room(data.len() as u64)?;
        let pieces = self.upload.write_at(self.generation, self.pos, data)?;
        self.pieces.extend(pieces);
        self.pos += data.len() as u64;
        Ok(())
    }

    /// Records the whole chunk (in memory, then in the journal) and answers the new status.
    pub fn finish(mut self) -> Result<Status, ChunkError> {
        let pieces = std::mem::take(&mut self.pieces);
        self.upload.record(self.generation, &pieces)?;
        if let Err(e) = self.upload.journal(&pieces) {
            tracing::error!(error = %e, "cannot write the journal");
        }
        Ok(self.upload.status())
    }
}

impl Drop for ChunkWriter {
    fn drop(&mut self) {
        if !self.pieces.is_empty() {
            self.upload.release(&self.pieces);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runr_base::fmt::hex;
    use sha2::{Digest, Sha256};
    use std::time::Duration;

    fn sha_hex(data: &[u8]) -> String {
        hex(&Sha256::digest(data))
    }

    fn processor(outcome: Result<serde_json::Value, String>) -> Processor {
        Arc::new(move |_| {
            let outcome = outcome.clone();
            Box::pin(async move { outcome })
        })
    }

    async fn put(upload: &Arc<Upload>, offset: u64, data: &[u8]) -> Status {
        let mut w = upload
            .begin_chunk(offset, Some(data.len() as u64))
            .expect("chunk accepted");
        w.write(data.to_vec()).await.unwrap();
        w.finish().unwrap()
    }

    async fn wait_final(upload: &Upload) -> Status {
        for _ in 0..500 {
            let s = upload.status();
            if matches!(s.status, State::Completed | State::Failed)
                || s.status == State::Ready && s.message.is_some()
            {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the upload did not finish: {:?}", upload.status());
    }

    #[tokio::test]
    async fn held_bytes_never_change() {
        let dir = tempfile::tempdir().unwrap();
        let data = b"aaaaaaaaaabbbbb";
        let upload = Upload::open(dir.path(), 15, &sha_hex(data)).unwrap();
        put(&upload, 0, b"aaaaaaaaaa").await;
        // Overlaps the held part with other bytes: only the new part is written.
        let s = put(&upload, 5, b"xxxxxbbbbb").await;
        assert_eq!((s.uploaded_bytes, s.received_bytes), (15, 15));
        assert_eq!(std::fs::read(dir.path().join(DATA_FILE)).unwrap(), data);
        match upload.complete(&processor(Ok(serde_json::json!({"digest": "d"})))) {
            Completion::Working(s) => assert_eq!(s.status, State::Verifying),
            other => panic!("{other:?}"),
        }
        let s = wait_final(&upload).await;
        assert_eq!(s.status, State::Completed, "{s:?}");
        assert_eq!(s.image, Some(serde_json::json!({"digest": "d"})));
    }

    #[tokio::test]
    async fn a_refused_or_broken_chunk_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let upload = Upload::open(dir.path(), 100, &sha_hex(b"")).unwrap();
        {
            let mut w = upload.begin_chunk(10, None).unwrap();
            w.write(b"0123456789".to_vec()).await.unwrap();
            assert!(matches!(
                w.check_room(81),
                Err(ChunkError::OutOfRange { .. })
            ));
            // Dropped without finish: the client went away.
        }
        let s = upload.status();
        assert_eq!((s.status, s.received_bytes), (State::Ready, 0));
        // The claim is released: the same bytes can come again.
        let s = put(&upload, 10, b"0123456789").await;
        assert_eq!(s.received_bytes, 10);
    }

    #[tokio::test]
    async fn a_panicking_pipeline_fails_the_upload() {
        let dir = tempfile::tempdir().unwrap();
        let upload = Upload::open(dir.path(), 3, &sha_hex(b"abc")).unwrap();
        put(&upload, 0, b"abc").await;
        let boom: Processor = Arc::new(|_| Box::pin(async { panic!("boom") }));
        upload.complete(&boom);
        let s = wait_final(&upload).await;
        assert_eq!(s.status, State::Failed);
        assert!(s.message.unwrap().contains("internal error"));
    }

    #[tokio::test]
    async fn work_interrupted_by_a_restart_is_resumed() {
        let dir = tempfile::tempdir().unwrap();
        let sum = sha_hex(b"abcd");
        {
            let upload = Upload::open(dir.path(), 4, &sum).unwrap();
            put(&upload, 0, b"abcd").await;
            // As if the process died right after complete was accepted.
            upload.lock().phase = Phase::Pushing;
            upload.persist().unwrap();
        }
        let upload = Upload::open(dir.path(), 4, &sum).unwrap();
        assert!(upload.needs_resume());
        assert_eq!(upload.status().status, State::Pushing);
        upload.resume(processor(Err("no registry".into())));
        let s = wait_final(&upload).await;
        assert_eq!(s.status, State::Failed);
        assert_eq!(s.message.as_deref(), Some("no registry"));
        // And the result outlives another restart.
        drop(upload);
        let upload = Upload::open(dir.path(), 4, &sum).unwrap();
        assert!(!upload.needs_resume());
        assert_eq!(upload.status(), s);
    }

    #[tokio::test]
    async fn a_lost_data_file_means_receiving_again() {
        let dir = tempfile::tempdir().unwrap();
        let sum = sha_hex(b"abcd");
        {
            let upload = Upload::open(dir.path(), 4, &sum).unwrap();
            put(&upload, 0, b"abcd").await;
        }
        std::fs::File::options()
            .write(true)
            .open(dir.path().join(DATA_FILE))
            .unwrap()
            .set_len(2)
            .unwrap();
        let upload = Upload::open(dir.path(), 4, &sum).unwrap();
        let s = upload.status();
        assert_eq!(
            (s.status, s.uploaded_bytes, s.received_bytes),
            (State::Receiving, 2, 2)
        );
        // A finished upload keeps its result whatever happens to the file.
        upload.complete(&processor(Ok(serde_json::json!({}))));
        put(&upload, 2, b"cd").await;
        upload.complete(&processor(Ok(serde_json::json!({"digest": "d"}))));
        let done = wait_final(&upload).await;
        assert_eq!(done.status, State::Completed);
        drop(upload);
        std::fs::remove_file(dir.path().join(DATA_FILE)).unwrap();
        let upload = Upload::open(dir.path(), 4, &sum).unwrap();
        assert_eq!(upload.status(), done);
    }

    #[test]
    fn hex_is_lowercase() {
        assert_eq!(hex(&[0x00, 0xab, 0x7f]), "00ab7f");
        assert_eq!(
            sha_hex(b"test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }
}
