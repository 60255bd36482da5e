//! The mode-agnostic way to run one invocation: [`Invoker::invoke`] takes a parsed
//! [`Request`] and gives an [`Outcome`] — the HTTP answer plus what happened to the handler.
//! The HTTP server, the schedule one-shot and tracing/replay all go through it.

use std::time::Duration;

use http::StatusCode;

use crate::config::{display_timeout, Config, Mode};
use crate::envelope::Request;
use crate::exec::Exec;
use crate::pool::Pool;
use crate::response::Reply;

/// Largest handler output (exec stdout, or one persistent response line) we answer with.
pub const MAX_OUTPUT: usize = 10 * 1024 * 1024;

/// What happened to the handler during one invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The handler answered (whatever status it chose).
    Answered,
    /// Exec mode: it exited non-zero without a response envelope; the status (128 + signal for
    /// a signal).
    ExitStatus(i32),
    /// The command could not be started.
    FailedToStart,
    /// It ran into the timeout (waiting for a worker included) and was killed.
    TimedOut,
    /// Persistent mode: the worker exited while handling the request.
    WorkerExited,
    /// It wrote more than [`MAX_OUTPUT`].
    OutputTooLarge,
    /// No worker can take requests any more (shutting down).
    Unavailable,
}

/// One invocation's result.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The HTTP answer.
    pub reply: Reply,
    /// What happened.
    pub ended: Ended,
}

impl Outcome {
    /// The handler answered with `reply`.
    pub fn answered(reply: Reply) -> Outcome {
        Outcome {
            reply,
            ended: Ended::Answered,
        }
    }

    /// A wrapper-made `{"error": ...}` answer.
    pub fn failed(ended: Ended, status: StatusCode, message: &str) -> Outcome {
        Outcome {
            reply: Reply::error(status, message),
            ended,
        }
    }

    /// 504 `handler timed out after Ns`.
    pub fn timed_out(timeout: Duration) -> Outcome {
        Outcome::failed(
            Ended::TimedOut,
            StatusCode::GATEWAY_TIMEOUT,
            &format!("handler timed out after {}", display_timeout(timeout)),
        )
    }

    /// 502 for output above [`MAX_OUTPUT`].
    pub fn output_too_large() -> Outcome {
        Outcome::failed(
            Ended::OutputTooLarge,
            StatusCode::BAD_GATEWAY,
            "handler output exceeds 10 MiB",
        )
    }

    /// 500 `handler failed to start`.
    pub fn failed_to_start() -> Outcome {
        Outcome::failed(
            Ended::FailedToStart,
            StatusCode::INTERNAL_SERVER_ERROR,
            "handler failed to start",
        )
    }
}

/// Runs invocations in the configured mode.
pub enum Invoker {
    /// One process per invocation.
    Exec(Exec),
    /// Long-lived workers.
    Pool(Pool),
}

impl Invoker {
    /// The invoker for `config`'s mode; `None` for http mode, where the program serves HTTP
    /// itself. Persistent workers are started here (inside the runtime).
    pub fn new(config: &Config) -> Option<Invoker> {
        match config.mode {
            Mode::Exec => Some(Invoker::Exec(Exec::new(config))),
            Mode::Persistent => Some(Invoker::Pool(Pool::start(config))),
            Mode::Http => None,
        }
    }

    /// Runs one invocation to its end; never fails: every failure is an answer.
    pub async fn invoke(&self, req: &Request) -> Outcome {
        match self {
            Invoker::Exec(exec) => exec.invoke(req).await,
            Invoker::Pool(pool) => pool.invoke(req).await,
        }
    }

    /// Stops long-lived processes (SIGTERM, SIGKILL after 5 s); a no-op in exec mode, whose
    /// processes live only as long as their requests.
    pub async fn shutdown(&self) {
        if let Invoker::Pool(pool) = self {
            pool.shutdown().await;
        }
    }
}
