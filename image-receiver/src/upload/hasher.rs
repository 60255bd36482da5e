//! SHA-256 of the upload's contiguous prefix, computed on a thread of its own as the prefix
//! grows: by the time `complete` arrives, only the last chunk is left to hash.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use runr_base::fmt::hex;
use sha2::{Digest, Sha256};

/// How much the hasher reads at a time.
const HASH_BLOCK: usize = 1024 * 1024;

/// SHA-256 of the contiguous prefix, computed on its own thread as the prefix grows.
pub(crate) struct Hasher {
    shared: Mutex<HashShared>,
    changed: Condvar,
}

#[derive(Default)]
struct HashShared {
    /// Generation of the upload the hasher works on.
    generation: u64,
    /// End of the contiguous prefix: the hasher may read up to here.
    target: u64,
    /// Bytes hashed so far (of `generation`).
    hashed: u64,
    /// Hex digest once `hashed` reached the size.
    digest: Option<String>,
    /// A read error, for the verification to report.
    error: Option<String>,
    /// The upload is gone: the thread ends.
    stop: bool,
}

impl Hasher {
    pub(crate) fn start(file: File, size: u64) -> io::Result<Arc<Hasher>> {
        let hasher = Arc::new(Hasher {
            shared: Mutex::new(HashShared::default()),
            changed: Condvar::new(),
        });
        let h = hasher.clone();
        // A plain thread: it blocks on reads and on the condvar, and the second core is its.
        std::thread::Builder::new()
            .name("sha256".into())
            .spawn(move || h.run(file, size))?;
        Ok(hasher)
    }

    fn lock(&self) -> MutexGuard<'_, HashShared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The contiguous prefix of `generation` now ends at `target`.
    pub(crate) fn advance(&self, generation: u64, target: u64) {
        let mut s = self.lock();
        if generation >= s.generation && target > s.target {
            s.generation = generation;
            s.target = target;
            self.changed.notify_all();
        }
    }

    /// Ends the thread (the upload is gone).
    pub(crate) fn stop(&self) {
        let mut s = self.lock();
        s.stop = true;
        self.changed.notify_all();
    }

    /// Starts over (the upload was reopened).
    pub(crate) fn reset(&self) {
        let mut s = self.lock();
        s.generation += 1;
        s.target = 0;
        s.hashed = 0;
        s.digest = None;
        s.error = None;
        self.changed.notify_all();
    }

    /// Blocks until the whole file is hashed; its hex digest, or why it could not be read.
    pub(crate) fn wait_final(&self) -> Result<String, String> {
        let mut s = self.lock();
        loop {
            if let Some(e) = &s.error {
                return Err(e.clone());
            }
            if let Some(d) = &s.digest {
                return Ok(d.clone());
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn run(&self, file: File, size: u64) {
        let mut buf = vec![0u8; HASH_BLOCK];
        let mut sha = Sha256::new();
        let mut generation = 0;
        let mut hashed = 0u64;
        loop {
            let (from, to) = {
                let mut s = self.lock();
                loop {
                    if s.generation != generation {
                        generation = s.generation;
                        sha = Sha256::new();
                        hashed = 0;
                    }
                    if s.stop {
                        return;
                    }
                    if s.target > hashed && s.error.is_none() {
                        break;
                    }
                    s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
                }
                (hashed, s.target.min(hashed + HASH_BLOCK as u64))
            };
            let n = (to - from) as usize;
            let read = file.read_exact_at(&mut buf[..n], from);
            let mut s = self.lock();
            if s.generation != generation {
                continue;
            }
            if let Err(e) = read {
                s.error = Some(e.to_string());
                self.changed.notify_all();
                continue;
            }
            sha.update(&buf[..n]);
            hashed = to;
            s.hashed = hashed;
            if hashed == size {
                s.digest = Some(hex(&sha.clone().finalize()));
                self.changed.notify_all();
            }
        }
    }
}
