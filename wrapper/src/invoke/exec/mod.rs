//! Exec mode: one process per invocation. Stdin gets the envelope (or the raw body), stdout is
//! the answer (or, with `RUNR_RESULT_FD=3`, fd 3 is, and stdout goes to the logs), stderr goes
//! to the logs line by line, tied to the invocation; the process group dies on timeout (after
//! `RUNR_KILL_GRACE`, if set).

pub(crate) mod env;

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use nix::sys::signal::Signal;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;

use super::budget::Held;
use super::{code_dir, Ended, Invocation, Outcome, MAX_OUTPUT};
use crate::config::{Config, Input};
use crate::envelope::{self, WRITE_CHUNK};
use crate::observe::logs::{self, HandlerLog, Stream};
use crate::observe::metrics;
use crate::process::arg_limit::{ArgLimit, TooLarge};
use crate::process::lines::{self, LinePipe};
use crate::process::prepared::{self, Prepared};
use crate::process::reaper::Exit;
use crate::process::{self, Drained, Process};
use crate::request::body::{BodyError, BodyReader};
use crate::request::Request;
use crate::response;

/// Starts the handler once per invocation.
#[derive(Debug, Clone)]
pub struct Exec {
    /// `command[0]`, resolved on PATH once.
    program: String,
    /// argv as configured (`argv[0]` stays as the user wrote it).
    command: Vec<String>,
    cwd: Option<PathBuf>,
    input: Input,
    /// What execve takes: requests whose variables do not fit are refused before spawning.
    args: ArgLimit,
    slots: usize,
    kill_grace: Duration,
    result_fd: bool,
    /// The handler ready for posix_spawn with its environment built once (`None`: an
    /// argument with a NUL, which std then reports per request, as before).
    prepared: Option<Prepared>,
}

/// What the handler produced before it exited.
enum Collected {
    Done {
        exit: Exit,
        stdout: Vec<u8>,
    },
    TooLarge,
    /// The request body streamed into it failed.
    Body(BodyError),
}

impl Collected {
    /// The answer to what `proc` produced; a handler that wrote too much or was fed a broken
    /// body is killed (it must not act on a body that is not the client's whole body).
    fn outcome(self, proc: &mut Process) -> Outcome {
        match self {
            Collected::TooLarge => {
                proc.signal_group(Signal::SIGKILL);
                Outcome::output_too_large()
            }
            Collected::Body(e) => {
                proc.signal_group(Signal::SIGKILL);
                Outcome::refused(e.reply())
            }
            Collected::Done { exit, stdout } => Outcome {
                exit: Some(exit),
                peak_rss_kib: proc.peak_rss_kib(),
                ..answer(exit, stdout)
            },
        }
    }
}

impl Exec {
    /// The exec invoker for `config`.
    pub fn new(config: &Config) -> Exec {
        let program = resolve(&config.command[0]).unwrap_or_else(|| config.command[0].clone());
        let args = ArgLimit::of_this_process(&program, &config.command);
        if args.room_left() == 0 {
            tracing::warn!(
                command = ?config.command,
                "the wrapper's environment and RUNR_COMMAND leave no room for per-invocation variables: every request will be refused"
            );
        }
        let cwd = code_dir();
        let prepared = Prepared::new(&program, &config.command, cwd.as_deref()).ok();
        Exec {
            prepared,
            program,
            command: config.command.clone(),
            cwd,
            input: config.input,
            args,
            slots: config.max_inflight,
            kill_grace: config.handler.kill_grace,
            result_fd: config.handler.result_fd,
        }
    }

    /// Whether stdin gets the body as it arrives (raw input).
    pub fn streams_body(&self) -> bool {
        self.input == Input::Raw
    }

    /// Handler processes at once (`RUNR_MAX_INFLIGHT`).
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Whether `req`'s variables can be passed to the handler at all (the headers are what a
    /// client controls: one too long, or all together too many).
    pub fn check(&self, req: &Request) -> Result<(), TooLarge> {
        self.args.check(env::vars(req))
    }

    /// Runs the handler for `inv` until its deadline and maps what it did to an answer. With
    /// raw input, a body still on the connection is fed to stdin as it arrives; the answer
    /// counts in the bytes the invocation holds while it is collected.
    pub async fn invoke(&self, inv: &mut Invocation) -> Outcome {
        let (req, tag, deadline, timeout) = (
            inv.request().clone(),
            inv.tag(),
            inv.deadline(),
            inv.timeout(),
        );
        let req = &*req;
        let (mut body, held) = inv.body_and_held();
        let cold_start = !INVOKED.swap(true, Ordering::Relaxed);
        let (mut proc, stdin) = match self.spawn(req) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(command = ?self.command, error = %e, "handler failed to start");
                return Outcome {
                    cold_start,
                    ..Outcome::failed_to_start()
                };
            }
        };
        let _in_flight = metrics::get().in_flight();
        let mut log = HandlerLog::invocation(tag);
        let mut pipes = Pipes::of(&mut proc);
        let input = match (self.input, body.as_deref_mut()) {
            (Input::Json, _) => Feed::Envelope(req),
            (Input::Raw, Some(body)) => Feed::Stream(body),
            (Input::Raw, None) => Feed::Raw(req.body.clone()),
        };
        // The answer counts against RUNR_MAX_INFLIGHT_BYTES while it is collected; given back
        // when this returns (the server charges the reply made of it).
        let mut collecting = Collecting { held, bytes: 0 };
        let collected = collect(
            &mut proc,
            Some(stdin),
            &mut pipes,
            &mut log,
            input,
            &mut collecting,
        );
        let outcome = match tokio::time::timeout_at(deadline, collected).await {
            Err(_elapsed) => {
                let waiting_for_body = body.is_some_and(|b| !b.is_done());
                self.kill_at_timeout(proc, waiting_for_body);
                if waiting_for_body {
                    // It was still waiting for the client's body.
                    Outcome::refused(BodyError::TimedOut.reply())
                } else {
                    Outcome::timed_out(timeout)
                }
            }
            Ok(collected) => collected.outcome(&mut proc),
        };
        pipes.finish(log);
        Outcome {
            cold_start,
            ..outcome
        }
    }

    /// Starts the handler for `req`: the process and the wrapper's end of its stdin.
    fn spawn(&self, req: &Request) -> io::Result<(Process, Stdin)> {
        let (child_end, stdin) = Stdin::pipe()?;
        // The peak RSS comes from wait4 through std's `Child`: when the invocation line that
        // reports it is written, std spawns.
        if let (Some(prepared), false) = (&self.prepared, logs::invocation_logged()) {
            return prepared::spawn(prepared, env::vars(req), child_end, self.result_fd)
                .map(|p| (p, stdin));
        }
        let child_end = Stdio::from(child_end);
        let mut cmd = Command::new(&self.program);
        cmd.arg0(&self.command[0])
            .args(&self.command[1..])
            .envs(env::vars(req).iter().map(|(k, v)| (k, v)))
            .stdin(child_end)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        let spawned = if self.result_fd {
            process::spawn_with_result_fd(&mut cmd)
        } else {
            process::spawn(&mut cmd)
        };
        // `cmd` goes here, and with it our copy of the child's end of stdin: with that open, a
        // handler that exits without reading would never be seen to.
        spawned.map(|p| (p, stdin))
    }

    /// The timeout: SIGKILL to the group now, or with `RUNR_KILL_GRACE` SIGTERM now and
    /// SIGKILL after the grace, in the background (the 504 does not wait for it). A handler
    /// still waiting for the client's body gets no grace: it has nothing to finish.
    fn kill_at_timeout(&self, mut proc: Process, waiting_for_body: bool) {
        if self.kill_grace.is_zero() || waiting_for_body {
            // No grace: the group goes now (a stuck process tree must not outlive the budget
            // it used up).
            proc.signal_group(Signal::SIGKILL);
            return;
        }
        proc.signal_group(Signal::SIGTERM);
        let grace = self.kill_grace;
        tokio::spawn(async move {
            if tokio::time::timeout(grace, proc.wait()).await.is_err() {
                tracing::warn!(
                    pid = proc.id(),
                    grace = %runr_base::env::display_duration(grace),
                    "handler outlived its kill grace: killing its group"
                );
                proc.signal_group(Signal::SIGKILL);
            }
        });
    }
}

/// The handler's pipes during one invocation: the answer (stdout, or fd 3), the logs (stderr,
/// and stdout when fd 3 answers).
struct Pipes {
    answer: Option<pipe::Receiver>,
    stderr: Option<LinePipe>,
    stdout_log: Option<LinePipe>,
}

impl Pipes {
    /// The pipes of `proc`, taken from it: with fd 3, the answer comes from fd 3 and stdout
    /// goes to the logs; without, stdout is the answer.
    fn of(proc: &mut Process) -> Pipes {
        let stdout = proc.stdout.take();
        let stderr = proc.stderr.take().map(|r| LinePipe::new(r, Stream::Stderr));
        match proc.result.take() {
            Some(result) => Pipes {
                answer: Some(result),
                stderr,
                stdout_log: stdout.map(|r| LinePipe::new(r, Stream::Stdout)),
            },
            None => Pipes {
                answer: stdout,
                stderr,
                stdout_log: None,
            },
        }
    }

    /// Logs every line the log pipes hold now, then hands what is still open to background
    /// tasks (a grandchild may keep writing) with the rest of the invocation's cap.
    fn finish(self, mut log: HandlerLog) {
        let mut rest = Vec::new();
        for mut p in [self.stderr, self.stdout_log].into_iter().flatten() {
            p.drain_now(&mut log);
            if p.is_open() {
                rest.push(p);
            }
        }
        log.finish();
        for p in rest {
            tokio::spawn(p.forward_to_end(log.continued()));
        }
    }
}

/// True once the wrapper ran an invocation: the first one is its cold start.
static INVOKED: AtomicBool = AtomicBool::new(false);

/// What goes into the handler's stdin.
enum Feed<'a> {
    /// The envelope, encoded piece by piece as the pipe takes it.
    Envelope(&'a Request),
    /// The body as it is, whole.
    Raw(Bytes),
    /// The body as it is, as it arrives from the client.
    Stream(&'a mut BodyReader),
}

impl Feed<'_> {
    /// Writes all of it. EPIPE means the handler does not read (all of) its input, which is
    /// its right: the rest is not fed. A streamed body that fails is an error.
    async fn write_to(self, w: &mut Stdin) -> Result<(), BodyError> {
        match self {
            Feed::Envelope(req) => {
                let mut envelope = envelope::encode(req);
                let mut piece = Vec::new();
                loop {
                    let more = envelope.fill(&mut piece, WRITE_CHUNK);
                    if w.write_all(&piece).await.is_err() || !more {
                        break;
                    }
                    piece.clear();
                }
            }
            Feed::Raw(body) => {
                let _ = w.write_all(&body).await;
            }
            Feed::Stream(body) => {
                while let Some(piece) = body.next().await {
                    if w.write_all(&piece?).await.is_err() {
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The absolute path of a bare program name found on PATH, looked up once at start instead of
/// by every spawn (posix_spawnp tries each PATH entry per request). Names with a `/` are left
/// alone, and so is a name not found now: the spawn then reports it per request.
fn resolve(program: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    if program.contains('/') {
        return None;
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .and_then(|p| p.into_os_string().into_string().ok())
}

/// Exit status and output → answer: exit 0 answers the output; non-zero answers a response
/// envelope if the output holds one, else 500 `handler exited with status N`.
fn answer(exit: Exit, stdout: Vec<u8>) -> Outcome {
    if exit.success() {
        return Outcome::answered(response::from_exec_output(Bytes::from(stdout)));
    }
    match response::envelope_reply(&stdout) {
        Some(reply) => Outcome::answered(reply),
        None => Outcome::failed(
            Ended::ExitStatus(exit.code()),
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("handler exited with status {}", exit.code()),
        ),
    }
}

/// Feeds stdin, reads the answer and the log pipes at the same time (a handler that writes
/// before it has read everything must not deadlock against us, nor one whose log pipe is full)
/// until the handler exits.
async fn collect(
    proc: &mut Process,
    stdin: Option<Stdin>,
    pipes: &mut Pipes,
    log: &mut HandlerLog,
    input: Feed<'_>,
    collecting: &mut Collecting<'_>,
) -> Collected {
    let write = async move {
        match stdin {
            Some(mut w) => input.write_to(&mut w).await,
            None => Ok(()),
        }
        // Dropping `w` closes stdin: the handler sees EOF.
    };
    tokio::pin!(write);
    let mut written = false;
    let mut eof = pipes.answer.is_none();
    let mut out = Vec::new();
    let exit = loop {
        let stderr_open = pipes.stderr.as_ref().is_some_and(LinePipe::is_open);
        let stdout_open = pipes.stdout_log.as_ref().is_some_and(LinePipe::is_open);
        tokio::select! {
            exit = proc.wait() => break exit,
            fed = &mut write, if !written => {
                written = true;
                if let Err(e) = fed {
                    return Collected::Body(e);
                }
            }
            read = read_some(&mut pipes.answer, &mut out), if !eof => match read {
                Ok(0) | Err(_) => eof = true,
                Ok(_) if out.len() > MAX_OUTPUT => return Collected::TooLarge,
                Ok(n) => collecting.charge(n),
            },
            () = lines::fill(&mut pipes.stderr), if stderr_open => lines::flush(&mut pipes.stderr, log),
            () = lines::fill(&mut pipes.stdout_log), if stdout_open => lines::flush(&mut pipes.stdout_log, log),
        }
    };
    // The handler has exited, so everything it wrote is in the pipe already. Read only that:
    // a grandchild that inherited the pipe and lives on must not hold the answer back.
    if let (Some(r), false) = (pipes.answer.as_ref(), eof) {
        let before = out.len();
        if process::read_ready(r, &mut out, MAX_OUTPUT) == Drained::OverCap {
            return Collected::TooLarge;
        }
        collecting.charge(out.len() - before);
    }
    Collected::Done { exit, stdout: out }
}

/// The bytes of an answer being collected, charged to the invocation's budget bytes as they
/// arrive (never waited for: the handler is running) and given back when dropped.
struct Collecting<'a> {
    held: &'a mut Held,
    bytes: u64,
}

impl Collecting<'_> {
    fn charge(&mut self, n: usize) {
        self.held.charge(n as u64);
        self.bytes += n as u64;
    }
}

impl Drop for Collecting<'_> {
    fn drop(&mut self) {
        self.held.release(self.bytes);
    }
}

/// Waits for output and reads what is there into `out`, through a stack buffer: `out` then
/// grows only as far as the output goes (musl's allocator maps and unmaps large buffers, which
/// costs per request). Cancel-safe.
async fn read_some(r: &mut Option<pipe::Receiver>, out: &mut Vec<u8>) -> io::Result<usize> {
    match r {
        Some(r) => lines::poll_read_into(r, out).await,
        None => Ok(0),
    }
}

/// Bytes any pipe takes without a reader: a fresh pipe has room for at least one page
/// (`PIPE_BUF`), even when the user's pipe buffers are over the kernel's soft limit.
const PIPE_BUF: usize = 4096;

/// The handler's stdin. Written without the event loop while all that was written fits in
/// [`PIPE_BUF`], which a fresh pipe takes without blocking whatever the handler does: the
/// usual small request or envelope then costs no non-blocking mode and no registration with
/// the runtime (three system calls per invocation). Past that, made non-blocking and written
/// through the runtime.
struct Stdin {
    /// Blocking (the mode the child's end has too, a separate open file), with the bytes
    /// written to it so far; `None` once past [`PIPE_BUF`].
    fresh: Option<(OwnedFd, usize)>,
    polled: Option<pipe::Sender>,
}

impl Stdin {
    /// A new pipe: the child's end (close-on-exec: the spawn dups it onto fd 0) and ours.
    fn pipe() -> io::Result<(OwnedFd, Stdin)> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let stdin = Stdin {
            fresh: Some((write, 0)),
            polled: None,
        };
        Ok((read, stdin))
    }

    async fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if let Some((fd, written)) = &mut self.fresh {
            if *written + buf.len() <= PIPE_BUF {
                write_fresh(fd, buf)?;
                *written += buf.len();
                return Ok(());
            }
        }
        if let Some((fd, _)) = self.fresh.take() {
            self.polled = Some(process::sender(fd)?);
        }
        match &mut self.polled {
            Some(w) => w.write_all(buf).await,
            None => Err(io::ErrorKind::BrokenPipe.into()),
        }
    }
}

/// Writes `buf` whole to a blocking pipe that has room for it (see [`Stdin`]): a write of at
/// most `PIPE_BUF` bytes is atomic, so it is either all taken or fails (EPIPE: the handler
/// closed its stdin or exited, which is its right).
fn write_fresh(fd: &OwnedFd, buf: &[u8]) -> io::Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    loop {
        match nix::unistd::write(fd, buf) {
            Ok(n) if n == buf.len() => return Ok(()),
            Ok(_) => return Err(io::ErrorKind::WriteZero.into()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
