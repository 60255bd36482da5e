//! Persistent mode: `RUNR_WORKERS` long-lived processes, one request at a time each, spoken to
//! in JSON lines: the envelope as one line on stdin, the answer as the first stdout line that
//! parses as JSON (other lines, and every line printed while idle, go to the logs). Requests
//! queue for a free worker; a worker that exits is restarted with backoff.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use nix::sys::signal::Signal;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot, watch, Mutex};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{code_dir, Ended, Outcome, MAX_OUTPUT};
use crate::config::Config;
use crate::envelope::Request;
use crate::process::{self, program_line, Line, Process};
use crate::response;

/// Restart delay after a worker that served a request or ran long enough.
const RESTART_DELAY: Duration = Duration::from_millis(100);
/// A worker that lived this long counts as healthy even if it served nothing.
const HEALTHY_RUN: Duration = Duration::from_secs(10);
/// Cap of the doubling restart delay of a crash-looping worker.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(5);
/// How long a stopping worker gets between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// A queued request.
struct Job {
    line: Bytes,
    deadline: Instant,
    reply: oneshot::Sender<Outcome>,
}

/// The worker pool.
pub struct Pool {
    queue: mpsc::UnboundedSender<Job>,
    stop: watch::Sender<bool>,
    slots: std::sync::Mutex<Vec<JoinHandle<()>>>,
    timeout: Duration,
}

/// What every slot needs to start its worker.
struct Spec {
    command: Vec<String>,
    cwd: Option<PathBuf>,
    queue: Mutex<mpsc::UnboundedReceiver<Job>>,
    stop: watch::Receiver<bool>,
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
            stop: stop_rx,
        });
        let slots = (0..config.workers)
            .map(|slot| tokio::spawn(run_slot(slot, spec.clone())))
            .collect();
        Pool {
            queue: tx,
            stop: stop_tx,
            slots: std::sync::Mutex::new(slots),
            timeout: config.timeout,
        }
    }

    /// Queues `req` for the next free worker and waits for its answer; the timeout counts from
    /// now, the wait for a worker included.
    pub async fn invoke(&self, req: &Request) -> Outcome {
        let deadline = Instant::now() + self.timeout;
        let mut line = req.envelope_json();
        line.push(b'\n');
        let (tx, rx) = oneshot::channel();
        let job = Job {
            line: Bytes::from(line),
            deadline,
            reply: tx,
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
    stdout: BufReader<pipe::Receiver>,
    /// The stdout line being read. It outlives each read so that a read cancelled by `serve()`'s
    /// select (a job won) loses no bytes: `read_line_capped` only suspends in `fill_buf`, and
    /// whatever it consumed before is already here.
    line: Vec<u8>,
    /// Whether stdout is still open; after EOF it is no longer read while idle.
    stdout_open: bool,
}

fn start_worker(slot: usize, spec: &Spec) -> std::io::Result<Worker> {
    let mut cmd = Command::new(&spec.command[0]);
    cmd.args(&spec.command[1..])
        .env("RUNR_WORKER", slot.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = &spec.cwd {
        cmd.current_dir(dir);
    }
    let mut proc = process::spawn(&mut cmd)?;
    if let Some(stderr) = proc.stderr.take() {
        process::forward_lines(stderr);
    }
    let missing = || std::io::Error::other("worker pipes missing");
    let stdin = proc.stdin.take().ok_or_else(missing)?;
    let stdout = proc.stdout.take().ok_or_else(missing)?;
    tracing::info!(slot, pid = proc.id(), "worker started");
    Ok(Worker {
        proc,
        stdin,
        stdout: BufReader::with_capacity(64 * 1024, stdout),
        line: Vec::with_capacity(1024),
        stdout_open: true,
    })
}

/// How a request to a worker went.
enum Exchange {
    Answer(Outcome),
    /// The worker closed stdout or stdin: it is gone (or going).
    Exited,
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
            job = async { spec.queue.lock().await.recv().await } => match job {
                Some(job) => job,
                None => return served,
            },
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
            exit = worker.proc.wait() => {
                tracing::warn!(slot, status = exit.code(), "worker exited");
                return served;
            }
            _ = stop.changed() => {
                stop_worker(slot, worker).await;
                return served;
            }
        };
        // Its requester gave up (timeout or client gone) while it queued.
        if job.reply.is_closed() || Instant::now() >= job.deadline {
            continue;
        }
        let exchange =
            tokio::time::timeout_at(job.deadline, exchange(&mut worker, &job.line)).await;
        let (outcome, keep) = match exchange {
            Ok(Exchange::Answer(outcome)) => (outcome, true),
            Ok(Exchange::Exited) => (
                Outcome::failed(
                    Ended::WorkerExited,
                    StatusCode::BAD_GATEWAY,
                    "handler process exited",
                ),
                false,
            ),
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
        served = true;
    }
}

/// Writes one request line and reads stdout until a line parses as JSON.
///
/// A line the worker began while idle (`worker.line` not empty) is completed first and logged
/// whatever it holds: it started before the request was written, so it cannot be the answer.
/// It still counts against the output limit as one line. A whole line that reached the pipe
/// just as the job was taken is indistinguishable from an answer; that race is the protocol's.
async fn exchange(worker: &mut Worker, line: &[u8]) -> Exchange {
    if worker.stdin.write_all(line).await.is_err() {
        return Exchange::Exited;
    }
    let mut idle_tail = !worker.line.is_empty();
    loop {
        match process::read_line_capped(&mut worker.stdout, &mut worker.line, MAX_OUTPUT + 1).await
        {
            Err(_) | Ok(Line::Eof) => return Exchange::Exited,
            Ok(Line::TooLong) => return Exchange::TooLarge,
            Ok(Line::Complete) => {
                let text = worker.line.trim_ascii();
                match serde_json::from_slice(text) {
                    Ok(value) if !idle_tail => {
                        let outcome = Outcome::answered(response::from_worker_value(value, text));
                        worker.line.clear();
                        return Exchange::Answer(outcome);
                    }
                    // A stray print, or the end of a line begun while idle: logs, not protocol.
                    _ => program_line(&worker.line),
                }
                worker.line.clear();
                idle_tail = false;
            }
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
