//! Persistent mode: `RUNR_WORKERS` long-lived processes, one request at a time each, spoken to
//! in JSON lines: the envelope as one line on stdin, the answer as the first line of the answer
//! channel (stdout, or fd 3 with `RUNR_RESULT_FD=3`) that parses as JSON. Other lines, and
//! every line printed while idle, go to the logs; a worker's stderr (and its stdout when fd 3
//! answers) is read alongside, and drained up to its answer before it gets the next request,
//! so each log line carries the invocation during which it was read ([`mod@exchange`]). Requests
//! queue for a free worker; the workers' lifecycle is the [`supervisor`]'s: a worker that exits
//! is restarted with backoff; with `RUNR_WORKER_MAX_REQUESTS` / `RUNR_WORKER_MAX_AGE` a worker is
//! replaced (its replacement started first) and wound down without failing a request.
//!
//! A request written to a worker that exits without having read any of it (it exited right
//! after its previous answer, before the wrapper noticed) was never delivered: it goes back in
//! line for another worker instead of failing. The wrapper keeps a reading end of each
//! worker's stdin pipe to tell: what the worker did not read is still in the pipe.

mod exchange;

use std::io;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;

use http::StatusCode;
use nix::sys::signal::Signal;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{code_dir, Ended, Invocation, Outcome};
use crate::config::handler::HandlerConfig;
use crate::config::Config;
use crate::observe::logs::{HandlerLog, Tag};
use crate::observe::metrics::{self, Held};
use crate::process::reaper::Exit;
use crate::process::supervisor::{
    self, Child, JobLine, Readiness, Sender, Served, Serving, Settings, Supervisor, Watch,
};
use crate::process::{self, Process};
use crate::request::Request;
use exchange::{exchange, Exchange, Read, WorkerIo};

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
    queue: Sender<Job>,
    supervisor: Supervisor,
    workers: usize,
    readiness: Arc<Readiness>,
}

/// What every worker is started with.
struct Spec {
    command: Vec<String>,
    cwd: Option<PathBuf>,
    handler: HandlerConfig,
    /// Workers one request may be written to at most (see [`EXTRA_DELIVERIES`]).
    max_deliveries: u32,
}

impl Pool {
    /// Starts `config.workers` slots, each starting its worker right away. Must run inside the
    /// tokio runtime.
    pub fn start(config: &Config) -> Pool {
        let line = Arc::new(JobLine::default());
        let readiness = Arc::new(Readiness::new(config.workers));
        let handler = &config.handler;
        let settings = Settings {
            slots: config.workers,
            ready_wait: handler.worker_ready.then_some(config.observe.listen_wait),
            max_requests: handler.max_requests,
            max_age: handler.max_age,
            readiness: Some(readiness.clone()),
        };
        let spec = Arc::new(Spec {
            command: config.command.clone(),
            cwd: code_dir(),
            handler: handler.clone(),
            max_deliveries: u32::try_from(config.workers).unwrap_or(u32::MAX) + EXTRA_DELIVERIES,
        });
        Pool {
            queue: line.sender(),
            supervisor: Supervisor::start::<Worker>(settings, spec, line),
            workers: config.workers,
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

    /// Queues `inv`'s request for the next free worker and waits for its answer until its
    /// deadline.
    pub async fn invoke(&self, inv: &mut Invocation) -> Outcome {
        let (tx, rx) = oneshot::channel();
        let waiting = Arc::new(Waiting(std::sync::Mutex::new(Some(
            metrics::get().queued(),
        ))));
        let _leave = Leave(waiting.clone());
        let job = Job {
            req: inv.request().clone(),
            deadline: inv.deadline(),
            reply: tx,
            undelivered: 0,
            tag: inv.tag(),
            waiting,
        };
        if self.queue.send(job).is_err() {
            return unavailable();
        }
        match tokio::time::timeout_at(inv.deadline(), rx).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_dropped)) => unavailable(),
            Err(_elapsed) => inv.timed_out(),
        }
    }

    /// Stops every worker: SIGTERM to its group, SIGKILL after [`supervisor::STOP_GRACE`].
    /// Call after the server has drained; a worker busy with a request finishes it first.
    pub async fn shutdown(&self) {
        self.supervisor.stop().await;
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

/// A running worker: its process and its pipes.
struct Worker {
    proc: Process,
    io: WorkerIo,
    slot: usize,
    /// Where its lines go while no request is written to it (and, while it is stopped for a
    /// request's timeout, that request's).
    log: HandlerLog,
    spec: Arc<Spec>,
}

impl Child for Worker {
    type Job = Job;
    type Spec = Spec;
    const NAME: &'static str = "worker";

    fn command(spec: &Spec) -> &[String] {
        &spec.command
    }

    fn start(spec: &Arc<Spec>, slot: usize) -> io::Result<Worker> {
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
        tracing::info!(slot, pid = proc.id(), "worker started");
        Ok(Worker {
            io: WorkerIo::new(stdin.writer, stdin.unread, &mut proc)?,
            proc,
            slot,
            log: HandlerLog::idle(),
            spec: spec.clone(),
        })
    }

    fn pid(&self) -> i32 {
        self.proc.id()
    }

    /// Its ready line (`RUNR_WORKER_READY=1`); whatever else it writes first goes to the logs.
    async fn ready(&mut self) -> Result<(), Exit> {
        loop {
            tokio::select! {
                read = self.io.next(&mut self.log) => match read {
                    Read::Line if self.io.ready_line() => return Ok(()),
                    Read::Line => self.io.log_line(&mut self.log),
                    Read::TooLong => {
                        self.proc.signal_group(Signal::SIGKILL);
                        return Err(self.proc.wait().await);
                    }
                    Read::Closed => {}
                },
                exit = self.proc.wait() => return Err(exit),
            }
        }
    }

    async fn watch(&mut self, _: &mut Serving<'_, Job>) -> Watch {
        let slot = self.slot;
        tokio::select! {
            // A worker known to be gone must not be handed a request.
            biased;
            exit = self.proc.wait() => {
                self.io.drain_idle(&mut self.log);
                tracing::warn!(slot, status = exit.code(), "worker exited");
                Watch::Ended
            }
            read = self.io.next(&mut self.log) => match read {
                // No request is in flight, so this line answers nothing, even if it is JSON;
                // left in the pipe it would be taken as the next request's answer.
                Read::Line => {
                    self.io.log_line(&mut self.log);
                    Watch::Continue
                }
                Read::TooLong => {
                    tracing::warn!(
                        slot,
                        "worker printed a line over the output limit while idle; replacing it"
                    );
                    self.proc.signal_group(Signal::SIGKILL);
                    let exit = self.proc.wait().await;
                    tracing::warn!(slot, status = exit.code(), "worker exited");
                    Watch::Ended
                }
                // The worker is exiting; the wait branch sees it end.
                Read::Closed => Watch::Continue,
            },
        }
    }

    async fn serve(&mut self, job: Job, cx: &mut Serving<'_, Job>) -> Served {
        job.waiting.leave();
        // Its requester gave up (timeout or client gone) while it queued.
        if job.reply.is_closed() || Instant::now() >= job.deadline {
            return Served::Dropped;
        }
        let _in_flight = metrics::get().in_flight();
        let cold_start = cx.served() == 0;
        self.io.drain_idle(&mut self.log);
        let mut log = HandlerLog::invocation(job.tag.clone());
        let exchange = tokio::time::timeout_at(
            job.deadline,
            exchange(&mut self.io, &mut self.proc, &job.req, &mut log),
        )
        .await;
        let (outcome, keep, answered) = match exchange {
            Ok(Exchange::Answer { outcome, clean }) => (outcome, clean, true),
            Ok(Exchange::Exited { written }) => {
                return self.gone(job, written, log, cold_start, cx).await
            }
            Ok(Exchange::TooLarge) => (Outcome::output_too_large(), false, false),
            // The requester answers 504 itself at the same deadline.
            Err(_elapsed) => return self.timed_out(log, cx).await,
        };
        let outcome = Outcome {
            cold_start,
            ..outcome
        };
        // Everything it logged before it answered is in the pipes now: it carries this
        // invocation's id, not the next one's.
        self.io.drain_logs(&mut log);
        log.finish();
        if !keep {
            return self.broken(job, outcome, answered, cx).await;
        }
        let _ = job.reply.send(outcome);
        Served::Answered
    }

    fn signal(&mut self, signal: Signal) {
        self.proc.signal_group(signal);
    }

    /// Logs what it writes until it has exited.
    async fn wait(&mut self) -> Exit {
        let exit = loop {
            tokio::select! {
                exit = self.proc.wait() => break exit,
                read = self.io.next(&mut self.log) => if let Read::Line | Read::TooLong = read {
                    self.io.log_line(&mut self.log);
                },
            }
        };
        self.io.drain_logs(&mut self.log);
        exit
    }

    /// EOF on its stdin.
    fn close(&mut self) {
        self.io.close();
    }
}

impl Worker {
    /// Its answer, `outcome`, leaves the protocol state unknown (a line over the limit, or an
    /// answer before it read the whole request): the whole group is killed, then the answer
    /// goes out with its exit status.
    async fn broken(
        &mut self,
        job: Job,
        outcome: Outcome,
        answered: bool,
        cx: &mut Serving<'_, Job>,
    ) -> Served {
        cx.leaving();
        self.proc.signal_group(Signal::SIGKILL);
        let exit = self.proc.wait().await;
        self.io.drain_logs(&mut self.log);
        let _ = job.reply.send(Outcome {
            exit: Some(exit),
            ..outcome
        });
        tracing::warn!(slot = self.slot, status = exit.code(), "worker exited");
        Served::Ended { good: answered }
    }

    /// It went without answering, after `written` bytes of the request went into its stdin.
    /// A request it did not read any of was never delivered: it goes back in line.
    async fn gone(
        &mut self,
        mut job: Job,
        written: usize,
        mut log: HandlerLog,
        cold_start: bool,
        cx: &mut Serving<'_, Job>,
    ) -> Served {
        // The protocol state is unknown now: make sure the whole group is gone before looking
        // at what it left unread.
        cx.leaving();
        self.proc.signal_group(Signal::SIGKILL);
        let exit = self.proc.wait().await;
        self.io.drain_logs(&mut log);
        log.finish();
        let slot = self.slot;
        tracing::warn!(slot, status = exit.code(), "worker exited");
        if self.io.unread() == written && job.undelivered + 1 < self.spec.max_deliveries {
            tracing::info!(slot, id = %job.req.id, "worker exited before reading the request; it goes to another worker");
            job.undelivered += 1;
            // Waiting again (unless its requester is gone already).
            if !job.reply.is_closed() {
                job.waiting.wait_again();
            }
            cx.requeue(job);
        } else {
            let _ = job.reply.send(Outcome {
                cold_start,
                exit: Some(exit),
                ..worker_exited()
            });
        }
        Served::Ended { good: false }
    }

    /// The request ran into its deadline: the worker is stopped (SIGTERM with
    /// `RUNR_KILL_GRACE`, else SIGKILL), its last lines still logged as the request's.
    async fn timed_out(&mut self, log: HandlerLog, cx: &mut Serving<'_, Job>) -> Served {
        tracing::warn!(
            slot = self.slot,
            pid = self.proc.id(),
            "worker ran into the timeout; stopping it"
        );
        let grace = self.spec.handler.kill_grace;
        let signal = if grace.is_zero() {
            Signal::SIGKILL
        } else {
            Signal::SIGTERM
        };
        cx.leaving();
        let idle = std::mem::replace(&mut self.log, log);
        let slot = self.slot;
        supervisor::terminate(self, slot, signal, grace).await;
        self.log.finish();
        self.log = idle;
        Served::Ended { good: true }
    }
}
