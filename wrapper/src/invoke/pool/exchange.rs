//! The exchange with one worker over its pipes, in JSON lines: the envelope as one line on its
//! stdin, the answer as the first line of the answer channel that parses as JSON; every other
//! line, and what comes on its other pipes, goes to the logs.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;

use super::super::{Outcome, MAX_OUTPUT};
use crate::envelope::{self, WRITE_CHUNK};
use crate::observe::logs::{HandlerLog, Stream};
use crate::process::lines::{self, LinePipe};
use crate::process::{self, Drained, Line, Process};
use crate::request::Request;
use crate::response;

/// The line a worker writes, with `RUNR_WORKER_READY=1`, once it can take requests.
const READY_KEY: &str = "ready";

/// A worker's pipes, apart from its process so both can be awaited at once.
pub(super) struct WorkerIo {
    stdin: Option<pipe::Sender>,
    /// A reading end of the worker's stdin pipe, never read while the worker lives: once it is
    /// gone, what is left in the pipe is what it did not read.
    stdin_unread: OwnedFd,
    /// The answer channel: stdout, or fd 3.
    answers: BufReader<pipe::Receiver>,
    /// The answer-channel line being read. It outlives each read so that a read cancelled by
    /// a `select!` (a job won) loses no bytes: `read_line_capped` only suspends in `fill_buf`,
    /// and whatever it consumed before is already here.
    pub(super) line: Vec<u8>,
    /// Whether the answer channel is still open; after EOF it is no longer read.
    answers_open: bool,
    /// What the stream of the answer channel's non-answer lines is called in the logs.
    answers_stream: Stream,
    stderr: Option<LinePipe>,
    /// Stdout, when fd 3 answers: all of it goes to the logs.
    stdout_log: Option<LinePipe>,
}

/// What came on the answer channel.
pub(super) enum Read {
    /// A whole line, in `io.line`.
    Line,
    /// A line over the output limit (part of it in `io.line`).
    TooLong,
    /// EOF: the worker is gone or going.
    Closed,
}

impl WorkerIo {
    /// The pipes of `proc`, spawned with piped stdout and stderr (and fd 3 when it answers
    /// there) and the stdin pipe `stdin` (`unread`: its reading end).
    pub(super) fn new(
        stdin: pipe::Sender,
        unread: OwnedFd,
        proc: &mut Process,
    ) -> io::Result<WorkerIo> {
        let stdout = proc
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("worker stdout missing"))?;
        let stderr = proc.stderr.take().map(|r| LinePipe::new(r, Stream::Stderr));
        let (answers, stdout_log) = match proc.result.take() {
            Some(result) => (result, Some(LinePipe::new(stdout, Stream::Stdout))),
            None => (stdout, None),
        };
        Ok(WorkerIo {
            stdin: Some(stdin),
            stdin_unread: unread,
            answers: BufReader::with_capacity(64 * 1024, answers),
            line: Vec::with_capacity(1024),
            answers_open: true,
            answers_stream: Stream::Stdout,
            stderr,
            stdout_log,
        })
    }

    /// EOF on the worker's stdin.
    pub(super) fn close(&mut self) {
        drop(self.stdin.take());
    }

    /// The bytes of what was written to the worker's stdin that it did not read; call once it
    /// is gone (closes its stdin).
    pub(super) fn unread(&mut self) -> usize {
        self.close();
        count_unread(&self.stdin_unread)
    }

    /// Whether the complete line read is the ready handshake; taken if it is.
    pub(super) fn ready_line(&mut self) -> bool {
        let ready = is_ready_line(&self.line);
        if ready {
            self.line.clear();
        }
        ready
    }

    /// Reads the worker's pipes until something comes on the answer channel, logging what
    /// comes on the others into `log` meanwhile. Cancel-safe. Once the answer channel is
    /// closed it only logs (and waits forever once everything is closed): the caller races
    /// the worker's exit.
    pub(super) async fn next(&mut self, log: &mut HandlerLog) -> Read {
        loop {
            let stderr_open = self.stderr.as_ref().is_some_and(LinePipe::is_open);
            let stdout_open = self.stdout_log.as_ref().is_some_and(LinePipe::is_open);
            if !self.answers_open && !stderr_open && !stdout_open {
                return std::future::pending().await;
            }
            tokio::select! {
                read = process::read_line_capped(&mut self.answers, &mut self.line, MAX_OUTPUT + 1),
                    if self.answers_open => return match read {
                    Ok(Line::Complete) => Read::Line,
                    Ok(Line::TooLong) => Read::TooLong,
                    Err(_) | Ok(Line::Eof) => {
                        self.answers_open = false;
                        // A last line without its newline: logs, not protocol.
                        if !self.line.is_empty() {
                            self.log_line(log);
                        }
                        Read::Closed
                    }
                },
                () = lines::fill(&mut self.stderr), if stderr_open => lines::flush(&mut self.stderr, log),
                () = lines::fill(&mut self.stdout_log), if stdout_open => lines::flush(&mut self.stdout_log, log),
            }
        }
    }

    /// Logs the pending answer-channel line and clears it.
    pub(super) fn log_line(&mut self, log: &mut HandlerLog) {
        log.line(self.answers_stream, &self.line);
        self.line.clear();
    }

    /// Before a request is written: everything the worker wrote until now was written while
    /// idle, so it goes to `idle`: the log pipes' lines, and the answer channel's complete
    /// lines (even JSON ones: they cannot answer a request not written yet). A line it is in
    /// the middle of stays in `line`, where [`exchange`] knows it began while idle.
    pub(super) fn drain_idle(&mut self, idle: &mut HandlerLog) {
        self.drain_logs(idle);
        if !self.answers_open {
            return;
        }
        // What the BufReader holds already, then what the pipe holds (read(2): see
        // process::lines on tokio's cached readiness).
        let buffered = self.answers.buffer().to_vec();
        let consumed = buffered.len();
        std::pin::Pin::new(&mut self.answers).consume(consumed);
        self.take_idle(&buffered, idle);
        let mut chunk = [0u8; 8192];
        while self.answers_open {
            match lines::read_now(self.answers.get_ref(), &mut chunk) {
                Ok(0) => self.answers_open = false,
                Ok(n) => self.take_idle(&chunk[..n], idle),
                Err(_) => break,
            }
        }
    }

    /// Splits idle answer-channel output into log lines, keeping an unfinished one in `line`.
    fn take_idle(&mut self, mut data: &[u8], idle: &mut HandlerLog) {
        while let Some(i) = data.iter().position(|&b| b == b'\n') {
            self.line.extend_from_slice(&data[..=i]);
            self.log_line(idle);
            data = &data[i + 1..];
        }
        self.line.extend_from_slice(data);
        // An idle line that never ends is logged in pieces rather than held.
        if self.line.len() > MAX_OUTPUT {
            self.log_line(idle);
        }
    }

    /// Logs every line the log pipes hold right now.
    pub(super) fn drain_logs(&mut self, log: &mut HandlerLog) {
        for p in [&mut self.stderr, &mut self.stdout_log]
            .into_iter()
            .flatten()
        {
            p.drain_now(log);
        }
    }
}

/// True when `line` is the ready handshake, `{"ready":true}` (any spacing).
fn is_ready_line(line: &[u8]) -> bool {
    matches!(
        serde_json::from_slice::<serde_json::Value>(line.trim_ascii()),
        Ok(serde_json::Value::Object(m)) if m.get(READY_KEY) == Some(&serde_json::Value::Bool(true))
    )
}

/// How a request to a worker went.
pub(super) enum Exchange {
    /// It answered; `clean` when it had read the whole request line first (so the next line it
    /// reads is the next request's).
    Answer {
        outcome: Outcome,
        clean: bool,
    },
    /// It is gone (exited, or closed its answer channel) without answering; `written` bytes of
    /// the request line had gone into its stdin.
    Exited {
        written: usize,
    },
    TooLarge,
}

/// Writes one request line and reads the answer channel until a line parses as JSON, both at
/// once (a worker that prints while it reads a long line must not deadlock against us), with
/// the worker's log pipes read alongside into `log`.
///
/// A line the worker began while idle (`io.line` not empty) is completed first and logged
/// whatever it holds: it started before the request was written, so it cannot be the answer.
/// It still counts against the output limit as one line. Whole lines written before the
/// request were taken out by [`WorkerIo::drain_idle`], so a JSON line printed while idle is
/// never taken for the answer.
pub(super) async fn exchange(
    io: &mut WorkerIo,
    proc: &mut Process,
    req: &Request,
    log: &mut HandlerLog,
) -> Exchange {
    let WorkerIo {
        stdin,
        answers,
        line,
        answers_open,
        answers_stream,
        stderr,
        stdout_log,
        ..
    } = io;
    let stream = *answers_stream;
    let (true, Some(stdin)) = (*answers_open, stdin.as_mut()) else {
        return Exchange::Exited { written: 0 };
    };
    let written = AtomicUsize::new(0);
    let write = write_line(stdin, req, &written);
    tokio::pin!(write);
    // Whether the whole line went in; `None` while it is being written.
    let mut complete: Option<bool> = None;
    let mut idle_tail = !line.is_empty();
    loop {
        let stderr_open = stderr.as_ref().is_some_and(LinePipe::is_open);
        let stdout_open = stdout_log.as_ref().is_some_and(LinePipe::is_open);
        let read = tokio::select! {
            ok = &mut write, if complete.is_none() => {
                complete = Some(ok);
                continue;
            }
            _ = proc.wait() => {
                let written = written.load(Ordering::Relaxed);
                return after_exit(answers, line, idle_tail, log, stream, written);
            }
            () = lines::fill(stderr), if stderr_open => {
                lines::flush(stderr, log);
                continue;
            }
            () = lines::fill(stdout_log), if stdout_open => {
                lines::flush(stdout_log, log);
                continue;
            }
            read = process::read_line_capped(answers, line, MAX_OUTPUT + 1) => read,
        };
        match read {
            Err(_) | Ok(Line::Eof) => {
                *answers_open = false;
                // What it began to write before it went is only logs.
                if !line.is_empty() {
                    log.line(stream, line);
                    line.clear();
                }
                return Exchange::Exited {
                    written: written.load(Ordering::Relaxed),
                };
            }
            Ok(Line::TooLong) => return Exchange::TooLarge,
            Ok(Line::Complete) => {
                if let Some(outcome) = answer_line(line, idle_tail, log, stream) {
                    return Exchange::Answer {
                        outcome,
                        clean: complete == Some(true),
                    };
                }
                idle_tail = false;
            }
        }
    }
}

/// The answer of a worker that exited during a request, if it wrote one before it went (or
/// how its request ended otherwise). Whatever it wrote is in the pipe already; a grandchild
/// holding the pipe must not keep us waiting for EOF, so only that is read.
fn after_exit(
    answers: &mut BufReader<pipe::Receiver>,
    line: &mut Vec<u8>,
    idle_tail: bool,
    log: &mut HandlerLog,
    stream: Stream,
    written: usize,
) -> Exchange {
    let mut rest = answers.buffer().to_vec();
    answers.consume(rest.len());
    if process::read_ready(answers.get_ref(), &mut rest, MAX_OUTPUT + 1) == Drained::OverCap {
        return Exchange::TooLarge;
    }
    match answer_in(&rest, line, idle_tail, log, stream) {
        Some(Ok(outcome)) => Exchange::Answer {
            outcome,
            clean: false,
        },
        Some(Err(())) => Exchange::TooLarge,
        None => Exchange::Exited { written },
    }
}

/// A complete answer-channel line during a request: the answer when it parses as JSON (and
/// did not begin while the worker was idle), else a log line. Clears `line`.
fn answer_line(
    line: &mut Vec<u8>,
    idle_tail: bool,
    log: &mut HandlerLog,
    stream: Stream,
) -> Option<Outcome> {
    let text = line.trim_ascii();
    let answer = match serde_json::from_slice(text) {
        Ok(value) if !idle_tail => {
            Some(Outcome::answered(response::from_worker_value(value, text)))
        }
        // A stray print, or the end of a line begun while idle: logs, not protocol.
        _ => {
            log.line(stream, line);
            None
        }
    };
    line.clear();
    answer
}

/// The answer among the last bytes an exited worker wrote (`line` holds the start of the first
/// line): `Some(Err)` when a line is over the limit, `None` when no line answers.
fn answer_in(
    rest: &[u8],
    line: &mut Vec<u8>,
    mut idle_tail: bool,
    log: &mut HandlerLog,
    stream: Stream,
) -> Option<Result<Outcome, ()>> {
    let mut lines = rest.split_inclusive(|&b| b == b'\n').peekable();
    while let Some(piece) = lines.next() {
        line.extend_from_slice(piece);
        if line.len() > MAX_OUTPUT + 1 {
            return Some(Err(()));
        }
        // The last piece without a newline is an unfinished line: only logs.
        if !piece.ends_with(b"\n") && lines.peek().is_none() {
            log.line(stream, line);
            line.clear();
            return None;
        }
        if let Some(outcome) = answer_line(line, idle_tail, log, stream) {
            return Some(Ok(outcome));
        }
        idle_tail = false;
    }
    None
}

/// Writes the envelope of `req` and a newline, counting in `written` what the pipe took.
/// Returns whether all of it went in.
async fn write_line(w: &mut pipe::Sender, req: &Request, written: &AtomicUsize) -> bool {
    let mut envelope = envelope::encode(req);
    let mut piece = Vec::new();
    loop {
        let more = envelope.fill(&mut piece, WRITE_CHUNK);
        if !more {
            piece.push(b'\n');
        }
        let mut at = 0;
        while at < piece.len() {
            match w.write(&piece[at..]).await {
                Ok(n) => {
                    at += n;
                    written.fetch_add(n, Ordering::Relaxed);
                }
                Err(_) => return false,
            }
        }
        if !more {
            return true;
        }
        piece.clear();
    }
}

/// The bytes left in a dead worker's stdin pipe (our writing end closed, so reads end at EOF
/// and never block).
fn count_unread(unread: &OwnedFd) -> usize {
    let mut chunk = [0u8; 8192];
    let mut total = 0;
    loop {
        match nix::unistd::read(unread.as_raw_fd(), &mut chunk) {
            Ok(0) => return total,
            Ok(n) => total += n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line() {
        assert!(is_ready_line(b"{\"ready\":true}\n"));
        assert!(is_ready_line(b"  { \"ready\" : true, \"pid\": 7 }\r\n"));
        for no in [
            &b"{\"ready\":false}\n"[..],
            b"{\"ready\":\"true\"}\n",
            b"ready\n",
            b"[true]\n",
            b"{\"statusCode\":200}\n",
            b"\xff\n",
        ] {
            assert!(!is_ready_line(no), "{no:?}");
        }
    }
}
