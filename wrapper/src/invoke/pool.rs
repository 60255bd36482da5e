//! Persistent mode: `RUNR_WORKERS` long-lived processes, one request at a time each, spoken to
//! in JSON lines: the envelope as one line on stdin, the answer as the first line of the answer
//! channel (stdout, or fd 3 with `RUNR_RESULT_FD=3`) that parses as JSON. Other lines, and
//! every line printed while idle, go to the logs; a worker's stderr (and its stdout when fd 3
//! answers) is read alongside, and drained up to its answer before it gets the next request,
//! so each log line carries the invocation during which it was read. Requests queue for a free
//! worker; a worker that exits is restarted with backoff; with `RUNR_WORKER_MAX_REQUESTS` /
//! `RUNR_WORKER_MAX_AGE` a worker is replaced (its replacement started first) and wound down
//! without failing a request.
//!
//! A request written to a worker that exits without having read any of it (it exited right
//! after its previous answer, before the wrapper noticed) was never delivered: it goes back in
//! line for another worker instead of failing. The wrapper keeps a reading end of each
//! worker's stdin pipe to tell: what the worker did not read is still in the pipe.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot, watch, Mutex};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{code_dir, Ended, Outcome, MAX_OUTPUT};
use crate::config::handler::HandlerConfig;
use crate::config::Config;
use crate::envelope::{self, WRITE_CHUNK};
use crate::observe::logs::{HandlerLog, Stream, Tag};
use crate::observe::metrics::{self, Held};
use crate::process::lines::LinePipe;
use crate::process::reaper::Exit;
use crate::process::{self, Drained, Line, Process};
use crate::request::Request;
use crate::response;

/// Restart delay after a worker that served a request or ran long enough.
const RESTART_DELAY: Duration = Duration::from_millis(100);
/// A worker that lived this long counts as healthy even if it served nothing.
const HEALTHY_RUN: Duration = Duration::from_secs(10);
/// Cap of the doubling restart delay of a crash-looping worker.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(5);
/// How long a stopping worker gets between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// A recycled worker's time after EOF on stdin before SIGTERM, and after SIGTERM before
/// SIGKILL.
pub const RETIRE_GRACE: Duration = Duration::from_secs(5);
/// The line a worker writes, with `RUNR_WORKER_READY=1`, once it can take requests.
const READY_KEY: &str = "ready";
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
    tag: Tag,
    waiting: Arc<Waiting>,
}

/// A request's share of the queued gauge, given back once: by the worker that takes it or by
/// the requester that stops waiting, whichever comes first.
struct Waiting(std::sync::Mutex<Option<Held>>);

impl Waiting {
    fn leave(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Back in line (an undelivered request): counted again until left again.
    fn wait_again(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(metrics::get().queued());
    }
}

/// Gives the requester's share back when it stops waiting (answer, timeout, client gone).
struct Leave(Arc<Waiting>);

impl Drop for Leave {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// The worker pool.
pub struct Pool {
    queue: mpsc::UnboundedSender<Job>,
    stop: watch::Sender<bool>,
    slots: std::sync::Mutex<Vec<JoinHandle<()>>>,
    workers: usize,
    timeout: Duration,
    readiness: Arc<Readiness>,
}

/// What Knative's probes ask: has every slot's worker started once, and is one alive now?
#[derive(Debug)]
struct Readiness {
    started: Vec<AtomicBool>,
    alive: AtomicUsize,
}

impl Readiness {
    fn ready(&self) -> bool {
        self.started.iter().all(|s| s.load(Ordering::Relaxed))
            && self.alive.load(Ordering::Relaxed) > 0
    }
}

/// A worker counted as alive (in the probe's view and `runr_workers_alive`) until dropped.
struct Alive {
    readiness: Arc<Readiness>,
    _gauge: Held,
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.readiness.alive.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What every slot needs to start its worker.
struct Spec {
    command: Vec<String>,
    cwd: Option<PathBuf>,
    handler: HandlerConfig,
    /// How long a worker gets to say it is ready (`RUNR_TICK_WAIT`).
    ready_wait: Duration,
    /// Jobs in line. Unbounded here because the server's admission control lets at most one
    /// request per worker in (the line in front of it is bounded by `RUNR_MAX_QUEUE`); an
    /// undelivered job comes back through `requeue`.
    queue: Mutex<mpsc::UnboundedReceiver<Job>>,
    requeue: mpsc::UnboundedSender<Job>,
    stop: watch::Receiver<bool>,
    /// Workers one request may be written to at most (see [`EXTRA_DELIVERIES`]).
    max_deliveries: u32,
    readiness: Arc<Readiness>,
}

impl Spec {
    /// Marks `slot`'s worker as started and counts it alive.
    fn alive(&self, slot: usize) -> Alive {
        self.readiness.started[slot].store(true, Ordering::Relaxed);
        self.readiness.alive.fetch_add(1, Ordering::Relaxed);
        Alive {
            readiness: self.readiness.clone(),
            _gauge: metrics::get().worker_alive(),
        }
    }
}

impl Pool {
    /// Starts `config.workers` slots, each starting its worker right away. Must run inside the
    /// tokio runtime.
    pub fn start(config: &Config) -> Pool {
        let (tx, rx) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = watch::channel(false);
        let readiness = Arc::new(Readiness {
            started: (0..config.workers)
                .map(|_| AtomicBool::new(false))
                .collect(),
            alive: AtomicUsize::new(0),
        });
        let spec = Arc::new(Spec {
            command: config.command.clone(),
            cwd: code_dir(),
            handler: config.handler.clone(),
            ready_wait: config.observe.listen_wait,
            queue: Mutex::new(rx),
            requeue: tx.clone(),
            stop: stop_rx,
            max_deliveries: u32::try_from(config.workers).unwrap_or(u32::MAX) + EXTRA_DELIVERIES,
            readiness: readiness.clone(),
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
            readiness,
        }
    }

    /// How many requests the workers take at once.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// True once every worker has started (with `RUNR_WORKER_READY=1`: said it is ready) and
    /// while at least one is alive.
    pub fn ready(&self) -> bool {
        self.readiness.ready()
    }

    /// Queues `req` for the next free worker and waits for its answer until `deadline`. The
    /// worker's log lines carry `tag`.
    pub async fn invoke(&self, req: &Arc<Request>, deadline: Instant, tag: Tag) -> Outcome {
        let (tx, rx) = oneshot::channel();
        let waiting = Arc::new(Waiting(std::sync::Mutex::new(Some(
            metrics::get().queued(),
        ))));
        let _leave = Leave(waiting.clone());
        let job = Job {
            req: req.clone(),
            deadline,
            reply: tx,
            undelivered: 0,
            tag,
            waiting,
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
/// otherwise a delay that doubles per quick failure, up to 5 s: runr-base's backoff without its
/// jitter (one worker has no crowd to spread out).
#[derive(Debug, Clone, Default)]
pub struct Backoff {
    /// Quick failures in a row, counting a good run as the first.
    failures: u32,
}

impl Backoff {
    const POLICY: runr_base::backoff::Backoff =
        runr_base::backoff::Backoff::new(RESTART_DELAY, MAX_RESTART_DELAY);

    /// The delay before restarting a worker that ended after `ran` and did (not) serve.
    pub fn delay(&mut self, served: bool, ran: Duration) -> Duration {
        self.failures = if served || ran >= HEALTHY_RUN {
            1
        } else {
            self.failures.saturating_add(1)
        };
        Self::POLICY.ceiling(self.failures)
    }
}

/// `value` scaled by a random factor in [0.9, 1.1], so that workers started together are not
/// recycled together.
fn jitter(value: f64) -> f64 {
    let mut b = [0u8; 4];
    runr_base::fmt::random_bytes(&mut b);
    let unit = f64::from(u32::from_le_bytes(b)) / f64::from(u32::MAX);
    value * (0.9 + 0.2 * unit)
}

/// How a worker's time in a slot ended.
enum End {
    /// The pool stops; the worker was stopped.
    Stopped,
    /// It exited, or was killed (timeout, broken protocol).
    Exited { served: bool, ran: Duration },
    /// It was recycled; this is its replacement, started already.
    Replaced(Box<Worker>),
}

/// How starting a worker went.
enum Start {
    /// It runs and can take requests.
    Ready(Box<Worker>),
    /// It could not be started, or ended before it was ready, after `ran`.
    Failed { ran: Duration },
    /// The pool stops.
    Stopped,
}

/// One slot: starts its worker, feeds it requests, restarts it when it ends, replaces it when
/// it is due, stops it when the pool stops.
async fn run_slot(slot: usize, spec: Arc<Spec>) {
    let mut backoff = Backoff::default();
    let mut stop = spec.stop.clone();
    let mut next: Option<Box<Worker>> = None;
    let mut first = true;
    loop {
        if *stop.borrow() {
            return;
        }
        let worker = match next.take() {
            Some(w) => w,
            None => {
                if !std::mem::take(&mut first) {
                    metrics::get().worker_restarted();
                }
                match start_ready(slot, &spec, &mut stop).await {
                    Start::Ready(w) => w,
                    Start::Stopped => return,
                    Start::Failed { ran } => {
                        if !restart_after(slot, backoff.delay(false, ran), &mut stop).await {
                            return;
                        }
                        continue;
                    }
                }
            }
        };
        match serve(slot, worker, &spec, &mut stop).await {
            End::Stopped => return,
            End::Replaced(new) => next = Some(new),
            End::Exited { served, ran } => {
                if !restart_after(slot, backoff.delay(served, ran), &mut stop).await {
                    return;
                }
            }
        }
    }
}

/// Waits out a restart delay; false when the pool stops meanwhile.
async fn restart_after(slot: usize, delay: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return false;
    }
    tracing::info!(
        slot,
        delay_ms = delay.as_millis() as u64,
        "restarting worker"
    );
    tokio::select! {
        () = tokio::time::sleep(delay) => true,
        _ = stop.changed() => false,
    }
}

/// A running worker: its process and its pipes.
struct Worker {
    proc: Process,
    io: WorkerIo,
    slot: usize,
    started: Instant,
    /// Requests answered.
    served: u64,
    /// Recycled after this many requests (`RUNR_WORKER_MAX_REQUESTS`, jittered).
    max_requests: Option<u64>,
    /// Recycled at this time (`RUNR_WORKER_MAX_AGE`, jittered).
    retire_at: Option<Instant>,
    /// With the ready handshake: killed if it has not said it is ready by then.
    ready_by: Instant,
    /// Counted alive once it is started (ready).
    alive: Option<Alive>,
}

/// A worker's pipes, apart from its process so both can be awaited at once.
struct WorkerIo {
    stdin: Option<pipe::Sender>,
    /// A reading end of the worker's stdin pipe, never read while the worker lives: once it is
    /// gone, what is left in the pipe is what it did not read.
    stdin_unread: OwnedFd,
    /// The answer channel: stdout, or fd 3.
    answers: BufReader<pipe::Receiver>,
    /// The answer-channel line being read. It outlives each read so that a read cancelled by
    /// a `select!` (a job won) loses no bytes: `read_line_capped` only suspends in `fill_buf`,
    /// and whatever it consumed before is already here.
    line: Vec<u8>,
    /// Whether the answer channel is still open; after EOF it is no longer read.
    answers_open: bool,
    /// What the stream of the answer channel's non-answer lines is called in the logs.
    answers_stream: Stream,
    stderr: Option<LinePipe>,
    /// Stdout, when fd 3 answers: all of it goes to the logs.
    stdout_log: Option<LinePipe>,
}

/// What came on the answer channel.
enum Read {
    /// A whole line, in `io.line`.
    Line,
    /// A line over the output limit (part of it in `io.line`).
    TooLong,
    /// EOF: the worker is gone or going.
    Closed,
}

impl WorkerIo {
    /// Reads the worker's pipes until something comes on the answer channel, logging what
    /// comes on the others into `log` meanwhile. Cancel-safe. Once the answer channel is
    /// closed it only logs (and waits forever once everything is closed): the caller races
    /// the worker's exit.
    async fn next(&mut self, log: &mut HandlerLog) -> Read {
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
                () = fill(&mut self.stderr), if stderr_open => flush(&mut self.stderr, log),
                () = fill(&mut self.stdout_log), if stdout_open => flush(&mut self.stdout_log, log),
            }
        }
    }

    /// Logs the pending answer-channel line and clears it.
    fn log_line(&mut self, log: &mut HandlerLog) {
        log.line(self.answers_stream, &self.line);
        self.line.clear();
    }

    /// Before a request is written: everything the worker wrote until now was written while
    /// idle, so it goes to `idle`: the log pipes' lines, and the answer channel's complete
    /// lines (even JSON ones: they cannot answer a request not written yet). A line it is in
    /// the middle of stays in `line`, where [`exchange`] knows it began while idle.
    fn drain_idle(&mut self, idle: &mut HandlerLog) {
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
            match crate::process::lines::read_now(self.answers.get_ref(), &mut chunk) {
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
    fn drain_logs(&mut self, log: &mut HandlerLog) {
        for p in [&mut self.stderr, &mut self.stdout_log]
            .into_iter()
            .flatten()
        {
            p.drain_now(log);
        }
    }
}

async fn fill(p: &mut Option<LinePipe>) {
    match p {
        Some(p) => p.fill().await,
        None => std::future::pending().await,
    }
}

fn flush(p: &mut Option<LinePipe>, log: &mut HandlerLog) {
    if let Some(p) = p {
        p.flush(log);
    }
}

/// True when `line` is the ready handshake, `{"ready":true}` (any spacing).
fn is_ready_line(line: &[u8]) -> bool {
    matches!(
        serde_json::from_slice::<serde_json::Value>(line.trim_ascii()),
        Ok(serde_json::Value::Object(m)) if m.get(READY_KEY) == Some(&serde_json::Value::Bool(true))
    )
}

fn start_worker(slot: usize, spec: &Spec) -> std::io::Result<Worker> {
    let stdin = process::stdin_pipe()?;
    let mut cmd = Command::new(&spec.command[0]);
    cmd.args(&spec.command[1..])
        .env("RUNR_WORKER", slot.to_string())
        .stdin(stdin.child)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = &spec.cwd {
        cmd.current_dir(dir);
    }
    let mut proc = if spec.handler.result_fd {
        process::spawn_with_result_fd(&mut cmd)?
    } else {
        process::spawn(&mut cmd)?
    };
    let stdout = proc
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("worker stdout missing"))?;
    let stderr = proc.stderr.take().map(|r| LinePipe::new(r, Stream::Stderr));
    let (answers, stdout_log) = match proc.result.take() {
        Some(result) => (result, Some(LinePipe::new(stdout, Stream::Stdout))),
        None => (stdout, None),
    };
    tracing::info!(slot, pid = proc.id(), "worker started");
    let started = Instant::now();
    Ok(Worker {
        proc,
        io: WorkerIo {
            stdin: Some(stdin.writer),
            stdin_unread: stdin.unread,
            answers: BufReader::with_capacity(64 * 1024, answers),
            line: Vec::with_capacity(1024),
            answers_open: true,
            answers_stream: Stream::Stdout,
            stderr,
            stdout_log,
        },
        slot,
        started,
        served: 0,
        max_requests: spec
            .handler
            .max_requests
            .map(|n| (jitter(n as f64).round() as u64).max(1)),
        retire_at: spec
            .handler
            .max_age
            .map(|age| started + age.mul_f64(jitter(1.0))),
        ready_by: started + spec.ready_wait,
        alive: None,
    })
}

/// Starts a worker and, with `RUNR_WORKER_READY=1`, waits for its ready line.
async fn start_ready(slot: usize, spec: &Spec, stop: &mut watch::Receiver<bool>) -> Start {
    let started = Instant::now();
    let mut worker = match start_worker(slot, spec) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(slot, command = ?spec.command, error = %e, "worker failed to start");
            return Start::Failed {
                ran: started.elapsed(),
            };
        }
    };
    tokio::select! {
        ready = until_ready(&mut worker, spec) => match ready {
            Ok(()) => {
                worker.alive = Some(spec.alive(slot));
                Start::Ready(Box::new(worker))
            }
            Err(exit) => {
                tracing::warn!(slot, status = exit.code(), "worker exited before it was ready");
                Start::Failed { ran: started.elapsed() }
            }
        },
        _ = stop.changed() => {
            wind_down(worker, Signal::SIGTERM, Duration::ZERO, STOP_GRACE).await;
            Start::Stopped
        }
    }
}

/// Waits for the ready line when the handshake is on (at once otherwise), logging whatever
/// else the worker writes. `Err` with its exit status when it ends first. Cancel-safe.
async fn until_ready(worker: &mut Worker, spec: &Spec) -> Result<(), Exit> {
    if !spec.handler.worker_ready {
        return Ok(());
    }
    let mut idle = HandlerLog::idle();
    loop {
        tokio::select! {
            read = worker.io.next(&mut idle) => match read {
                Read::Line if is_ready_line(&worker.io.line) => {
                    worker.io.line.clear();
                    tracing::info!(slot = worker.slot, pid = worker.proc.id(), "worker ready");
                    return Ok(());
                }
                Read::Line => worker.io.log_line(&mut idle),
                Read::TooLong => {
                    worker.proc.signal_group(Signal::SIGKILL);
                    return Err(worker.proc.wait().await);
                }
                Read::Closed => {}
            },
            exit = worker.proc.wait() => return Err(exit),
            () = tokio::time::sleep_until(worker.ready_by) => {
                tracing::warn!(
                    slot = worker.slot,
                    pid = worker.proc.id(),
                    wait = %runr_base::env::display_duration(spec.ready_wait),
                    "worker did not say it was ready in time (RUNR_TICK_WAIT); killing it"
                );
                worker.proc.signal_group(Signal::SIGKILL);
                return Err(worker.proc.wait().await);
            }
        }
    }
}

/// [`until_ready`] of the replacement being started, if there is one (else never).
async fn replacement_ready(replacement: &mut Option<Worker>, spec: &Spec) -> Result<(), Exit> {
    match replacement {
        Some(w) => until_ready(w, spec).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// How a request to a worker went.
enum Exchange {
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

impl Worker {
    /// Due for recycling: enough requests served or old enough.
    fn due(&self) -> bool {
        self.max_requests.is_some_and(|n| self.served >= n)
            || self.retire_at.is_some_and(|at| Instant::now() >= at)
    }
}

/// Feeds `worker` requests until it ends, is replaced, or the pool stops.
async fn serve(
    slot: usize,
    worker: Box<Worker>,
    spec: &Spec,
    stop: &mut watch::Receiver<bool>,
) -> End {
    let mut worker = *worker;
    let mut idle = HandlerLog::idle();
    // A recycling replacement being started while this worker goes on serving.
    let mut replacement: Option<Worker> = None;
    // After a replacement failed: not before this.
    let mut retry_at: Option<Instant> = None;
    loop {
        if worker.due() && replacement.is_none() && retry_at.is_none_or(|t| Instant::now() >= t) {
            retry_at = None;
            match start_worker(slot, spec) {
                // Without the handshake a worker is started once it runs: switch now.
                Ok(mut new) if !spec.handler.worker_ready => {
                    new.alive = Some(spec.alive(slot));
                    return recycle(worker, new);
                }
                // With it, this one serves on until the replacement says it is ready.
                Ok(new) => replacement = Some(new),
                Err(e) => {
                    tracing::warn!(slot, error = %e, "cannot start a worker's replacement; keeping it for now");
                    retry_at = Some(Instant::now() + RESTART_DELAY);
                }
            }
        }
        // What to wake up for without a request: the age limit, or the next try.
        let wake = match (worker.due(), &replacement) {
            (false, _) => worker.retire_at,
            (true, None) => retry_at,
            (true, Some(_)) => None,
        };
        let job = tokio::select! {
            // In this order: a worker known to be gone must not be handed a request, and a
            // ready replacement takes over before the next one.
            biased;
            _ = stop.changed() => {
                wind_down(worker, Signal::SIGTERM, Duration::ZERO, STOP_GRACE).await;
                return End::Stopped;
            }
            exit = worker.proc.wait() => {
                worker.io.drain_idle(&mut idle);
                tracing::warn!(slot, status = exit.code(), "worker exited");
                return exited(&worker);
            }
            read = worker.io.next(&mut idle) => {
                match read {
                    // No request is in flight, so this line answers nothing, even if it is JSON;
                    // left in the pipe it would be taken as the next request's answer.
                    Read::Line => worker.io.log_line(&mut idle),
                    Read::TooLong => {
                        tracing::warn!(
                            slot,
                            "worker printed a line over the output limit while idle; replacing it"
                        );
                        worker.proc.signal_group(Signal::SIGKILL);
                        let exit = worker.proc.wait().await;
                        tracing::warn!(slot, status = exit.code(), "worker exited");
                        return exited(&worker);
                    }
                    // The worker is exiting; the wait branch sees it end.
                    Read::Closed => {}
                }
                continue;
            }
            ready = replacement_ready(&mut replacement, spec) => {
                let Some(mut new) = replacement.take() else { continue };
                match ready {
                    Ok(()) => {
                        new.alive = Some(spec.alive(slot));
                        return recycle(worker, new);
                    }
                    Err(exit) => {
                        tracing::warn!(slot, status = exit.code(), "a worker's replacement exited before it was ready; keeping it for now");
                        retry_at = Some(Instant::now() + RESTART_DELAY);
                    }
                }
                continue;
            }
            job = async { spec.queue.lock().await.recv().await } => match job {
                Some(job) => job,
                None => {
                    wind_down(worker, Signal::SIGTERM, Duration::ZERO, STOP_GRACE).await;
                    return End::Stopped;
                }
            },
            () = sleep_until(wake) => continue,
        };
        job.waiting.leave();
        // Its requester gave up (timeout or client gone) while it queued.
        if job.reply.is_closed() || Instant::now() >= job.deadline {
            continue;
        }
        let _in_flight = metrics::get().in_flight();
        let cold_start = worker.served == 0;
        worker.io.drain_idle(&mut idle);
        let mut log = HandlerLog::invocation(job.tag.clone());
        let exchange = tokio::time::timeout_at(
            job.deadline,
            exchange(&mut worker.io, &mut worker.proc, &job.req, &mut log),
        )
        .await;
        let (outcome, keep) = match exchange {
            Ok(Exchange::Answer { outcome, clean }) => {
                worker.served += 1;
                (outcome, clean)
            }
            Ok(Exchange::Exited { written }) => {
                // The protocol state is unknown now: make sure the whole group is gone before
                // looking at what it left unread.
                worker.alive = None;
                worker.proc.signal_group(Signal::SIGKILL);
                let exit = worker.proc.wait().await;
                worker.io.drain_logs(&mut log);
                log.finish();
                tracing::warn!(slot, status = exit.code(), "worker exited");
                drop(worker.io.stdin.take());
                let unread = count_unread(&worker.io.stdin_unread);
                if unread == written && job.undelivered + 1 < spec.max_deliveries {
                    tracing::info!(slot, id = %job.req.id, "worker exited before reading the request; it goes to another worker");
                    let mut job = job;
                    job.undelivered += 1;
                    // Waiting again (unless its requester is gone already).
                    if !job.reply.is_closed() {
                        job.waiting.wait_again();
                    }
                    if let Err(mpsc::error::SendError(job)) = spec.requeue.send(job) {
                        let _ = job.reply.send(worker_exited());
                    }
                } else {
                    let _ = job.reply.send(Outcome {
                        cold_start,
                        exit: Some(exit),
                        ..worker_exited()
                    });
                }
                return exited(&worker);
            }
            Ok(Exchange::TooLarge) => (Outcome::output_too_large(), false),
            // The requester answers 504 itself at the same deadline.
            Err(_elapsed) => {
                tracing::warn!(
                    slot,
                    pid = worker.proc.id(),
                    "worker ran into the timeout; stopping it"
                );
                let grace = spec.handler.kill_grace;
                let signal = if grace.is_zero() {
                    Signal::SIGKILL
                } else {
                    Signal::SIGTERM
                };
                worker.alive = None;
                // Its last lines still belong to the invocation that timed out.
                stop_with_log(&mut worker, signal, grace, &mut log).await;
                log.finish();
                return End::Exited {
                    served: true,
                    ran: worker.started.elapsed(),
                };
            }
        };
        // Everything it logged before it answered is in the pipes now: it carries this
        // invocation's id, not the next one's.
        worker.io.drain_logs(&mut log);
        log.finish();
        if !keep {
            // The protocol state is unknown now: make sure the whole group is gone.
            worker.alive = None;
            worker.proc.signal_group(Signal::SIGKILL);
            let exit = worker.proc.wait().await;
            worker.io.drain_logs(&mut idle);
            let _ = job.reply.send(Outcome {
                cold_start,
                exit: Some(exit),
                ..outcome
            });
            tracing::warn!(slot, status = exit.code(), "worker exited");
            return exited(&worker);
        }
        let _ = job.reply.send(Outcome {
            cold_start,
            ..outcome
        });
    }
}

/// Hands `old` to a background wind-down (EOF, SIGTERM after 5 s, SIGKILL after 5 more) and
/// `new`, started already, to the slot.
fn recycle(mut old: Worker, new: Worker) -> End {
    tracing::info!(
        slot = old.slot,
        pid = old.proc.id(),
        served = old.served,
        replacement = new.proc.id(),
        "recycling worker"
    );
    old.alive = None;
    tokio::spawn(wind_down(old, Signal::SIGTERM, RETIRE_GRACE, RETIRE_GRACE));
    End::Replaced(Box::new(new))
}

fn exited(worker: &Worker) -> End {
    End::Exited {
        served: worker.served > 0,
        ran: worker.started.elapsed(),
    }
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
async fn exchange(
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
                // It exited. Whatever it wrote is in the pipe already; a grandchild holding
                // the pipe must not keep us waiting for EOF, so read only that.
                let mut rest = answers.buffer().to_vec();
                answers.consume(rest.len());
                if process::read_ready(answers.get_ref(), &mut rest, MAX_OUTPUT + 1)
                    == Drained::OverCap
                {
                    return Exchange::TooLarge;
                }
                return match answer_in(&rest, line, idle_tail, log, stream) {
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
            () = fill(stderr), if stderr_open => {
                flush(stderr, log);
                continue;
            }
            () = fill(stdout_log), if stdout_open => {
                flush(stdout_log, log);
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

/// Sends `signal` to the worker's group (unless `Duration::ZERO` grace with SIGKILL, which is
/// final), waits up to `grace` for it to end while logging its output into `log`, then kills
/// the group and reaps it.
async fn stop_with_log(worker: &mut Worker, signal: Signal, grace: Duration, log: &mut HandlerLog) {
    worker.proc.signal_group(signal);
    if signal != Signal::SIGKILL {
        let ended = tokio::time::timeout(grace, async {
            loop {
                tokio::select! {
                    exit = worker.proc.wait() => return exit,
                    read = worker.io.next(log) => if let Read::Line | Read::TooLong = read {
                        worker.io.log_line(log);
                    },
                }
            }
        })
        .await;
        if ended.is_err() {
            tracing::warn!(
                slot = worker.slot,
                pid = worker.proc.id(),
                "worker ignored SIGTERM; killing it"
            );
            worker.proc.signal_group(Signal::SIGKILL);
        }
    }
    worker.proc.wait().await;
    worker.io.drain_logs(log);
}

/// Ends a worker that takes no more requests: EOF on its stdin; after `before_signal`,
/// `signal` to its group; after `grace` more, SIGKILL. Its output is logged (idle: no
/// invocation) until it is gone. Recycling uses 5 s + 5 s, the pool's stop 0 + 5 s.
async fn wind_down(mut worker: Worker, signal: Signal, before_signal: Duration, grace: Duration) {
    worker.alive = None;
    drop(worker.io.stdin.take());
    let mut idle = HandlerLog::idle();
    let ended = tokio::time::timeout(before_signal, async {
        loop {
            tokio::select! {
                exit = worker.proc.wait() => return exit,
                read = worker.io.next(&mut idle) => if let Read::Line | Read::TooLong = read {
                    worker.io.log_line(&mut idle);
                },
            }
        }
    })
    .await;
    if ended.is_err() {
        stop_with_log(&mut worker, signal, grace, &mut idle).await;
    } else {
        worker.io.drain_logs(&mut idle);
    }
    tracing::info!(slot = worker.slot, pid = worker.proc.id(), "worker stopped");
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

    #[test]
    fn jitter_stays_within_ten_percent() {
        let all: Vec<f64> = (0..2000).map(|_| jitter(1000.0)).collect();
        assert!(all.iter().all(|v| (900.0..=1100.0).contains(v)), "{all:?}");
        // Spread over the range, not one value.
        assert!(all.iter().any(|v| *v < 950.0) && all.iter().any(|v| *v > 1050.0));
    }

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
