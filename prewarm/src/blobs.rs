//! Blob work shared by all images: a queue served largest first by a fixed number of workers,
//! one request at a time per (repository, digest), each body streamed through SHA-256 and
//! counted, never held in memory; and the confirmation that the cache stored what it served.
//!
//! Whether the cache holds a blob is asked with `Range: bytes=0-0`: 206 means it does. A cache
//! that ignores `Range` answers 200 with the whole blob whether it holds it or not, which looks
//! exactly like a cache that does not hold it yet: distribution's proxy answers so until its own
//! copy is committed, which can be a second after its 200 was sent. Nor can a HEAD simply be
//! asked: distribution serves HEAD like GET, streaming a blob it does not hold from its upstream
//! just to discard it. So what tells them apart is learned during the run (`Learned`):
//!
//! - a 206 from anywhere: Range is honoured, nothing else is tried;
//! - no 206 in the run and a blob whose confirmation got only whole-blob 200s for a while
//!   ([`SUSPECT_AFTER`]): the cache is suspected, and HEADs are asked from then on;
//! - a HEAD that says 404 for a blob the cache serves: HEAD answers from its store (an upstream
//!   asking HEAD would find the blob). Then HEAD confirms, and the first blob it calls stored
//!   whose Range probe still gets the whole blob proves that Range is ignored;
//! - without such a HEAD, a confirmation wait that saw nothing but whole-blob answers, in a run
//!   that never saw a 206, is taken for it: each blob is then read once more instead, which is
//!   all a client can do (a cache that never stores what it serves looks the same).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Response;
use runr_registry::{Backoff, Sha256Hasher};
use tokio::sync::{watch, Notify, OwnedMutexGuard};
use tokio::task::JoinSet;

use crate::cache::{blob_what, next_chunk, Cache, FetchError, Head};

/// How often a long transfer reports the bytes it has so far.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// Pauses between two confirmation checks of one blob.
const CONFIRM_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(100),
    max: Duration::from_secs(2),
};
/// How long a blob's confirmation sees only whole-blob answers, in a run without a 206, before
/// the cache is suspected of ignoring Range (at most half the confirmation wait). distribution's
/// proxy, slowest to commit, was seen at 1.5 s.
pub const SUSPECT_AFTER: Duration = Duration::from_secs(2);
/// Said once when HEAD proved that the cache ignores `Range`.
pub const IGNORES_RANGE_HEAD: &str =
    "the cache ignores Range requests; confirming with HEAD instead";
/// Said once when the cache ignores `Range` as far as a client can tell and its HEAD was not
/// seen to answer from its store (no HEAD, one that asks the upstream, or nothing missing to
/// show it on a warm cache).
pub const IGNORES_RANGE_READ: &str = "the cache ignores Range requests and its HEAD was not seen \
     to answer from its store; confirming by reading each blob once more instead";

/// A blob named by a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Blob {
    /// `sha256:<hex>`.
    pub digest: String,
    /// Bytes, from the descriptor.
    pub size: u64,
}

/// What warming one blob did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warmed {
    /// The Range probe answered 206: the cache holds it already.
    Cached,
    /// The cache served it whole; `bytes` were read and verified.
    Fetched {
        /// The blob's size.
        bytes: u64,
    },
}

/// Outcome of one blob request, as handed to every image waiting for it.
pub type BlobResult = Result<Warmed, FetchError>;

type Key = (String, String);

// === impl Fetcher ===

/// What this run has learned about how the cache answers (see the module docs). Facts are
/// only ever set, never cleared.
#[derive(Debug, Default)]
struct Learned {
    /// A Range probe was answered with 206.
    honours_range: AtomicBool,
    /// No 206 yet, and a confirmation saw only whole-blob answers for [`SUSPECT_AFTER`].
    suspect: AtomicBool,
    /// A HEAD answered 404 for a blob the cache serves: HEAD reflects its store.
    head_from_store: AtomicBool,
    /// The cache answers Range probes with the whole blob even for blobs it stores.
    ignores_range: AtomicBool,
}

impl Learned {
    fn get(flag: &AtomicBool) -> bool {
        flag.load(AtomicOrdering::SeqCst)
    }

    /// True once a probe got 206.
    fn honours_range(&self) -> bool {
        Self::get(&self.honours_range)
    }

    /// True while HEADs are worth asking: the cache is suspected of ignoring Range and has not
    /// answered a 206.
    fn asks_head(&self) -> bool {
        Self::get(&self.suspect) && !self.honours_range()
    }

    /// True once HEAD showed it answers from the store.
    fn head_from_store(&self) -> bool {
        Self::get(&self.head_from_store)
    }

    /// True once the cache was found to ignore Range.
    fn ignores_range(&self) -> bool {
        Self::get(&self.ignores_range)
    }

    fn saw_206(&self) {
        self.honours_range.store(true, AtomicOrdering::SeqCst);
    }

    fn suspect_range_ignored(&self) {
        if !self.suspect.swap(true, AtomicOrdering::SeqCst) {
            tracing::debug!("no 206 yet and only whole blobs: asking HEAD too");
        }
    }

    fn saw_store_backed_head(&self) {
        if !self.head_from_store.swap(true, AtomicOrdering::SeqCst) {
            tracing::debug!("HEAD answers from the cache's store");
        }
    }

    /// Records that the cache ignores Range; the first caller says so (`message`), once.
    fn found_range_ignored(&self, message: &'static str) {
        if !self.ignores_range.swap(true, AtomicOrdering::SeqCst) {
            tracing::warn!("{message}");
        }
    }
}

/// One look at whether the cache stored a blob.
enum Check {
    Stored,
    /// Not (yet); `whole`: the Range probe was answered with the whole blob.
    NotYet {
        whole: bool,
    },
    /// The cache ignores Range and HEAD cannot tell: reading it again is the confirmation.
    ReadAgain,
}

/// The shared blob queue. Images call [`Fetcher::warm`] and [`Fetcher::confirm`]; the workers
/// started by [`Fetcher::spawn_workers`] do the transfers.
pub struct Fetcher {
    cache: Arc<Cache>,
    state: Mutex<State>,
    wake: Notify,
    /// Set by [`Fetcher::stop`]: workers take no new job.
    stopped: AtomicBool,
    learned: Learned,
}

#[derive(Default)]
struct State {
    queue: BinaryHeap<Job>,
    seq: u64,
    /// Requests queued or running: a second image asking for the same blob waits for this one.
    pending: HashMap<Key, Arc<watch::Sender<Option<BlobResult>>>>,
    /// Blobs fetched whole in this run: asking again goes straight to the confirmation probe.
    fetched: HashMap<Key, Warmed>,
    /// One lock per (repository, digest), held by every request for it.
    locks: HashMap<Key, Arc<tokio::sync::Mutex<()>>>,
}

struct Job {
    size: u64,
    seq: u64,
    key: Key,
    done: Arc<watch::Sender<Option<BlobResult>>>,
}

// Largest first; among equals, first come first served.
impl Ord for Job {
    fn cmp(&self, other: &Self) -> Ordering {
        self.size
            .cmp(&other.size)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}
impl PartialOrd for Job {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Job {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Job {}

impl Fetcher {
    /// A queue sending its requests to `cache`.
    pub fn new(cache: Arc<Cache>) -> Arc<Fetcher> {
        Arc::new(Fetcher {
            cache,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            stopped: AtomicBool::new(false),
            learned: Learned::default(),
        })
    }

    /// Stops the workers from taking new jobs (the run was signalled); transfers under way end
    /// when their workers are dropped.
    pub fn stop(&self) {
        self.stopped.store(true, AtomicOrdering::SeqCst);
        self.wake.notify_waiters();
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(AtomicOrdering::SeqCst)
    }

    /// Starts `n` workers; they run until the returned set is dropped.
    pub fn spawn_workers(self: &Arc<Self>, n: usize) -> JoinSet<()> {
        let mut set = JoinSet::new();
        for _ in 0..n {
            let me = Arc::clone(self);
            set.spawn(async move { me.work().await });
        }
        set
    }

    /// Warms `blob` of `repository`: queued by size, shared with any other image asking for the
    /// same blob at the same time. A blob already fetched whole in this run is not fetched again.
    pub async fn warm(&self, repository: &str, blob: &Blob) -> BlobResult {
        let key = (repository.to_string(), blob.digest.clone());
        let mut rx = {
            let mut st = self.lock();
            if let Some(done) = st.fetched.get(&key) {
                return Ok(*done);
            }
            match st.pending.get(&key) {
                Some(tx) => tx.subscribe(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    let tx = Arc::new(tx);
                    st.seq += 1;
                    let seq = st.seq;
                    st.pending.insert(key.clone(), Arc::clone(&tx));
                    st.queue.push(Job {
                        size: blob.size,
                        seq,
                        key,
                        done: tx,
                    });
                    self.wake.notify_one();
                    rx
                }
            }
        };
        let result = match rx.wait_for(Option::is_some).await {
            Ok(result) => result.clone(),
            Err(_) => None,
        };
        match result {
            Some(result) => result,
            // The worker side is gone only when the run is shutting down.
            None => Err(FetchError::Connect {
                what: blob_what(repository, &blob.digest),
                cause: "the run was stopped".into(),
            }),
        }
    }

    /// Checks, until `deadline`, that the cache stored `blob` after serving it whole: the Range
    /// probe answers 206, or HEAD (where it answers from the store) says so, or, for a cache
    /// that ignores Range and whose HEAD cannot tell, a second read succeeds. Returns the bytes
    /// that second read took (0 otherwise). Each check waits its turn behind any request for
    /// the same blob.
    pub async fn confirm(
        &self,
        repository: &str,
        blob: &Blob,
        deadline: Instant,
    ) -> Result<u64, FetchError> {
        let key = (repository.to_string(), blob.digest.clone());
        let started = Instant::now();
        let suspect_after = SUSPECT_AFTER.min(deadline.saturating_duration_since(started) / 2);
        let mut check = 0;
        let mut only_whole = true;
        loop {
            // Raised before the check, so that this very check asks HEAD too.
            if only_whole && started.elapsed() >= suspect_after && !self.learned.honours_range() {
                self.learned.suspect_range_ignored();
            }
            let outcome = {
                let _turn = self.key_lock(&key).await;
                match self.check_stored(repository, blob).await {
                    // distribution's proxy can answer 500 to a request that meets its commit
                    // of the blob; a blob served whole a moment ago is then "not yet" stored.
                    // (502/503/504 keep their meaning: the registry went away.)
                    Err(FetchError::Status { status: 500, .. }) => {
                        tracing::debug!(
                            blob = %blob_what(repository, &blob.digest),
                            "confirmation probe answered 500; trying again"
                        );
                        Check::NotYet { whole: false }
                    }
                    other => other?,
                }
            };
            match outcome {
                Check::Stored => {
                    tracing::debug!(
                        blob = %blob_what(repository, &blob.digest),
                        probes = check + 1,
                        seconds = started.elapsed().as_secs_f64(),
                        "stored"
                    );
                    return Ok(0);
                }
                Check::ReadAgain => return self.read_again(&key, blob).await,
                Check::NotYet { whole } => only_whole &= whole,
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Nothing but the whole blob for the whole wait, in a run that never saw a
                // 206 and has no HEAD to ask: as far as a client can tell, Range is ignored.
                let l = &self.learned;
                if only_whole && blob.size > 1 && !l.honours_range() && !l.head_from_store() {
                    l.found_range_ignored(IGNORES_RANGE_READ);
                    return self.read_again(&key, blob).await;
                }
                return Err(FetchError::NotStored {
                    what: blob_what(repository, &blob.digest),
                    secs: started.elapsed().as_secs(),
                });
            }
            let mut pause = CONFIRM_BACKOFF.delay(check).min(left);
            if let Some(to_suspicion) = suspect_after.checked_sub(started.elapsed()) {
                // A check right when the suspicion is due: a store-backed HEAD is seen only
                // while the cache has not stored the blob yet.
                if !to_suspicion.is_zero() {
                    pause = pause.min(to_suspicion);
                }
            }
            tokio::time::sleep(pause).await;
            check += 1;
        }
    }

    /// Drops the memory that `blob` was fetched whole in this run (its confirmation failed),
    /// so the next [`Fetcher::warm`] asks the cache again.
    pub fn forget(&self, repository: &str, blob: &Blob) {
        self.lock()
            .fetched
            .remove(&(repository.to_string(), blob.digest.clone()));
    }

    async fn work(&self) {
        loop {
            let job = loop {
                if self.is_stopped() {
                    return;
                }
                if let Some(job) = self.lock().queue.pop() {
                    break job;
                }
                // notify_one stores a permit when nobody waits, so a push between the check
                // above and this await is not lost; stop() wakes every waiter.
                self.wake.notified().await;
            };
            let (repository, digest) = &job.key;
            let result = if job.done.receiver_count() == 0 {
                // Every image that wanted it has given up (timeout): skip the transfer.
                None
            } else {
                let _turn = self.key_lock(&job.key).await;
                let blob = Blob {
                    digest: digest.clone(),
                    size: job.size,
                };
                tokio::select! {
                    r = self.warm_blob(repository, &blob) => Some(r),
                    () = job.done.closed() => None,
                }
            };
            let mut st = self.lock();
            match result {
                Some(result) => {
                    st.pending.remove(&job.key);
                    if let Ok(w @ Warmed::Fetched { .. }) = &result {
                        st.fetched.insert(job.key.clone(), *w);
                    }
                    job.done.send_replace(Some(result));
                }
                // Someone subscribed again after the last waiter left: keep the job.
                None if job.done.receiver_count() > 0 => {
                    st.queue.push(job);
                    self.wake.notify_one();
                }
                None => {
                    st.pending.remove(&job.key);
                }
            }
        }
    }

    async fn key_lock(&self, key: &Key) -> OwnedMutexGuard<()> {
        let lock = Arc::clone(self.lock().locks.entry(key.clone()).or_default());
        lock.lock_owned().await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing in the critical sections can panic half-way; recover the data if one did.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

// === the requests for one blob ===

impl Fetcher {
    /// One blob: a Range probe (206: the cache holds it), or, when the cache answers 200 with
    /// the whole body, reading all of it while checking its size and digest. The read is what
    /// makes a pull-through cache fetch and store the blob. Once the cache is known to ignore
    /// Range and HEAD answers from its store, HEAD says whether it holds the blob instead.
    async fn warm_blob(&self, repository: &str, blob: &Blob) -> BlobResult {
        let what = blob_what(repository, &blob.digest);
        let l = &self.learned;
        if blob.size > 0
            && l.ignores_range()
            && l.head_from_store()
            && present(self.cache.head_blob(repository, &blob.digest).await?, blob)
        {
            tracing::debug!(blob = %what, "already cached (HEAD)");
            return Ok(Warmed::Cached);
        }
        // An empty blob has no byte 0 to ask for, and a cache that ignores Range is asked
        // plainly: either way it is fetched whole.
        let probe = blob.size > 0 && !l.ignores_range();
        let mut resp = self.cache.blob(repository, &blob.digest, probe).await?;
        if resp.status() == reqwest::StatusCode::PARTIAL_CONTENT {
            l.saw_206();
            // Read the one byte so the connection goes back to the pool.
            while next_chunk(&mut resp, &what, 0).await?.is_some() {}
            tracing::debug!(blob = %what, "already cached");
            return Ok(Warmed::Cached);
        }
        if blob.size > 0 && l.asks_head() && !l.head_from_store() {
            // Asked while the cache is still busy sending it: a HEAD that answers from the
            // store cannot know the blob yet.
            self.learn_from_head(repository, blob).await?;
        }
        let bytes = read_whole(resp, &what, blob).await?;
        Ok(Warmed::Fetched { bytes })
    }

    /// A HEAD for a blob the cache serves: a 404 shows that HEAD answers from the store.
    async fn learn_from_head(&self, repository: &str, blob: &Blob) -> Result<(), FetchError> {
        if self.cache.head_blob(repository, &blob.digest).await? == Head::Absent {
            self.learned.saw_store_backed_head();
        }
        Ok(())
    }

    /// One confirmation check of `blob` (see [`Fetcher::confirm`]).
    async fn check_stored(&self, repository: &str, blob: &Blob) -> Result<Check, FetchError> {
        let l = &self.learned;
        if blob.size == 0 {
            // Nothing to range over; an empty blob that is served at all is as good as stored.
            return self
                .cache
                .blob(repository, &blob.digest, false)
                .await
                .map(|_| Check::Stored);
        }
        if l.head_from_store() {
            if !present(self.cache.head_blob(repository, &blob.digest).await?, blob) {
                return Ok(Check::NotYet { whole: false });
            }
            if !l.honours_range() && !l.ignores_range() {
                // Stored, says the store; whether Range is ignored is told by one probe.
                match self.probe(repository, blob).await? {
                    Probe::Partial => l.saw_206(),
                    Probe::Whole => l.found_range_ignored(IGNORES_RANGE_HEAD),
                }
            }
            return Ok(Check::Stored);
        }
        if l.ignores_range() {
            return Ok(Check::ReadAgain);
        }
        Ok(match self.probe(repository, blob).await? {
            Probe::Partial => {
                l.saw_206();
                Check::Stored
            }
            Probe::Whole => {
                if l.asks_head() {
                    self.learn_from_head(repository, blob).await?;
                }
                Check::NotYet { whole: true }
            }
        })
    }

    /// The Range probe: 206 (and its one byte read), or 200 with the whole blob, which is
    /// dropped unread (the cache's own copy carries on).
    async fn probe(&self, repository: &str, blob: &Blob) -> Result<Probe, FetchError> {
        let mut resp = self.cache.blob(repository, &blob.digest, true).await?;
        if resp.status() != reqwest::StatusCode::PARTIAL_CONTENT {
            return Ok(Probe::Whole);
        }
        let what = blob_what(repository, &blob.digest);
        while next_chunk(&mut resp, &what, 0).await?.is_some() {}
        Ok(Probe::Partial)
    }

    /// The confirmation for a cache that ignores Range and whose HEAD cannot tell: the blob is
    /// read whole once more, size and digest checked; the bytes it took.
    async fn read_again(&self, key: &Key, blob: &Blob) -> Result<u64, FetchError> {
        let (repository, digest) = key;
        let _turn = self.key_lock(key).await;
        let what = blob_what(repository, digest);
        let resp = self.cache.blob(repository, digest, false).await?;
        let bytes = read_whole(resp, &what, blob).await?;
        tracing::debug!(blob = %what, bytes, "stored (read again)");
        Ok(bytes)
    }
}

enum Probe {
    Partial,
    Whole,
}

/// A HEAD that says the blob is there (with its size, when it gives one).
fn present(head: Head, blob: &Blob) -> bool {
    matches!(head, Head::Present { size } if size.is_none_or(|s| s == blob.size))
}

/// Reads the body of a 200 for `blob` to its end, checking its size and digest as it streams;
/// the bytes read.
async fn read_whole(mut resp: Response, what: &str, blob: &Blob) -> Result<u64, FetchError> {
    let started = Instant::now();
    let mut last_report = started;
    let mut hasher = Sha256Hasher::new();
    let mut bytes = 0u64;
    while let Some(chunk) = next_chunk(&mut resp, what, bytes).await? {
        bytes += chunk.len() as u64;
        if bytes > blob.size {
            return Err(FetchError::SizeMismatch {
                what: what.into(),
                expected: blob.size,
                actual: bytes,
            });
        }
        hasher.update(&chunk);
        if last_report.elapsed() >= PROGRESS_EVERY {
            last_report = Instant::now();
            tracing::info!(
                blob = %what,
                bytes,
                size = blob.size,
                seconds = started.elapsed().as_secs(),
                "fetching"
            );
        }
    }
    if bytes != blob.size {
        return Err(FetchError::SizeMismatch {
            what: what.into(),
            expected: blob.size,
            actual: bytes,
        });
    }
    let actual = hasher.finish();
    if actual != blob.digest {
        return Err(FetchError::DigestMismatch {
            what: what.into(),
            expected: blob.digest.clone(),
            actual,
        });
    }
    tracing::debug!(blob = %what, bytes, seconds = started.elapsed().as_secs_f64(), "fetched");
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_pops_largest_first_then_in_order() {
        let tx = Arc::new(watch::channel(None).0);
        let job = |size, seq| Job {
            size,
            seq,
            key: (String::new(), format!("{seq}")),
            done: Arc::clone(&tx),
        };
        let mut heap: BinaryHeap<Job> = [job(10, 1), job(500, 2), job(10, 3), job(70, 4)]
            .into_iter()
            .collect();
        let order: Vec<u64> = std::iter::from_fn(|| heap.pop().map(|j| j.seq)).collect();
        assert_eq!(order, [2, 4, 1, 3]);
    }
}
