//! A handler's log pipe (its stderr; its stdout too when the answer comes some other way) read
//! line by line into a [`HandlerLog`], with a drain that reads what the pipe holds right now.
//!
//! Why the drain reads the pipe itself: the lines a handler wrote before it answered must carry
//! that invocation's id, so the wrapper reads them before it gives the worker the next request
//! (or finishes the exec invocation). tokio's `try_read` answers "would block" from its cached
//! readiness without asking the kernel, which can leave such lines in the pipe; a plain
//! non-blocking `read(2)` (the pipe is `O_NONBLOCK`) gets everything written so far.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{ready, Poll};

use nix::errno::Errno;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::unix::pipe;

use crate::observe::logs::{HandlerLog, Stream};

/// Longest log line forwarded as one; longer ones are split.
pub const MAX_LOG_LINE: usize = 64 * 1024;

/// One log pipe of a handler and what was read of it but not written to the logs yet.
#[derive(Debug)]
pub struct LinePipe {
    rx: pipe::Receiver,
    stream: Stream,
    /// Read, not yet logged: complete lines until [`LinePipe::flush`], then the start of a line
    /// whose newline has not come yet.
    pending: Vec<u8>,
    open: bool,
}

/// How much is read at a time.
const CHUNK: usize = 8192;

impl LinePipe {
    /// Lines of `rx`, labelled `stream`.
    pub fn new(rx: pipe::Receiver, stream: Stream) -> LinePipe {
        LinePipe {
            rx,
            stream,
            pending: Vec::new(),
            open: true,
        }
    }

    /// False once the pipe reached EOF (nothing more will come).
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Waits until output comes and reads it (EOF closes the pipe); [`LinePipe::flush`] then
    /// logs it. Cancel-safe: nothing is read unless this completes. Split from the logging so
    /// that one `select!` can wait on several pipes that log into the same [`HandlerLog`].
    pub async fn fill(&mut self) {
        match poll_read_into(&mut self.rx, &mut self.pending).await {
            Ok(0) | Err(_) => self.open = false,
            Ok(_) => {}
        }
    }

    /// Writes every complete line read so far to `log` (after EOF, the unfinished one too); a
    /// line longer than [`MAX_LOG_LINE`] is written in pieces, so none is buffered without
    /// bound.
    pub fn flush(&mut self, log: &mut HandlerLog) {
        let stream = self.stream;
        take_lines(&mut self.pending, !self.open, |line| log.line(stream, line));
    }

    /// Waits for output and logs its complete lines.
    pub async fn read(&mut self, log: &mut HandlerLog) {
        self.fill().await;
        self.flush(log);
    }

    /// Logs every line the pipe holds right now, without waiting (see the module docs). The
    /// unfinished line stays pending, unless EOF came.
    pub fn drain_now(&mut self, log: &mut HandlerLog) {
        let mut chunk = [0u8; CHUNK];
        while self.open {
            match read_now(&self.rx, &mut chunk) {
                Ok(0) => self.open = false,
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(_) => break,
            }
            if self.pending.len() >= MAX_LOG_LINE {
                self.flush(log);
            }
        }
        self.flush(log);
    }

    /// Reads until EOF, logging every line to `log` (a pipe nobody else reads any more: a
    /// finished exec handler's, whose grandchildren may still write; a stopping worker's).
    pub async fn forward_to_end(mut self, mut log: HandlerLog) {
        while self.open {
            self.read(&mut log).await;
        }
        log.finish();
    }
}

/// Takes the log lines out of `pending` (bytes read from a handler's pipe): every line ending
/// in a newline, cut into pieces of at most [`MAX_LOG_LINE`]; a run of [`MAX_LOG_LINE`] bytes
/// without one; and at `eof` whatever is left. What stays in `pending` is the start of a line
/// shorter than [`MAX_LOG_LINE`].
/// Waits until the pipe, while there is one, has lines or its end to flush; never without one
/// (a `select!` branch for a log pipe that may be absent).
pub async fn fill(p: &mut Option<LinePipe>) {
    match p {
        Some(p) => p.fill().await,
        None => std::future::pending().await,
    }
}

/// Logs what the pipe, if there is one, holds.
pub fn flush(p: &mut Option<LinePipe>, log: &mut HandlerLog) {
    if let Some(p) = p {
        p.flush(log);
    }
}

pub fn take_lines(pending: &mut Vec<u8>, eof: bool, mut emit: impl FnMut(&[u8])) {
    let mut start = 0;
    while let Some(i) = pending[start..].iter().position(|&b| b == b'\n') {
        let end = start + i + 1;
        for piece in pending[start..end].chunks(MAX_LOG_LINE) {
            emit(piece);
        }
        start = end;
    }
    while pending.len() - start >= MAX_LOG_LINE {
        emit(&pending[start..start + MAX_LOG_LINE]);
        start += MAX_LOG_LINE;
    }
    if eof && start < pending.len() {
        emit(&pending[start..]);
        start = pending.len();
    }
    pending.drain(..start);
}

/// Waits for output of `rx` and appends one read of it to `out`; `Ok(0)` at EOF. Cancel-safe.
///
/// Through a stack buffer that lives only while the pipe is polled: `out` is allocated only
/// as far as output comes (most invocations write no log line, and musl's allocator maps and
/// unmaps a heap group for an 8 KiB buffer reserved per invocation), and the buffer is no part
/// of the future, which would make every connection's request future that much larger.
pub async fn poll_read_into(rx: &mut pipe::Receiver, out: &mut Vec<u8>) -> io::Result<usize> {
    std::future::poll_fn(|cx| {
        // Uninitialised: zeroing 8 KiB at every poll (several per exec invocation) was 5 % of
        // the wrapper's user-space instructions per exec request.
        let mut chunk = [MaybeUninit::<u8>::uninit(); CHUNK];
        let mut buf = ReadBuf::uninit(&mut chunk);
        ready!(Pin::new(&mut *rx).poll_read(cx, &mut buf))?;
        out.extend_from_slice(buf.filled());
        Poll::Ready(Ok(buf.filled().len()))
    })
    .await
}

/// One `read(2)` on a non-blocking pipe: `Err(WouldBlock)` when it is empty right now.
pub fn read_now(rx: &pipe::Receiver, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match nix::unistd::read(rx.as_raw_fd(), buf) {
            Ok(n) => return Ok(n),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(io::Error::from(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference: split the whole output at newlines (kept), then cut every piece into
    /// MAX_LOG_LINE-sized ones.
    fn reference(all: &[u8]) -> Vec<Vec<u8>> {
        all.split_inclusive(|&b| b == b'\n')
            .flat_map(|l| l.chunks(MAX_LOG_LINE).map(<[u8]>::to_vec))
            .collect()
    }

    proptest! {
        /// However the output arrives in reads, the lines are the reference's, their bytes are
        /// the output's, and nothing held back is a whole line or MAX_LOG_LINE long.
        #[test]
        fn lines_do_not_depend_on_how_the_output_was_read(
            parts in proptest::collection::vec(
                prop_oneof![
                    proptest::collection::vec(any::<u8>(), 0..64),
                    proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'a')], 0..64),
                    (1usize..3).prop_map(|k| vec![b'x'; MAX_LOG_LINE * k - 1]),
                ],
                0..12,
            )
        ) {
            let all: Vec<u8> = parts.concat();
            let mut pending = Vec::new();
            let mut got = Vec::new();
            for p in &parts {
                pending.extend_from_slice(p);
                take_lines(&mut pending, false, |l| got.push(l.to_vec()));
                prop_assert!(!pending.contains(&b'\n') && pending.len() < MAX_LOG_LINE);
            }
            take_lines(&mut pending, true, |l| got.push(l.to_vec()));
            prop_assert!(pending.is_empty());
            prop_assert_eq!(got.concat(), all.clone());
            prop_assert!(got.iter().all(|l| !l.is_empty() && l.len() <= MAX_LOG_LINE));
            // A line cut because it ran to MAX_LOG_LINE before its newline came may be cut
            // where the reference would not (the rest arrived later), so compare the lines
            // only when no line reached that length.
            if reference(&all).iter().all(|l| l.len() < MAX_LOG_LINE) {
                prop_assert_eq!(got, reference(&all));
            }
        }
    }

    /// Lines of `input` as LinePipe logs them, the pipe written in `writes` pieces.
    async fn logged(writes: &[&[u8]]) -> Vec<Vec<u8>> {
        let (tx, rx) = pipe::pipe().unwrap();
        let mut pipe = LinePipe::new(rx, Stream::Stderr);
        let mut log = HandlerLog::recording();
        let mut tx = Some(tx);
        for w in writes {
            use tokio::io::AsyncWriteExt;
            tx.as_mut().unwrap().write_all(w).await.unwrap();
            pipe.drain_now(&mut log);
        }
        drop(tx.take());
        while pipe.is_open() {
            pipe.read(&mut log).await;
        }
        log.recorded()
    }

    #[tokio::test]
    async fn lines_across_writes_long_lines_split_and_the_tail_at_eof() {
        // Each write below a pipe's capacity: the test drains only between writes.
        let quarter = vec![b'x'; MAX_LOG_LINE / 4];
        let got = logged(&[
            b"ab",
            b"c\nde\n",
            &quarter,
            &quarter,
            &quarter,
            &quarter,
            b"xxxxxxxxxx",
            b"\n",
            b"tail",
        ])
        .await;
        assert_eq!(got[0], b"abc\n");
        assert_eq!(got[1], b"de\n");
        assert_eq!(got[2].len(), MAX_LOG_LINE);
        assert_eq!(got[3], [&[b'x'; 10][..], b"\n"].concat());
        assert_eq!(got[4], b"tail");
        assert_eq!(got.len(), 5);
    }

    #[tokio::test]
    async fn drain_now_gets_what_was_written_before_it() {
        use tokio::io::AsyncWriteExt;
        let (mut tx, rx) = pipe::pipe().unwrap();
        let mut pipe = LinePipe::new(rx, Stream::Stderr);
        let mut log = HandlerLog::recording();
        tx.write_all(b"one\ntwo\nthr").await.unwrap();
        // No await in between: the reactor has not polled the pipe's readiness yet.
        pipe.drain_now(&mut log);
        assert_eq!(log.recorded(), [b"one\n".to_vec(), b"two\n".to_vec()]);
        assert!(pipe.is_open());
        drop(tx);
        pipe.drain_now(&mut log);
        assert_eq!(log.recorded()[2], b"thr");
        assert!(!pipe.is_open());
    }
}
