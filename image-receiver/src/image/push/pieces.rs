//! The pieces of a request body that a blocking thread makes: a layer read as it arrives, as it
//! is or gzip'ed (`chunked`), a blob fed by the walk of a compressed archive (`teed`), a layer
//! gzip'ed into the body ([`super::Pusher::push_gzipping`]).
//!
//! A body has at most [`PIECES`] buffers of [`BLOCK`] bytes: each goes to the request as
//! `Bytes` and comes back to the body's maker once the request is done with it, and the maker
//! waits for one to come back before it makes more. However slow the registry, however fast
//! the maker, a body holds the same two buffers from its first byte to its last.
//!
//! The buffers come from one pool for the whole process and go back to it when the body ends:
//! they are allocated once, whichever threads make the bodies that come after (a buffer made
//! anew for each body would land in the allocator arena of whichever blocking thread made it,
//! and each arena keeps what it once held).

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Mutex;

use bytes::Bytes;
use futures_util::Stream;

use super::{stream_error, Item, Sent, BLOCK};

/// Buffers of one body at once: one being written to the registry, one being made.
const PIECES: usize = 2;

/// Buffers the pool keeps between bodies: those of four bodies at once (the pushes at once,
/// `pipeline::PUSH_CONCURRENCY`); a buffer coming back to a full pool is freed.
const POOLED: usize = 8;

static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

fn from_pool() -> Vec<u8> {
    let pooled = POOL.lock().unwrap_or_else(|e| e.into_inner()).pop();
    pooled.unwrap_or_else(|| Vec::with_capacity(BLOCK))
}

fn to_pool(buf: Vec<u8>) {
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if pool.len() < POOLED {
        pool.push(buf);
    }
}

/// The buffers of one body, and what its maker gathers into the next piece.
pub(super) struct Pieces {
    /// The body's buffers that came back.
    free: Receiver<Vec<u8>>,
    back: SyncSender<Vec<u8>>,
    /// Buffers taken from the pool for this body (at most [`PIECES`]).
    taken: usize,
    /// The piece being gathered by [`Pieces::write`].
    filling: Option<Vec<u8>>,
}

impl Pieces {
    pub(super) fn new() -> Pieces {
        let (back, free) = sync_channel(PIECES);
        Pieces {
            free,
            back,
            taken: 0,
            filling: None,
        }
    }

    /// An empty buffer (of [`BLOCK`] bytes' capacity) to make the next piece in: waits for one
    /// of the body's to come back when all [`PIECES`] are out.
    pub(super) fn take(&mut self) -> Vec<u8> {
        let mut buf = match self.free.try_recv() {
            Ok(buf) => buf,
            Err(_) if self.taken < PIECES => {
                self.taken += 1;
                from_pool()
            }
            Err(_) => self.free.recv().expect("the body holds a sender"),
        };
        buf.clear();
        buf
    }

    /// `buf` as a piece of the body: back to the body (or, once the body ended, to the pool)
    /// when the request drops it.
    pub(super) fn piece(&self, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Piece {
            buf,
            back: self.back.clone(),
        })
    }

    /// Gathers `data` into pieces of [`BLOCK`] bytes, handing each to `send` once it is full;
    /// false when `send` found the request gone.
    pub(super) fn write(&mut self, mut data: &[u8], send: &mut impl FnMut(Bytes) -> bool) -> bool {
        while !data.is_empty() {
            if self.filling.is_none() {
                self.filling = Some(self.take());
            }
            let filling = self.filling.as_mut().expect("set above");
            let n = (BLOCK - filling.len()).min(data.len());
            filling.extend_from_slice(&data[..n]);
            data = &data[n..];
            if filling.len() == BLOCK && !self.flush(send) {
                return false;
            }
        }
        true
    }

    /// Waits until the request is done with every piece it was handed (written, or dropped
    /// with the request).
    pub(super) fn settle(&mut self) {
        let mut home = Vec::with_capacity(PIECES);
        home.extend(self.filling.take());
        while home.len() < self.taken {
            home.push(self.free.recv().expect("the body holds a sender"));
        }
        for buf in home {
            // Room for every one of the body's pieces.
            let _ = self.back.try_send(buf);
        }
    }

    /// Hands what [`Pieces::write`] gathered to `send` (the body's end, or a piece that must
    /// go now); false when `send` found the request gone.
    pub(super) fn flush(&mut self, send: &mut impl FnMut(Bytes) -> bool) -> bool {
        match self.filling.take() {
            Some(buf) if !buf.is_empty() => send(self.piece(buf)),
            Some(buf) => {
                self.filling = Some(buf);
                true
            }
            None => true,
        }
    }
}

impl Drop for Pieces {
    fn drop(&mut self) {
        if let Some(buf) = self.filling.take() {
            to_pool(buf);
        }
        while let Ok(buf) = self.free.try_recv() {
            to_pool(buf);
        }
    }
}

/// The request body whose pieces come through `rx`, each counted in `sent` as the request takes
/// it: once the request is over, nothing more counts, whatever its maker still does (a maker
/// waiting for a piece to come back learns that the request is gone only at its next send). An
/// error from the maker ends the body short, so the upload is never committed.
pub(super) fn body(
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, String>>,
    sent: Sent,
) -> impl Stream<Item = Item> + Send + 'static {
    futures_util::stream::unfold(rx, move |mut rx| {
        let sent = sent.clone();
        async move {
            let piece = rx.recv().await?;
            if let Ok(piece) = &piece {
                sent.add(piece.len() as u64);
            }
            Some((piece.map_err(|why| stream_error(&why)), rx))
        }
    })
}

/// One buffer of a body, lent to the request.
struct Piece {
    buf: Vec<u8>,
    back: SyncSender<Vec<u8>>,
}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        // Back to the body while it lasts; it holds room for every one of its pieces.
        if let Err(e) = self.back.try_send(buf) {
            let (std::sync::mpsc::TrySendError::Full(buf)
            | std::sync::mpsc::TrySendError::Disconnected(buf)) = e;
            to_pool(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_gathers_its_bytes_into_blocks() {
        let mut pieces = Pieces::new();
        let data: Vec<u8> = (0..BLOCK * 5 / 2).map(|i| (i % 251) as u8).collect();
        let (mut got, mut lens) = (Vec::new(), Vec::new());
        // The request is done with each piece at once.
        let mut send = |b: Bytes| {
            got.extend_from_slice(&b);
            lens.push(b.len());
            true
        };
        for part in data.chunks(300_001) {
            assert!(pieces.write(part, &mut send));
        }
        assert!(pieces.flush(&mut send));
        assert!(got == data);
        assert_eq!(lens, [BLOCK, BLOCK, BLOCK / 2]);
        assert!(pieces.taken <= PIECES);
    }

    #[test]
    fn a_body_makes_its_pieces_in_its_own_two_buffers() {
        let mut pieces = Pieces::new();
        let a = pieces.take();
        let (a_at, b) = (a.as_ptr(), pieces.take());
        let (a, b) = (pieces.piece(a), pieces.piece(b));
        assert_eq!(pieces.taken, PIECES);
        // Both are out: the next is the first that comes back.
        drop(a);
        let c = pieces.take();
        assert_eq!(c.as_ptr(), a_at);
        assert!(c.is_empty() && c.capacity() >= BLOCK);
        assert_eq!(pieces.taken, PIECES);
        drop(b);
    }
}
