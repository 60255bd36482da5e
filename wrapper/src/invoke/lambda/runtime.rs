//! The runtime processes: what each is started with (the environment Lambda gives a runtime),
//! and one supervisor task per slot that hands it invocations, enforces the timeout (the
//! runtime's whole process group is killed, as Lambda resets a sandbox), and restarts it with
//! persistent mode's backoff after it exits or reported an init error.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::time::Instant;

use super::result::FunctionError;
use super::slot::{Exited, Slot};
use super::Shared;
use crate::config::lambda::{LambdaConfig, DEFAULT_TZ};
use crate::observe::logs::{HandlerLog, Stream};
use crate::process::supervisor::{Backoff, STOP_GRACE};
use crate::process::{self, Process};

/// How long a runtime that reported an init error gets to exit by itself (awslambdaric exits
/// right after the 202) before its group is killed.
const INIT_ERROR_GRACE: Duration = Duration::from_secs(2);
/// The memory size a runtime is told when the cgroup sets no limit (Lambda's common setting).
const DEFAULT_MEMORY_MIB: u64 = 1024;

/// What every runtime process is started with.
pub struct Spec {
    /// Program and arguments.
    pub command: Vec<String>,
    /// The working directory (`LAMBDA_TASK_ROOT`).
    pub cwd: PathBuf,
    /// The Lambda variables every runtime gets (the per-slot ones are added at spawn).
    pub env: Vec<(OsString, OsString)>,
    /// `AWS_LAMBDA_FUNCTION_VERSION`, for the log stream names.
    pub version: String,
    /// Flips to `true` when the wrapper stops.
    pub stop: watch::Receiver<bool>,
}

/// The variables Lambda documents for a runtime's environment, from `config`:
/// `_HANDLER`, `LAMBDA_TASK_ROOT`, `LAMBDA_RUNTIME_DIR`, `AWS_LAMBDA_FUNCTION_NAME`,
/// `…_VERSION`, `…_MEMORY_SIZE`, `AWS_LAMBDA_LOG_GROUP_NAME`, `AWS_REGION`,
/// `AWS_DEFAULT_REGION`, `AWS_LAMBDA_INITIALIZATION_TYPE` and `TZ` (unless set).
pub fn environment(config: &LambdaConfig, memory_mib: u64) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = Vec::new();
    let mut put = |k: &str, v: &str| env.push((k.into(), v.into()));
    if let Some(handler) = &config.handler {
        put("_HANDLER", handler);
    }
    put("LAMBDA_TASK_ROOT", &config.task_root.to_string_lossy());
    put("LAMBDA_RUNTIME_DIR", "/var/runtime");
    put("AWS_LAMBDA_FUNCTION_NAME", &config.function_name);
    put("AWS_LAMBDA_FUNCTION_VERSION", &config.function_version);
    put("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", &memory_mib.to_string());
    put(
        "AWS_LAMBDA_LOG_GROUP_NAME",
        &format!("/aws/lambda/{}", config.function_name),
    );
    put("AWS_REGION", &config.region);
    put("AWS_DEFAULT_REGION", &config.region);
    put("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand");
    if config.tz.is_none() {
        put("TZ", DEFAULT_TZ);
    }
    env
}

/// The memory limit of our cgroup in MiB (v2 `memory.max`, else v1 `memory.limit_in_bytes`),
/// [`DEFAULT_MEMORY_MIB`] when there is none.
pub fn memory_mib() -> u64 {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    memory_from(
        read("/sys/fs/cgroup/memory.max"),
        read("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
    )
}

/// [`memory_mib`] from the files' contents.
pub fn memory_from(v2: Option<String>, v1: Option<String>) -> u64 {
    // cgroup v1 says "no limit" with a huge number (the page-rounded i64 maximum).
    let limit = |text: Option<String>| {
        text.and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|&b| b > 0 && b < (1 << 62))
            .map(|b| (b / (1024 * 1024)).max(1))
    };
    limit(v2)
        .or_else(|| limit(v1))
        .unwrap_or(DEFAULT_MEMORY_MIB)
}

/// A log stream name as Lambda makes them: `2026/12/01/[$LATEST]<32 hex>`.
fn log_stream_name(version: &str) -> String {
    let date = runr_base::fmt::rfc3339(SystemTime::now());
    format!(
        "{}/{}/{}/[{version}]{}",
        &date[0..4],
        &date[5..7],
        &date[8..10],
        runr_base::fmt::random_hex::<16>()
    )
}

/// One slot's life: start the runtime, supervise it, restart it with backoff when it ends,
/// until the wrapper stops.
pub async fn run_slot(slot: Arc<Slot>, shared: Arc<Shared>, spec: Arc<Spec>, api: String) {
    let mut backoff = Backoff::default();
    let mut stop = spec.stop.clone();
    loop {
        if *stop.borrow() {
            return;
        }
        let started = Instant::now();
        slot.started();
        let served = match spawn(&slot, &spec, &api) {
            Ok(proc) => supervise(&slot, &shared, proc, &mut stop).await,
            Err(e) => {
                tracing::error!(slot = slot.index, command = ?spec.command, error = %e, "runtime failed to start");
                slot.exited(127);
                let err = FunctionError::new(
                    "Runtime.InvalidEntrypoint",
                    format!("the runtime could not be started: {e}"),
                );
                shared.init_failed(&err);
                false
            }
        };
        if *stop.borrow() {
            return;
        }
        let delay = backoff.delay(served, started.elapsed());
        tracing::info!(
            slot = slot.index,
            delay_ms = delay.as_millis() as u64,
            "restarting runtime"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
    }
}

fn spawn(slot: &Slot, spec: &Spec, api: &str) -> std::io::Result<Process> {
    let mut cmd = Command::new(&spec.command[0]);
    cmd.args(&spec.command[1..])
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .env("AWS_LAMBDA_RUNTIME_API", api)
        .env("AWS_LAMBDA_LOG_STREAM_NAME", log_stream_name(&spec.version))
        .current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut proc = process::spawn(&mut cmd)?;
    // A runtime logs on both; Lambda sends both to the function's logs.
    if let Some(out) = proc.stdout.take() {
        process::forward_lines(out, Stream::Stdout, HandlerLog::idle());
    }
    if let Some(err) = proc.stderr.take() {
        process::forward_lines(err, Stream::Stderr, HandlerLog::idle());
    }
    tracing::info!(slot = slot.index, pid = proc.id(), api = %api, "runtime started");
    Ok(proc)
}

/// Feeds the runtime invocations until it exits or the wrapper stops; returns whether it got
/// any (for the backoff).
async fn supervise(
    slot: &Slot,
    shared: &Shared,
    mut proc: Process,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let mut served = false;
    loop {
        let view = slot.view();
        tokio::select! {
            exit = proc.wait() => {
                tracing::warn!(slot = slot.index, status = exit.code(), "runtime exited");
                match slot.exited(exit.code()) {
                    Exited::DuringInit => {
                        let err = FunctionError::new(
                            "Runtime.ExitError",
                            format!(
                                "the runtime exited with status {} before asking for an invocation",
                                exit.code()
                            ),
                        );
                        shared.init_failed(&err);
                    }
                    // Never seen by the runtime that exited: another one takes it.
                    Exited::Undelivered(job) => shared.requeue(job),
                    Exited::Otherwise => {}
                }
                return served;
            }
            () = slot.poke.notified() => {}
            job = async { shared.queue.lock().await.recv().await }, if view.wants_job => match job {
                Some(job) => served |= slot.assign(job),
                // The sender went away with the invoker: nothing more will come.
                None => {
                    stop_runtime(slot, &mut proc).await;
                    return served;
                }
            },
            () = sleep_until(view.deadline), if view.deadline.is_some() => {
                if slot.time_out() {
                    tracing::warn!(slot = slot.index, pid = proc.id(), "runtime ran into the timeout; killing its process group");
                    proc.signal_group(Signal::SIGKILL);
                }
            }
            () = sleep_until(view.init_failed_at.map(|at| at + INIT_ERROR_GRACE)), if view.init_failed_at.is_some() => {
                tracing::warn!(slot = slot.index, pid = proc.id(), "runtime did not exit after its init error; killing its process group");
                proc.signal_group(Signal::SIGKILL);
                let exit = proc.wait().await;
                slot.exited(exit.code());
                return served;
            }
            _ = stop.changed() => {
                stop_runtime(slot, &mut proc).await;
                return served;
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// SIGTERM to the runtime's group, SIGKILL after [`STOP_GRACE`].
async fn stop_runtime(slot: &Slot, proc: &mut Process) {
    proc.signal_group(Signal::SIGTERM);
    if tokio::time::timeout(STOP_GRACE, proc.wait()).await.is_err() {
        tracing::warn!(
            slot = slot.index,
            pid = proc.id(),
            "runtime ignored SIGTERM; killing it"
        );
        proc.signal_group(Signal::SIGKILL);
        proc.wait().await;
    }
    let exit = proc.wait().await;
    slot.exited(exit.code());
    tracing::info!(slot = slot.index, "runtime stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_limits() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(memory_from(s("536870912\n"), None), 512);
        assert_eq!(memory_from(s("max\n"), s("268435456")), 256);
        assert_eq!(memory_from(None, s("9223372036854771712")), 1024);
        assert_eq!(memory_from(s("max"), None), 1024);
        assert_eq!(memory_from(None, None), 1024);
        assert_eq!(
            memory_from(s("1000"), None),
            1,
            "below a MiB rounds up to 1"
        );
    }

    #[test]
    fn log_streams_look_like_lambdas() {
        let name = log_stream_name("$LATEST");
        let (date, rest) = name.split_at(10);
        assert_eq!(date.matches('/').count(), 2, "{name}");
        let id = rest.strip_prefix("/[$LATEST]").unwrap();
        assert_eq!(id.len(), 32);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn the_environment_lambda_documents() {
        let mut config = LambdaConfig {
            handler: Some("app.handler".into()),
            region: "eu-west-1".into(),
            function_name: "orders".into(),
            function_version: "orders-00002".into(),
            invoke_api: false,
            tz: None,
            task_root: PathBuf::from("/app/code"),
        };
        let env = |c: &LambdaConfig| -> std::collections::HashMap<String, String> {
            environment(c, 512)
                .into_iter()
                .map(|(k, v)| (k.into_string().unwrap(), v.into_string().unwrap()))
                .collect()
        };
        let e = env(&config);
        for (k, v) in [
            ("_HANDLER", "app.handler"),
            ("LAMBDA_TASK_ROOT", "/app/code"),
            ("LAMBDA_RUNTIME_DIR", "/var/runtime"),
            ("AWS_LAMBDA_FUNCTION_NAME", "orders"),
            ("AWS_LAMBDA_FUNCTION_VERSION", "orders-00002"),
            ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512"),
            ("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/orders"),
            ("AWS_REGION", "eu-west-1"),
            ("AWS_DEFAULT_REGION", "eu-west-1"),
            ("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand"),
            ("TZ", ":UTC"),
        ] {
            assert_eq!(e.get(k).map(String::as_str), Some(v), "{k}");
        }
        config.handler = None;
        config.tz = Some("Europe/Berlin".into());
        let e = env(&config);
        assert!(!e.contains_key("_HANDLER"), "left as the container has it");
        assert!(!e.contains_key("TZ"), "the container's own TZ is inherited");
    }
}
