//! The runtime processes: what each is started with (the environment Lambda gives a runtime),
//! and the runtime as a [supervised](crate::process::supervisor) child: it takes an invocation
//! when its slot's state says it asks for one, its timeout kills its whole process group (as
//! Lambda resets a sandbox), and it is restarted with the supervisor's backoff after it exits
//! or reported an init error.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::result::FunctionError;
use super::slot::{Exited, Job, Slot};
use super::Shared;
use crate::config::lambda::{LambdaConfig, DEFAULT_TZ};
use crate::observe::logs::{HandlerLog, Stream};
use crate::process::reaper::Exit;
use crate::process::supervisor::{Child, Served, Serving, Watch};
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
    /// Each slot's state and its Runtime API address (`AWS_LAMBDA_RUNTIME_API`).
    pub slots: Vec<(Arc<Slot>, String)>,
    /// What the slots share.
    pub shared: Arc<Shared>,
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

/// A runtime process in its slot.
pub struct Runtime {
    proc: Process,
    slot: Arc<Slot>,
    shared: Arc<Shared>,
}

impl Child for Runtime {
    type Job = Job;
    type Spec = Spec;
    const NAME: &'static str = "runtime";

    fn command(spec: &Spec) -> &[String] {
        &spec.command
    }

    fn start(spec: &Arc<Spec>, index: usize) -> io::Result<Runtime> {
        let (slot, api) = &spec.slots[index];
        slot.started();
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
        tracing::info!(slot = index, pid = proc.id(), api = %api, "runtime started");
        Ok(Runtime {
            proc,
            slot: slot.clone(),
            shared: spec.shared.clone(),
        })
    }

    fn start_failed(spec: &Spec, index: usize, error: &io::Error) {
        spec.slots[index].0.exited(127);
        let err = FunctionError::new(
            "Runtime.InvalidEntrypoint",
            format!("the runtime could not be started: {error}"),
        );
        spec.shared.init_failed(&err);
    }

    fn pid(&self) -> i32 {
        self.proc.id()
    }

    /// When its slot's state has a `/next` waiting.
    fn wants_job(&self) -> bool {
        self.slot.view().wants_job
    }

    /// Its exit, a state change of its slot, the timeout of its invocation, the grace after
    /// its init error.
    async fn watch(&mut self, cx: &mut Serving<'_, Job>) -> Watch {
        let slot = &self.slot;
        let view = slot.view();
        tokio::select! {
            exit = self.proc.wait() => {
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
                        self.shared.init_failed(&err);
                    }
                    // Never seen by the runtime that exited: another one takes it.
                    Exited::Undelivered(job) => cx.requeue(job),
                    Exited::Otherwise => {}
                }
                Watch::Ended
            }
            () = slot.poke.notified() => Watch::Continue,
            () = sleep_until(view.deadline), if view.deadline.is_some() => {
                if slot.time_out() {
                    tracing::warn!(slot = slot.index, pid = self.proc.id(), "runtime ran into the timeout; killing its process group");
                    self.proc.signal_group(Signal::SIGKILL);
                }
                Watch::Continue
            }
            () = sleep_until(view.init_failed_at.map(|at| at + INIT_ERROR_GRACE)), if view.init_failed_at.is_some() => {
                tracing::warn!(slot = slot.index, pid = self.proc.id(), "runtime did not exit after its init error; killing its process group");
                self.proc.signal_group(Signal::SIGKILL);
                let exit = self.proc.wait().await;
                slot.exited(exit.code());
                Watch::Ended
            }
        }
    }

    /// Hands `job` to the runtime's waiting `/next`.
    async fn serve(&mut self, job: Job, _: &mut Serving<'_, Job>) -> Served {
        if self.slot.assign(job) {
            Served::Answered
        } else {
            Served::Dropped
        }
    }

    fn signal(&mut self, signal: Signal) {
        self.proc.signal_group(signal);
    }

    async fn wait(&mut self) -> Exit {
        self.proc.wait().await
    }

    fn stopped(&mut self, exit: Exit) {
        self.slot.exited(exit.code());
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
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
