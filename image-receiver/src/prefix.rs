//! The contiguous prefix of the upload as it grows: the upload half publishes it (after the
//! bytes are in the data file, before the chunk is answered), the image half's follower waits
//! on it to read the file as a stream while it is being written. Neutral ground like
//! [`crate::progress`]: `serve` hands the upload's [`Prefix`] to the pipeline.
//!
//! Bytes inside the prefix never change (the upload half's overlap rule), so whatever a reader
//! read below it stays true, until a digest mismatch reopens the upload: that starts a new
//! generation, and every wait of the old one ends with an error.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[derive(Debug, Default, Clone, Copy)]
struct Now {
    generation: u64,
    len: u64,
    /// The generation whose follower must start nothing new (its `complete` began).
    closed: Option<u64>,
    /// The receiver is shutting down: no wait blocks any more.
    stopped: bool,
}

/// The prefix length and its generation, with a condition to wait on.
#[derive(Debug, Default)]
pub struct Prefix {
    now: Mutex<Now>,
    moved: Condvar,
    /// For async waiters of a new generation (or the stop).
    renewed: tokio::sync::Notify,
}

/// Why a wait on the prefix ended without the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Gone {
    /// The upload was reopened: the bytes waited for belong to a file that is no more.
    #[error("the upload was reopened")]
    Reopened,
    /// `complete` began: the rest is the after-complete pass's.
    #[error("the upload is complete; the follower stops here")]
    Closed,
}

impl Prefix {
    fn lock(&self) -> MutexGuard<'_, Now> {
        self.now.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The prefix of `generation` is now `len` bytes long (a new generation starts at its
    /// first publication).
    pub fn publish(&self, generation: u64, len: u64) {
        let mut now = self.lock();
        if generation < now.generation {
            return;
        }
        let renewed = generation > now.generation;
        if renewed {
            now.generation = generation;
            now.len = len;
        } else {
            now.len = now.len.max(len);
        }
        drop(now);
        self.moved.notify_all();
        if renewed {
            self.renewed.notify_waiters();
        }
    }

    /// `(generation, length)` now.
    pub fn current(&self) -> (u64, u64) {
        let now = self.lock();
        (now.generation, now.len)
    }

    /// `complete` of `generation` began: its follower starts nothing new.
    pub fn close(&self, generation: u64) {
        self.lock().closed = Some(generation);
        self.moved.notify_all();
    }

    /// True once [`Prefix::close`] was called for `generation` (or it is over).
    pub fn is_closed(&self, generation: u64) -> bool {
        let now = self.lock();
        now.generation != generation || now.closed == Some(generation) || now.stopped
    }

    /// The receiver shuts down: every wait ends (a blocked thread would hold the runtime's
    /// shutdown).
    pub fn stop(&self) {
        self.lock().stopped = true;
        self.moved.notify_all();
        self.renewed.notify_waiters();
    }

    /// Waits until a generation after `generation` starts (the upload reopened): false when
    /// the receiver stops first.
    pub async fn next_generation(&self, generation: u64) -> bool {
        loop {
            let notified = self.renewed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a change between the two is not missed.
            notified.as_mut().enable();
            {
                let now = self.lock();
                if now.stopped {
                    return false;
                }
                if now.generation != generation {
                    return true;
                }
            }
            notified.await;
        }
    }

    /// Waits until the prefix of `generation` holds at least `need` bytes, and answers its
    /// length. Bytes already there are answered even after [`Prefix::close`]; a wait that
    /// would block then ends with [`Gone::Closed`].
    pub fn wait(&self, generation: u64, need: u64) -> Result<u64, Gone> {
        let mut now = self.lock();
        loop {
            if now.generation != generation {
                return Err(Gone::Reopened);
            }
            if now.len >= need {
                return Ok(now.len);
            }
            if now.closed == Some(generation) || now.stopped {
                return Err(Gone::Closed);
            }
            now = self.moved.wait(now).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A blocking reader of the data file that, at the end of the prefix, waits for it to grow:
/// the archive code reads the upload as a stream while it arrives. It ends at `size` (the
/// declared size: the prefix never grows past it).
pub struct FollowReader {
    file: Arc<File>,
    prefix: Arc<Prefix>,
    generation: u64,
    pos: u64,
    size: u64,
}

impl FollowReader {
    /// A reader from byte 0 of the prefix of `generation`.
    pub fn new(file: Arc<File>, prefix: Arc<Prefix>, generation: u64, size: u64) -> Self {
        FollowReader {
            file,
            prefix,
            generation,
            pos: 0,
            size,
        }
    }
}

impl Read for FollowReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() || self.pos >= self.size {
            return Ok(0);
        }
        let len = self
            .prefix
            .wait(self.generation, self.pos + 1)
            .map_err(io::Error::other)?;
        let n = (len - self.pos).min(buf.len() as u64) as usize;
        let n = self.file.read_at(&mut buf[..n], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for FollowReader {
    /// Moves without waiting: the next read waits for the bytes there.
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::other("seek before the start of the upload"))?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_when_the_prefix_grows_or_the_upload_is_reopened() {
        let p = Arc::new(Prefix::default());
        p.publish(0, 10);
        assert_eq!(p.wait(0, 5), Ok(10));
        let waiter = {
            let p = p.clone();
            std::thread::spawn(move || p.wait(0, 20))
        };
        p.publish(0, 25);
        assert_eq!(waiter.join().unwrap(), Ok(25));
        let waiter = {
            let p = p.clone();
            std::thread::spawn(move || p.wait(0, 30))
        };
        p.publish(1, 0);
        assert_eq!(waiter.join().unwrap(), Err(Gone::Reopened));
        p.close(1);
        assert_eq!(p.wait(1, 0), Ok(0));
        assert_eq!(p.wait(1, 1), Err(Gone::Closed));
    }

    #[tokio::test]
    async fn a_new_generation_or_the_stop_wakes_the_follower() {
        let p = Arc::new(Prefix::default());
        let waiter = tokio::spawn({
            let p = p.clone();
            async move { p.next_generation(0).await }
        });
        p.publish(0, 100);
        p.publish(1, 0);
        assert!(waiter.await.unwrap());
        let waiter = tokio::spawn({
            let p = p.clone();
            async move { p.next_generation(1).await }
        });
        p.stop();
        assert!(!waiter.await.unwrap());
    }
}
