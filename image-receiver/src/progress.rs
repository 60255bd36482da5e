//! How far the push has come: the image half counts what it pushes, the upload half shows it as
//! `push` in `GET /status` (the console's "verification and push" step). Neutral ground, so
//! neither half imports the other: `serve` hands the upload's [`Progress`] to the pipeline.
//!
//! Counters only, read without a lock: a reader may see one blob's bytes before its count, never
//! more bytes pushed than known (totals grow before the bytes they announce are sent).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// The live counters of the push of this run of the receiver.
#[derive(Debug, Default)]
pub struct Progress {
    started: AtomicBool,
    blobs: AtomicU64,
    blobs_pushed: AtomicU64,
    bytes: AtomicU64,
    bytes_pushed: AtomicU64,
}

/// `push` of `GET /status`: blobs and bytes the registry has of those known so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushProgress {
    /// Blobs (configs, layers, modules) the image references that are known so far.
    pub blobs: u64,
    /// Of those, the ones the registry has now: pushed by this run, or found there (`HEAD`).
    pub blobs_pushed: u64,
    /// Bytes of the known blobs as they are pushed (a classic layer that is gzip'ed counts once
    /// its compressed size is known).
    pub bytes: u64,
    /// Bytes sent into the registry or found there; an attempt that failed and is retried from
    /// the blob's start is taken back.
    pub bytes_pushed: u64,
}

impl Progress {
    /// A new push begins (after `complete`, or after a reopened upload came back): every count
    /// starts from zero and `push` appears in the status.
    pub fn start(&self) {
        for c in [
            &self.blobs,
            &self.blobs_pushed,
            &self.bytes,
            &self.bytes_pushed,
        ] {
            c.store(0, Ordering::SeqCst);
        }
        self.started.store(true, Ordering::SeqCst);
    }

    /// A blob of `size` bytes is known (0 while its size is not: see [`Progress::add_bytes`]).
    pub fn add_blob(&self, size: u64) {
        self.bytes.fetch_add(size, Ordering::SeqCst);
        self.blobs.fetch_add(1, Ordering::SeqCst);
    }

    /// `size` more bytes are known (the compressed size of a layer just gzip'ed).
    pub fn add_bytes(&self, size: u64) {
        self.bytes.fetch_add(size, Ordering::SeqCst);
    }

    /// `n` bytes went to the registry (or were found there).
    pub fn sent(&self, n: u64) {
        self.bytes_pushed.fetch_add(n, Ordering::SeqCst);
    }

    /// `n` bytes sent by an attempt that failed are not in the registry after all.
    pub fn unsent(&self, n: u64) {
        // Never below zero, whatever the order of two updates.
        let _ = self
            .bytes_pushed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_sub(n))
            });
    }

    /// One more blob is in the registry.
    pub fn blob_done(&self) {
        self.blobs_pushed.fetch_add(1, Ordering::SeqCst);
    }

    /// The counters now; `None` before the first push of this run.
    pub fn view(&self) -> Option<PushProgress> {
        if !self.started.load(Ordering::SeqCst) {
            return None;
        }
        // Done counts first: each total grows before what it announces is sent or done, so
        // these reads never show more done than known.
        let blobs_pushed = self.blobs_pushed.load(Ordering::SeqCst);
        let bytes_pushed = self.bytes_pushed.load(Ordering::SeqCst);
        Some(PushProgress {
            blobs: self.blobs.load(Ordering::SeqCst).max(blobs_pushed),
            blobs_pushed,
            bytes: self.bytes.load(Ordering::SeqCst).max(bytes_pushed),
            bytes_pushed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_a_retried_attempt() {
        let p = Progress::default();
        assert_eq!(p.view(), None);
        p.start();
        p.add_blob(10);
        p.add_blob(0);
        p.sent(6);
        p.unsent(6);
        p.sent(10);
        p.blob_done();
        p.add_bytes(5);
        assert_eq!(
            p.view(),
            Some(PushProgress {
                blobs: 2,
                blobs_pushed: 1,
                bytes: 15,
                bytes_pushed: 10
            })
        );
        p.unsent(100);
        assert_eq!(p.view().unwrap().bytes_pushed, 0);
        // A new push starts from zero.
        p.start();
        assert_eq!(p.view().unwrap().bytes, 0);
    }
}
