//! http mode: the program serves HTTP on `$PORT` itself. With the http or queue trigger and
//! nothing to observe, the wrapper becomes the program (execve: same PID, same environment plus
//! `PORT`) and adds nothing on the request path. The schedule invoke sequence and the observed
//! proxy start it as a child instead, with the helpers here.

use std::io;
use std::process::{Command, ExitCode, Stdio};

use nix::sys::signal::Signal;

use crate::config::{Config, Mode};
use crate::observe::logs::{self, HandlerLog, Stream};
use crate::process::reaper::Exit;
use crate::process::supervisor::STOP_GRACE;
use crate::process::{self, Process};
use crate::request::trigger::TriggerRule;

/// Exit status when the program cannot be executed, as shells report it.
pub const EXIT_CANNOT_EXEC: u8 = 127;

/// True when `config` asks the wrapper to replace itself with the program: http mode with
/// nothing to observe (tracing, replay and metrics need the observed proxy).
pub fn replaces_itself(config: &Config) -> bool {
    config.mode == Mode::Http
        && !TriggerRule::of_config(config).runs_once()
        && !config.observe.observed()
        && config.telemetry.metrics_port.is_none()
}

/// Replaces the wrapper with `RUNR_COMMAND` when [`replaces_itself`]; returns only when it does
/// not apply (`None`) or the program could not be executed (`Some(127)`, after one log line).
/// Call it before any runtime or signal handler exists: execve keeps the signal mask and
/// ignored signals.
pub fn exec_if_direct(config: &Config) -> Option<ExitCode> {
    if !replaces_itself(config) {
        return None;
    }
    use std::os::unix::process::CommandExt;
    let err = Command::new(&config.command[0])
        .args(&config.command[1..])
        .env("PORT", config.port.to_string())
        .exec();
    tracing::error!(command = ?config.command, error = %err, "cannot execute RUNR_COMMAND");
    Some(ExitCode::from(EXIT_CANNOT_EXEC))
}

/// Starts the program as a server on `port` (its own process group, reaped by the wrapper).
/// With `stdout_to_logs` its stdout is forwarded line by line to our stderr, keeping our stdout
/// for the tick's answer; otherwise stdout is inherited. Its stderr is inherited too, except
/// with JSON logs, where its lines become handler lines.
pub fn spawn_server(command: &[String], port: u16, stdout_to_logs: bool) -> io::Result<Process> {
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("PORT", port.to_string())
        .stdin(Stdio::null());
    if stdout_to_logs {
        cmd.stdout(Stdio::piped());
    }
    if logs::json() {
        cmd.stderr(Stdio::piped());
    }
    let mut proc = process::spawn(&mut cmd)?;
    if let Some(out) = proc.stdout.take() {
        process::forward_lines(out, Stream::Stdout, HandlerLog::idle());
    }
    if let Some(err) = proc.stderr.take() {
        process::forward_lines(err, Stream::Stderr, HandlerLog::idle());
    }
    Ok(proc)
}

/// Stops a server: SIGTERM to its group, SIGKILL after [`STOP_GRACE`]; returns how it ended.
pub async fn stop(proc: &mut Process) -> Exit {
    if let Some(exit) = proc.try_status() {
        return exit;
    }
    proc.signal_group(Signal::SIGTERM);
    match tokio::time::timeout(STOP_GRACE, proc.wait()).await {
        Ok(exit) => exit,
        Err(_) => {
            tracing::warn!(
                pid = proc.id(),
                grace_s = STOP_GRACE.as_secs(),
                "server ignored SIGTERM: killing it"
            );
            proc.signal_group(Signal::SIGKILL);
            proc.wait().await
        }
    }
}
