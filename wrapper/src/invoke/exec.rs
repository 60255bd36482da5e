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
use crate::envelope::Request;
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
}

/// What the handler produced before it exited.
enum Collected {
    Done { exit: Exit, stdout: Vec<u8> },
    TooLarge,
}

impl Exec {
    /// The exec invoker for `config`.
    pub fn new(config: &Config) -> Exec {
        Exec {
            program: resolve(&config.command[0]).unwrap_or_else(|| config.command[0].clone()),
            command: config.command.clone(),
            cwd: code_dir(),
            input: config.input,
            timeout: config.timeout,
        }
    }

    /// Runs the handler for `req` and maps what it did to an answer.
    pub async fn invoke(&self, req: &Request) -> Outcome {
        let deadline = Instant::now() + self.timeout;
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
        let input = match self.input {
            Input::Json => Bytes::from(req.envelope_json()),
            Input::Raw => req.body.clone(),
        };
        let stdin = proc.stdin.take();
        let stdout = proc.stdout.take();
        match tokio::time::timeout_at(deadline, collect(&mut proc, stdin, stdout, input)).await {
            Err(_elapsed) => {
                // The handler used its whole budget: no grace period, the group goes now (a
                // grace period would delay the 504 and keep a stuck process tree alive).
                proc.signal_group(Signal::SIGKILL);
                Outcome::timed_out(self.timeout)
            }
            Ok(Collected::TooLarge) => {
                proc.signal_group(Signal::SIGKILL);
                Outcome::output_too_large()
            }
            Ok(Collected::Done { exit, stdout }) => answer(exit, stdout),
        }
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
    input: Bytes,
) -> Collected {
    let write = async move {
        if let Some(mut w) = stdin {
            // EPIPE means the handler does not read its input, which is its right.
            let _ = w.write_all(&input).await;
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
            () = &mut write, if !written => written = true,
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
