//! Blob work shared by all images: a queue served largest first by a fixed number of workers,
//! one request at a time per (repository, digest), each body streamed through SHA-256 and
//! counted, never held in memory.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runr_registry::Sha256Hasher;
use tokio::sync::{watch, Notify, OwnedMutexGuard};
use tokio::task::JoinSet;

use crate::cache::{blob_what, next_chunk, Cache, FetchError};

/// How often a long transfer reports the bytes it has so far.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(10);

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

/// The shared blob queue. Images call [`Fetcher::warm`] and [`Fetcher::is_stored`]; the workers
/// started by [`Fetcher::spawn_workers`] do the transfers.
pub struct Fetcher {
    cache: Arc<Cache>,
    state: Mutex<State>,
    wake: Notify,
    /// Set by [`Fetcher::stop`]: workers take no new job.
    stopped: AtomicBool,
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

    /// The confirmation probe: true when the cache answers the Range probe with 206 (it holds
    /// the whole blob). Waits its turn behind any request for the same blob.
    pub async fn is_stored(&self, repository: &str, blob: &Blob) -> Result<bool, FetchError> {
        let _turn = self
            .key_lock(&(repository.to_string(), blob.digest.clone()))
            .await;
        is_stored(&self.cache, repository, blob).await
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
                    r = warm_blob(&self.cache, repository, &blob) => Some(r),
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

/// One blob: a Range probe (206: the cache holds it), or, when the cache answers 200 with the
/// whole body, reading all of it while checking its size and digest. The read is what makes a
/// pull-through cache fetch and store the blob.
pub async fn warm_blob(cache: &Cache, repository: &str, blob: &Blob) -> BlobResult {
    // An empty blob has no byte 0 to ask for; fetch it whole.
    let mut resp = cache.blob(repository, &blob.digest, blob.size > 0).await?;
    let what = blob_what(repository, &blob.digest);
    if resp.status() == reqwest::StatusCode::PARTIAL_CONTENT {
        // Read the one byte so the connection goes back to the pool.
        while next_chunk(&mut resp, &what, 0).await?.is_some() {}
        tracing::debug!(blob = %what, "already cached");
        return Ok(Warmed::Cached);
    }
    let started = Instant::now();
    let mut last_report = started;
    let mut hasher = Sha256Hasher::new();
    let mut bytes = 0u64;
    while let Some(chunk) = next_chunk(&mut resp, &what, bytes).await? {
        bytes += chunk.len() as u64;
        if bytes > blob.size {
            return Err(FetchError::SizeMismatch {
                what,
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
            what,
            expected: blob.size,
            actual: bytes,
        });
    }
    let actual = hasher.finish();
    if actual != blob.digest {
        return Err(FetchError::DigestMismatch {
            what,
            expected: blob.digest.clone(),
            actual,
        });
    }
    tracing::debug!(blob = %what, bytes, seconds = started.elapsed().as_secs_f64(), "fetched");
    Ok(Warmed::Fetched { bytes })
}

/// True when the cache answers the Range probe for `blob` with 206. A 200 means it does not
/// hold the blob (yet): the body is dropped unread, the cache's own copy carries on.
pub async fn is_stored(cache: &Cache, repository: &str, blob: &Blob) -> Result<bool, FetchError> {
    if blob.size == 0 {
        // Nothing to range over; an empty blob that is served at all is as good as stored.
        return cache
            .blob(repository, &blob.digest, false)
            .await
            .map(|_| true);
    }
    let mut resp = cache.blob(repository, &blob.digest, true).await?;
    if resp.status() != reqwest::StatusCode::PARTIAL_CONTENT {
        return Ok(false);
    }
    let what = blob_what(repository, &blob.digest);
    while next_chunk(&mut resp, &what, 0).await?.is_some() {}
    Ok(true)
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
