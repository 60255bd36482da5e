//! Exec mode: one process per invocation. Stdin gets the envelope (or the raw body), stdout is
//! the answer, stderr goes to the logs line by line; the process group dies on timeout.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::time::Instant;

use super::{code_dir, Ended, Outcome, MAX_OUTPUT};
use crate::config::{Config, Input};
use crate::envelope::{BodyError, BodyReader, EnvelopeStream, Request};
use crate::process::arg_limit::{ArgLimit, TooLarge};
use crate::process::reaper::Exit;
use crate::process::{self, Drained, Process};
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
    timeout: Duration,
    /// What execve takes: requests whose variables do not fit are refused before spawning.
    args: ArgLimit,
    slots: usize,
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
        Exec {
            program,
            command: config.command.clone(),
            cwd: code_dir(),
            input: config.input,
            timeout: config.timeout,
            args,
            slots: config.max_inflight,
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
        self.args.check(&req.exec_env())
    }

    /// Runs the handler for `req` until `deadline` and maps what it did to an answer. With raw
    /// input, `body` (when given) is fed to stdin as it arrives instead of `req.body`.
    pub async fn invoke(
        &self,
        req: &Request,
        mut body: Option<&mut BodyReader>,
        deadline: Instant,
    ) -> Outcome {
        let mut cmd = Command::new(&self.program);
        cmd.arg0(&self.command[0])
            .args(&self.command[1..])
            .envs(req.exec_env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        let mut proc = match process::spawn(&mut cmd) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(command = ?self.command, error = %e, "handler failed to start");
                return Outcome::failed_to_start();
            }
        };
        if let Some(stderr) = proc.stderr.take() {
            process::forward_lines(stderr);
        }
        let stdin = proc.stdin.take();
        let stdout = proc.stdout.take();
        let input = match (self.input, body.as_deref_mut()) {
            (Input::Json, _) => Feed::Envelope(req),
            (Input::Raw, Some(body)) => Feed::Stream(body),
            (Input::Raw, None) => Feed::Raw(req.body.clone()),
        };
        match tokio::time::timeout_at(deadline, collect(&mut proc, stdin, stdout, input)).await {
            Err(_elapsed) => {
                // The handler used its whole budget: no grace period, the group goes now (a
                // grace period would delay the 504 and keep a stuck process tree alive).
                proc.signal_group(Signal::SIGKILL);
                if body.is_some_and(|b| !b.is_done()) {
                    // It was still waiting for the client's body.
                    return Outcome::refused(BodyError::TimedOut.reply());
                }
                Outcome::timed_out(self.timeout)
            }
            Ok(Collected::TooLarge) => {
                proc.signal_group(Signal::SIGKILL);
                Outcome::output_too_large()
            }
            Ok(Collected::Body(e)) => {
                // It must not act on a body that is not the client's whole body.
                proc.signal_group(Signal::SIGKILL);
                Outcome::refused(e.reply())
            }
            Ok(Collected::Done { exit, stdout }) => answer(exit, stdout),
        }
    }
}

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
    async fn write_to(self, w: &mut pipe::Sender) -> Result<(), BodyError> {
        match self {
            Feed::Envelope(req) => {
                let mut envelope = EnvelopeStream::new(req);
                let mut piece = Vec::new();
                while envelope.next_piece(&mut piece) {
                    if w.write_all(&piece).await.is_err() {
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

/// Exit status and stdout → answer: exit 0 answers stdout; non-zero answers a response
/// envelope if stdout holds one, else 500 `handler exited with status N`.
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

/// Feeds stdin and reads stdout at the same time (a handler that writes before it has read
/// everything must not deadlock against us) until the handler exits.
async fn collect(
    proc: &mut Process,
    stdin: Option<pipe::Sender>,
    mut stdout: Option<pipe::Receiver>,
    input: Feed<'_>,
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
    let mut eof = stdout.is_none();
    let mut out = Vec::new();
    let exit = loop {
        tokio::select! {
            exit = proc.wait() => break exit,
            fed = &mut write, if !written => {
                written = true;
                if let Err(e) = fed {
                    return Collected::Body(e);
                }
            }
            read = read_some(&mut stdout, &mut out), if !eof => match read {
                Ok(0) | Err(_) => eof = true,
                Ok(_) if out.len() > MAX_OUTPUT => return Collected::TooLarge,
                Ok(_) => {}
            },
        }
    };
    // The handler has exited, so everything it wrote is in the pipe already. Read only that:
    // a grandchild that inherited stdout and lives on must not hold the answer back.
    if let (Some(r), false) = (stdout.as_ref(), eof) {
        if process::read_ready(r, &mut out, MAX_OUTPUT) == Drained::OverCap {
            return Collected::TooLarge;
        }
    }
    Collected::Done { exit, stdout: out }
}

/// Reads what is there into `out`. Through a stack buffer: `out` then grows only as far as the
/// output goes (musl's allocator maps and unmaps large buffers, which costs per request).
async fn read_some(r: &mut Option<pipe::Receiver>, out: &mut Vec<u8>) -> std::io::Result<usize> {
    match r {
        Some(r) => {
            let mut chunk = [0u8; 8192];
            let n = r.read(&mut chunk).await?;
            out.extend_from_slice(&chunk[..n]);
            Ok(n)
        }
        None => Ok(0),
    }
}
