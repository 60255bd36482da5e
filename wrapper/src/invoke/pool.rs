//! Persistent mode: `RUNR_WORKERS` long-lived processes, one request at a time each, spoken to
//! in JSON lines: the envelope as one line on stdin, the answer as the first stdout line that
//! parses as JSON (other lines, and every line printed while idle, go to the logs). Requests
//! queue for a free worker; a worker that exits is restarted with backoff.
//!
//! A request written to a worker that exits without having read any of it (it exited right
//! after its previous answer, before the wrapper noticed) was never delivered: it goes back in
//! line for another worker instead of failing. The wrapper keeps a reading end of each
//! worker's stdin pipe to tell: what the worker did not read is still in the pipe.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot, watch, Mutex};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{code_dir, Ended, Outcome, MAX_OUTPUT};
use crate::config::Config;
use crate::envelope::{EnvelopeStream, Request};
use crate::process::{self, program_line, Drained, Line, Process};
use crate::response;

/// Restart delay after a worker that served a request or ran long enough.
const RESTART_DELAY: Duration = Duration::from_millis(100);
/// A worker that lived this long counts as healthy even if it served nothing.
const HEALTHY_RUN: Duration = Duration::from_secs(10);
/// Cap of the doubling restart delay of a crash-looping worker.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(5);
/// How long a stopping worker gets between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// How many more times than there are workers one request is written to at most when each
/// worker exits without reading it (a worker that just answered and is exiting costs one; a
/// crash-looping pool ends the request with a 502 after this many restarts).
const EXTRA_DELIVERIES: u32 = 2;

/// A queued request.
struct Job {
    req: Arc<Request>,
    deadline: Instant,
    reply: oneshot::Sender<Outcome>,
    /// Workers it was written to that exited without reading any of it.
    undelivered: u32,
}

/// The worker pool.
pub struct Pool {
    queue: mpsc::UnboundedSender<Job>,
    stop: watch::Sender<bool>,
    slots: std::sync::Mutex<Vec<JoinHandle<()>>>,
    workers: usize,
    timeout: Duration,
}

/// What every slot needs to start its worker.
struct Spec {
    command: Vec<String>,
    cwd: Option<PathBuf>,
    /// Jobs in line. Unbounded here because the server's admission control lets at most one
    /// request per worker in (the line in front of it is bounded by `RUNR_MAX_QUEUE`); an
    /// undelivered job comes back through `requeue`.
    queue: Mutex<mpsc::UnboundedReceiver<Job>>,
    requeue: mpsc::UnboundedSender<Job>,
    stop: watch::Receiver<bool>,
    /// Workers one request may be written to at most (see [`EXTRA_DELIVERIES`]).
    max_deliveries: u32,
}

impl Pool {
    /// Starts `config.workers` slots, each starting its worker right away. Must run inside the
    /// tokio runtime.
    pub fn start(config: &Config) -> Pool {
        let (tx, rx) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = watch::channel(false);
        let spec = Arc::new(Spec {
            command: config.command.clone(),
            cwd: code_dir(),
            queue: Mutex::new(rx),
            requeue: tx.clone(),
            stop: stop_rx,
            max_deliveries: u32::try_from(config.workers).unwrap_or(u32::MAX) + EXTRA_DELIVERIES,
        });
        let slots = (0..config.workers)
            .map(|slot| tokio::spawn(run_slot(slot, spec.clone())))
            .collect();
        Pool {
            queue: tx,
            stop: stop_tx,
            slots: std::sync::Mutex::new(slots),
            workers: config.workers,
            timeout: config.timeout,
        }
    }

    /// How many requests the workers take at once.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Queues `req` for the next free worker and waits for its answer until `deadline`.
    pub async fn invoke(&self, req: &Arc<Request>, deadline: Instant) -> Outcome {
        let (tx, rx) = oneshot::channel();
        let job = Job {
            req: req.clone(),
            deadline,
            reply: tx,
            undelivered: 0,
        };
        if self.queue.send(job).is_err() {
            return unavailable();
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_dropped)) => unavailable(),
            Err(_elapsed) => Outcome::timed_out(self.timeout),
        }
    }

    /// Stops every worker: SIGTERM to its group, SIGKILL after [`STOP_GRACE`]. Call after the
    /// server has drained; a worker busy with a request finishes it first.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        let slots = std::mem::take(&mut *self.slots.lock().unwrap_or_else(|e| e.into_inner()));
        for slot in slots {
            let _ = slot.await;
        }
    }
}

fn unavailable() -> Outcome {
    Outcome::failed(
        Ended::Unavailable,
        StatusCode::SERVICE_UNAVAILABLE,
        "no handler process is available",
    )
}

fn worker_exited() -> Outcome {
    Outcome::failed(
        Ended::WorkerExited,
        StatusCode::BAD_GATEWAY,
        "handler process exited",
    )
}

/// The restart policy: 100 ms after a worker that served a request or ran for at least 10 s,
/// otherwise a delay that doubles per quick failure, up to 5 s.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: RESTART_DELAY,
        }
    }
}

impl Backoff {
    /// The delay before restarting a worker that ended after `ran` and did (not) serve.
    pub fn delay(&mut self, served: bool, ran: Duration) -> Duration {
        if served || ran >= HEALTHY_RUN {
            self.next = RESTART_DELAY * 2;
            return RESTART_DELAY;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(MAX_RESTART_DELAY);
        delay
    }
}

/// One slot: starts its worker, feeds it requests, restarts it when it ends, stops it when the
/// pool stops.
async fn run_slot(slot: usize, spec: Arc<Spec>) {
    let mut backoff = Backoff::default();
    let mut stop = spec.stop.clone();
    loop {
        if *stop.borrow() {
            return;
        }
        let started = Instant::now();
        let served = match start_worker(slot, &spec) {
            Ok(worker) => serve(slot, worker, &spec, &mut stop).await,
            Err(e) => {
                tracing::error!(slot, command = ?spec.command, error = %e, "worker failed to start");
                false
            }
        };
        if *stop.borrow() {
            return;
        }
        let delay = backoff.delay(served, started.elapsed());
        tracing::info!(
            slot,
            delay_ms = delay.as_millis() as u64,
            "restarting worker"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
    }
}

/// A running worker and its protocol ends.
struct Worker {
    proc: Process,
    stdin: pipe::Sender,
    /// A reading end of the worker's stdin pipe, never read while the worker lives: once it is
    /// gone, what is left in the pipe is what it did not read.
    stdin_unread: OwnedFd,
    stdout: BufReader<pipe::Receiver>,
    /// The stdout line being read. It outlives each read so that a read cancelled by `serve()`'s
    /// select (a job won) loses no bytes: `read_line_capped` only suspends in `fill_buf`, and
    /// whatever it consumed before is already here.
    line: Vec<u8>,
    /// Whether stdout is still open; after EOF it is no longer read while idle.
    stdout_open: bool,
}

fn start_worker(slot: usize, spec: &Spec) -> std::io::Result<Worker> {
    let stdin = process::stdin_pipe()?;
    let mut cmd = Command::new(&spec.command[0]);
    cmd.args(&spec.command[1..])
        .env("RUNR_WORKER", slot.to_string())
        .stdin(stdin.child)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(dir) = &spec.cwd {
        cmd.current_dir(dir);
    }
    let mut proc = process::spawn(&mut cmd)?;
    if let Some(stderr) = proc.stderr.take() {
        process::forward_lines(stderr);
    }
    let stdout = proc
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("worker stdout missing"))?;
    tracing::info!(slot, pid = proc.id(), "worker started");
    Ok(Worker {
        proc,
        stdin: stdin.writer,
        stdin_unread: stdin.unread,
        stdout: BufReader::with_capacity(64 * 1024, stdout),
        line: Vec::with_capacity(1024),
        stdout_open: true,
    })
}

/// How a request to a worker went.
enum Exchange {
    /// It answered; `clean` when it had read the whole request line first (so the next line it
    /// reads is the next request's).
    Answer {
        outcome: Outcome,
        clean: bool,
    },
    /// It is gone (exited, or closed stdout) without answering; `written` bytes of the request
    /// line had gone into its stdin.
    Exited {
        written: usize,
    },
    TooLarge,
}

/// Feeds `worker` requests until it ends or the pool stops. Returns whether it answered any.
async fn serve(
    slot: usize,
    mut worker: Worker,
    spec: &Spec,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let mut served = false;
    loop {
        let job = tokio::select! {
            // In this order: a worker known to be gone must not be handed a request.
            biased;
            _ = stop.changed() => {
                stop_worker(slot, worker).await;
                return served;
            }
            exit = worker.proc.wait() => {
                tracing::warn!(slot, status = exit.code(), "worker exited");
                return served;
            }
            read = process::read_line_capped(
                &mut worker.stdout,
                &mut worker.line,
                MAX_OUTPUT + 1,
            ),
                if worker.stdout_open =>
            {
                match read {
                    // No request is in flight, so this line answers nothing, even if it is JSON;
                    // left in the pipe it would be taken as the next request's answer.
                    Ok(Line::Complete) => {
                        program_line(&worker.line);
                        worker.line.clear();
                    }
                    Ok(Line::TooLong) => {
                        tracing::warn!(
                            slot,
                            "worker printed a line over the output limit while idle; replacing it"
                        );
                        worker.proc.signal_group(Signal::SIGKILL);
                        let exit = worker.proc.wait().await;
                        tracing::warn!(slot, status = exit.code(), "worker exited");
                        return served;
                    }
                    // The worker is exiting; the wait branch sees it end.
                    Err(_) | Ok(Line::Eof) => {
                        if !worker.line.is_empty() {
                            program_line(&worker.line);
                            worker.line.clear();
                        }
                        worker.stdout_open = false;
                    }
                }
                continue;
            }
            job = async { spec.queue.lock().await.recv().await } => match job {
                Some(job) => job,
                None => return served,
            },
        };
        // Its requester gave up (timeout or client gone) while it queued.
        if job.reply.is_closed() || Instant::now() >= job.deadline {
            continue;
        }
        let exchange = tokio::time::timeout_at(job.deadline, exchange(&mut worker, &job.req)).await;
        let (outcome, keep) = match exchange {
            Ok(Exchange::Answer { outcome, clean }) => {
                served = true;
                (outcome, clean)
            }
            Ok(Exchange::Exited { written }) => {
                // The protocol state is unknown now: make sure the whole group is gone before
                // looking at what it left unread.
                worker.proc.signal_group(Signal::SIGKILL);
                let exit = worker.proc.wait().await;
                tracing::warn!(slot, status = exit.code(), "worker exited");
                drop(worker.stdin);
                let unread = count_unread(&worker.stdin_unread);
                if unread == written && job.undelivered + 1 < spec.max_deliveries {
                    tracing::info!(slot, id = %job.req.id, "worker exited before reading the request; it goes to another worker");
                    let mut job = job;
                    job.undelivered += 1;
                    if let Err(mpsc::error::SendError(job)) = spec.requeue.send(job) {
                        let _ = job.reply.send(worker_exited());
                    }
                } else {
                    let _ = job.reply.send(worker_exited());
                }
                return served;
            }
            Ok(Exchange::TooLarge) => (Outcome::output_too_large(), false),
            // The requester answers 504 itself at the same deadline.
            Err(_elapsed) => {
                tracing::warn!(
                    slot,
                    pid = worker.proc.id(),
                    "worker ran into the timeout; killing it"
                );
                worker.proc.signal_group(Signal::SIGKILL);
                worker.proc.wait().await;
                return served;
            }
        };
        let _ = job.reply.send(outcome);
        if !keep {
            // The protocol state is unknown now: make sure the whole group is gone.
            worker.proc.signal_group(Signal::SIGKILL);
            let exit = worker.proc.wait().await;
            tracing::warn!(slot, status = exit.code(), "worker exited");
            return served;
        }
    }
}

/// Writes one request line and reads stdout until a line parses as JSON, both at once (a
/// worker that prints while it reads a long line must not deadlock against us).
///
/// A line the worker began while idle (`worker.line` not empty) is completed first and logged
/// whatever it holds: it started before the request was written, so it cannot be the answer.
/// It still counts against the output limit as one line. A whole line that reached the pipe
/// just as the job was taken is indistinguishable from an answer; that race is the protocol's.
async fn exchange(worker: &mut Worker, req: &Request) -> Exchange {
    let Worker {
        proc,
        stdin,
        stdout,
        line,
        ..
    } = worker;
    let written = AtomicUsize::new(0);
    let write = write_line(stdin, req, &written);
    tokio::pin!(write);
    // Whether the whole line went in; `None` while it is being written.
    let mut complete: Option<bool> = None;
    let mut idle_tail = !line.is_empty();
    loop {
        let read = tokio::select! {
            ok = &mut write, if complete.is_none() => {
                complete = Some(ok);
                continue;
            }
            _ = proc.wait() => {
                // It exited. Whatever it wrote is in the pipe already; a grandchild holding
                // stdout must not keep us waiting for EOF, so read only that.
                let mut rest = stdout.buffer().to_vec();
                stdout.consume(rest.len());
                if process::read_ready(stdout.get_ref(), &mut rest, MAX_OUTPUT + 1)
                    == Drained::OverCap
                {
                    return Exchange::TooLarge;
                }
                return match answer_in(&rest, line, idle_tail) {
                    Some(Ok(outcome)) => Exchange::Answer {
                        outcome,
                        clean: false,
                    },
                    Some(Err(())) => Exchange::TooLarge,
                    None => Exchange::Exited {
                        written: written.load(Ordering::Relaxed),
                    },
                };
            }
            read = process::read_line_capped(stdout, line, MAX_OUTPUT + 1) => read,
        };
        match read {
            Err(_) | Ok(Line::Eof) => {
                // What it began to write before it went is only logs.
                if !line.is_empty() {
                    program_line(line);
                    line.clear();
                }
                return Exchange::Exited {
                    written: written.load(Ordering::Relaxed),
                };
            }
            Ok(Line::TooLong) => return Exchange::TooLarge,
            Ok(Line::Complete) => {
                if let Some(outcome) = answer_line(line, idle_tail) {
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

/// A complete stdout line during a request: the answer when it parses as JSON (and did not
/// begin while the worker was idle), else a log line. Clears `line`.
fn answer_line(line: &mut Vec<u8>, idle_tail: bool) -> Option<Outcome> {
    let text = line.trim_ascii();
    let answer = match serde_json::from_slice(text) {
        Ok(value) if !idle_tail => {
            Some(Outcome::answered(response::from_worker_value(value, text)))
        }
        // A stray print, or the end of a line begun while idle: logs, not protocol.
        _ => {
            program_line(line);
            None
        }
    };
    line.clear();
    answer
}

/// The answer among the last bytes an exited worker wrote (`line` holds the start of the first
/// line): `Some(Err)` when a line is over the limit, `None` when no line answers.
fn answer_in(rest: &[u8], line: &mut Vec<u8>, mut idle_tail: bool) -> Option<Result<Outcome, ()>> {
    let mut lines = rest.split_inclusive(|&b| b == b'\n').peekable();
    while let Some(piece) = lines.next() {
        line.extend_from_slice(piece);
        if line.len() > MAX_OUTPUT + 1 {
            return Some(Err(()));
        }
        // The last piece without a newline is an unfinished line: only logs.
        if !piece.ends_with(b"\n") && lines.peek().is_none() {
            program_line(line);
            line.clear();
            return None;
        }
        if let Some(outcome) = answer_line(line, idle_tail) {
            return Some(Ok(outcome));
        }
        idle_tail = false;
    }
    None
}

/// Writes the envelope of `req` and a newline, counting in `written` what the pipe took.
/// Returns whether all of it went in.
async fn write_line(w: &mut pipe::Sender, req: &Request, written: &AtomicUsize) -> bool {
    let mut envelope = EnvelopeStream::new(req);
    let mut piece = Vec::new();
    loop {
        let more = envelope.next_piece(&mut piece);
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

/// SIGTERM to the worker's group, SIGKILL after [`STOP_GRACE`].
async fn stop_worker(slot: usize, mut worker: Worker) {
    drop(worker.stdin);
    worker.proc.signal_group(Signal::SIGTERM);
    if tokio::time::timeout(STOP_GRACE, worker.proc.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            slot,
            pid = worker.proc.id(),
            "worker ignored SIGTERM; killing it"
        );
        worker.proc.signal_group(Signal::SIGKILL);
        worker.proc.wait().await;
    }
    tracing::info!(slot, "worker stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_for_quick_failures_up_to_5s() {
        let mut b = Backoff::default();
        let quick = Duration::from_millis(10);
        let delays: Vec<u64> = (0..9)
            .map(|_| b.delay(false, quick).as_millis() as u64)
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    }

    #[test]
    fn backoff_resets_after_serving_or_a_long_run() {
        let mut b = Backoff::default();
        let quick = Duration::from_millis(10);
        b.delay(false, quick);
        b.delay(false, quick);
        assert_eq!(b.delay(true, quick), RESTART_DELAY);
        assert_eq!(b.delay(false, quick), Duration::from_millis(200));
        assert_eq!(b.delay(false, HEALTHY_RUN), RESTART_DELAY);
    }
}
