//! The mode-agnostic way to run one invocation: [`Invoker::invoke`] takes a parsed
//! [`Request`] and gives an [`Outcome`] — the HTTP answer plus what happened to the handler
//! (its error class, exit status, peak memory). The HTTP server and the schedule one-shot go
//! through it, and through the observation hook around it ([`start`], [`finish`]) that feeds
//! tracing, replay, metrics and the per-invocation log line.

pub(crate) mod exec;
pub(crate) mod lambda;
pub(crate) mod pool;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::StatusCode;
use tokio::time::Instant;

use crate::config::{Config, Mode};
use crate::http::admission::Held;
use crate::observe::logs::{self, InvocationLine, Tag};
use crate::observe::metrics::{self, Invocation};
use crate::observe::trace::{self, Span};
use crate::observe::{self, Failure, Finished};
use crate::process::arg_limit::TooLarge;
use crate::process::reaper::Exit;
use crate::request::body::BodyReader;
use crate::request::Request;
use crate::response::{ErrorClass, Reply};
use exec::Exec;
use lambda::Lambda;
use pool::Pool;

/// Where code-mounted functions find their files; the handler's cwd when it exists.
pub const CODE_DIR: &str = "/app/code";

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
    /// The request body, streamed into the handler, turned out too large, broken or late: the
    /// handler was killed and the client answered 413, 400 or 408.
    Refused,
}

impl Ended {
    /// The `X-RunR-Error` class of the wrapper's answer when the handler did not answer.
    pub fn class(self) -> Option<ErrorClass> {
        match self {
            Ended::Answered => None,
            Ended::ExitStatus(_) | Ended::WorkerExited => Some(ErrorClass::Crash),
            Ended::FailedToStart => Some(ErrorClass::Start),
            Ended::TimedOut => Some(ErrorClass::Timeout),
            Ended::OutputTooLarge => Some(ErrorClass::Limit),
            Ended::Unavailable => Some(ErrorClass::Unavailable),
            // The body's own answer says (413: limit; 400, 408: request).
            Ended::Refused => None,
        }
    }
}

/// One invocation's result.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The HTTP answer.
    pub reply: Reply,
    /// What happened.
    pub ended: Ended,
    /// The first invocation of the process that ran it (exec mode: of the wrapper; persistent
    /// mode: of the worker).
    pub cold_start: bool,
    /// How the handler process ended, when it did during the invocation.
    pub exit: Option<Exit>,
    /// Exec mode: the handler's peak resident set in KiB (from `wait4`).
    pub peak_rss_kib: Option<u64>,
}

impl Outcome {
    /// The handler answered with `reply`.
    pub fn answered(reply: Reply) -> Outcome {
        Outcome {
            reply,
            ended: Ended::Answered,
            cold_start: false,
            exit: None,
            peak_rss_kib: None,
        }
    }

    /// A wrapper-made `{"error": ...}` answer, marked with the class of `ended`.
    pub fn failed(ended: Ended, status: StatusCode, message: &str) -> Outcome {
        let reply = match ended.class() {
            Some(class) => Reply::failure(class, status, message),
            None => Reply::error(status, message),
        };
        Outcome {
            ended,
            ..Outcome::answered(reply)
        }
    }

    /// The class of the wrapper's answer, `None` when the handler answered itself.
    pub fn class(&self) -> Option<ErrorClass> {
        self.ended.class().or_else(|| self.reply.error_class())
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

    /// The answer to a request body that failed while it was streamed into the handler.
    pub fn refused(reply: Reply) -> Outcome {
        Outcome {
            ended: Ended::Refused,
            ..Outcome::answered(reply)
        }
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
    /// Runtimes speaking the Lambda Runtime API.
    Lambda(Lambda),
}

impl Invoker {
    /// The invoker for `config`'s mode; `None` for http mode, where the program serves HTTP
    /// itself. Persistent workers are started here (inside the runtime).
    pub fn new(config: &Config) -> Option<Invoker> {
        match config.mode {
            Mode::Exec => Some(Invoker::Exec(Exec::new(config))),
            Mode::Persistent => Some(Invoker::Pool(Pool::start(config))),
            Mode::Lambda => match Lambda::start(config) {
                Ok(lambda) => Some(Invoker::Lambda(lambda)),
                Err(e) => {
                    tracing::error!(error = %e, "cannot serve the Lambda Runtime API");
                    None
                }
            },
            Mode::Http => None,
        }
    }

    /// How many invocations run at once: exec mode's `RUNR_MAX_INFLIGHT`, persistent mode's
    /// workers, lambda mode's runtimes. The server admits that many at a time.
    pub fn slots(&self) -> usize {
        match self {
            Invoker::Exec(exec) => exec.slots(),
            Invoker::Pool(pool) => pool.workers(),
            Invoker::Lambda(lambda) => lambda.runtimes(),
        }
    }

    /// Whether `req` can be handed to the handler at all, decided from its head before
    /// anything is spawned or its body read: exec mode passes the headers as environment
    /// variables, which the kernel limits.
    pub fn check(&self, req: &Request) -> Result<(), TooLarge> {
        match self {
            Invoker::Exec(exec) => exec.check(req),
            Invoker::Pool(_) | Invoker::Lambda(_) => Ok(()),
        }
    }

    /// Whether the handler takes the body as it arrives (exec mode, raw input) rather than
    /// whole: then [`Invoker::invoke`] gets the body still on the connection.
    pub fn streams_body(&self) -> bool {
        match self {
            Invoker::Exec(exec) => exec.streams_body(),
            Invoker::Pool(_) | Invoker::Lambda(_) => false,
        }
    }

    /// Runs one invocation to its end, answering 504 at `deadline`; never fails: every failure
    /// is an answer. `body` is the body still to be read when [`Invoker::streams_body`] (else
    /// `req.body` is all of it). The handler's log lines carry `tag`; exec mode counts the
    /// answer it collects in `held` (`RUNR_MAX_INFLIGHT_BYTES`) while it collects it.
    pub async fn invoke(
        &self,
        req: &Arc<Request>,
        body: Option<&mut BodyReader>,
        deadline: Instant,
        tag: Tag,
        held: &mut Held,
    ) -> Outcome {
        match self {
            Invoker::Exec(exec) => exec.invoke(req, body, deadline, tag, held).await,
            Invoker::Pool(pool) => pool.invoke(req, deadline, tag).await,
            // A runtime's lines are read by lambda mode itself (not tied to an invocation).
            Invoker::Lambda(lambda) => lambda.invoke(req, deadline).await,
        }
    }

    /// Whether Knative's probes may route traffic here: exec mode once listening; persistent
    /// mode once every worker has started and while at least one is alive; lambda mode once a
    /// runtime has initialised.
    pub fn ready(&self) -> bool {
        match self {
            Invoker::Exec(_) => true,
            Invoker::Pool(pool) => pool.ready(),
            Invoker::Lambda(lambda) => lambda.ready(),
        }
    }

    /// Stops long-lived processes (SIGTERM, SIGKILL after 5 s); a no-op in exec mode, whose
    /// processes live only as long as their requests.
    pub async fn shutdown(&self) {
        match self {
            Invoker::Pool(pool) => pool.shutdown().await,
            Invoker::Lambda(lambda) => lambda.shutdown().await,
            Invoker::Exec(_) => {}
        }
    }
}

/// `deadline` in Unix epoch milliseconds (`deadlineMs`, `RUNR_DEADLINE_MS`).
pub fn deadline_ms(deadline: Instant) -> u64 {
    let left = deadline.saturating_duration_since(Instant::now());
    runr_base::fmt::unix_millis(SystemTime::now() + left)
}

/// Logs once, at start, a `RUNR_COMMAND` whose program cannot be found or is not executable
/// (the wrapper still serves; exec mode answers `handler failed to start`).
pub fn check_program(program: &str) {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let found = if program.contains('/') {
        executable(std::path::Path::new(program))
    } else {
        std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|dir| executable(&dir.join(program)))
        })
    };
    if !found {
        tracing::error!(
            program,
            "RUNR_COMMAND cannot be run: its program is not found or not executable"
        );
    }
}

/// `/app/code` when it is a directory: the cwd of every handler process.
pub fn code_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(CODE_DIR);
    dir.is_dir().then_some(dir)
}

/// A duration the way the 504 message shows it: whole seconds as `30s`, else `2.5s`.
pub fn display_timeout(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        let s = format!("{:.3}", d.as_secs_f64());
        format!("{}s", s.trim_end_matches('0').trim_end_matches('.'))
    }
}

// === the observation hook ===

/// How an exec/persistent invocation failed, if it did.
pub fn failure_of(outcome: &Outcome) -> Option<Failure> {
    match outcome.ended {
        Ended::TimedOut => Some(Failure::Timeout),
        Ended::ExitStatus(_) | Ended::FailedToStart | Ended::WorkerExited => Some(Failure::Crash),
        Ended::Refused => None,
        Ended::Answered | Ended::OutputTooLarge | Ended::Unavailable => {
            (outcome.reply.status.as_u16() >= 500).then_some(Failure::Status)
        }
    }
}

/// The server span of an exec/persistent invocation, started before the handler runs.
#[derive(Debug, Default)]
pub struct Started {
    span: Option<Span>,
    /// Decided when the invocation begins ([`Started::begin`]), so that the first request
    /// invoked is the cold one (not one refused before it).
    cold_start: Option<bool>,
    /// The client's own `traceparent`, which the handler's copy of the request no longer has.
    client_traceparent: Option<http::HeaderValue>,
}

impl Started {
    /// Marks the moment the handler gets the request (after admission and the body).
    pub fn begin(&mut self) {
        if self.span.is_some() {
            self.cold_start = Some(trace::take_cold_start());
        }
    }

    /// True when a server span was started (tracing on).
    pub fn traced(&self) -> bool {
        self.span.is_some()
    }

    /// What the handler's log lines of `req` carry: its id, and its trace when tracing is on.
    pub fn tag(&self, req: &Request) -> Tag {
        Tag {
            request_id: Arc::from(req.id.as_str()),
            trace_id: self.span.as_ref().map(|s| Arc::from(s.trace_id_hex())),
        }
    }
}

/// The hook of exec and persistent mode before the handler runs: with tracing on, starts the
/// server span and gives the handler (envelope headers, `RUNR_HEADER_TRACEPARENT`) a
/// `traceparent` whose parent is that span, as the observed proxy does for http mode. Call
/// [`Started::begin`] when the invocation really begins.
pub fn start(req: &mut Request) -> Started {
    let Some(span) = observe::global().and_then(|o| o.start_span(&req.headers, SystemTime::now()))
    else {
        return Started::default();
    };
    let client_traceparent = req.headers.get(trace::TRACEPARENT).cloned();
    if let Ok(v) = http::HeaderValue::from_str(&span.traceparent()) {
        req.headers.insert(trace::TRACEPARENT, v);
    }
    Started {
        span: Some(span),
        cold_start: None,
        client_traceparent,
    }
}

/// The hook of exec and persistent mode, called where an invocation completed: metrics, the
/// per-invocation line, access line, span and replay capture, as configured. `body` is the
/// request body as far as it was kept and its full size; `started` comes from [`start`].
pub fn finish(
    req: &Request,
    body: (&[u8], u64),
    outcome: &Outcome,
    elapsed: Duration,
    started: Started,
) {
    let class = outcome.class();
    if outcome.ended == Ended::Refused {
        // A raw body streamed into the handler turned out too large, broken or late: the
        // client's request was refused (the handler was stopped), as if before it ran.
        if outcome.reply.status == StatusCode::PAYLOAD_TOO_LARGE {
            metrics::get().rejected(metrics::Rejected::BodyTooLarge);
        }
    } else {
        metrics::get().invocation(Invocation {
            trigger: req.trigger,
            status: outcome.reply.status.as_u16(),
            took: elapsed,
            error: class,
            cold_start: outcome.cold_start,
        });
    }
    logs::invocation(&InvocationLine {
        request_id: &req.id,
        trigger: req.trigger.as_str(),
        status: outcome.reply.status.as_u16(),
        took: elapsed,
        error: class.map(ErrorClass::as_str),
        exit_status: outcome.exit.map(Exit::code),
        peak_rss_kib: outcome.peak_rss_kib,
        replaced_request_id: req.replaced_id.as_deref(),
    });
    let Some(observer) = observe::global() else {
        return;
    };
    let failure = failure_of(outcome);
    let mut span = started.span;
    if let Some(s) = span.as_mut() {
        // The span covers the whole invocation, from the request's arrival (`elapsed` counts
        // the body read that came before the span was started).
        s.start = SystemTime::now() - elapsed;
    }
    // A capture shows what the client sent, so its traceparent goes back in.
    let client_headers;
    let headers = match (&span, failure, observer.replay_max_body().is_some()) {
        (Some(_), Some(_), true) => {
            let mut h = req.headers.clone();
            match &started.client_traceparent {
                Some(tp) => h.insert(trace::TRACEPARENT, tp.clone()),
                None => h.remove(trace::TRACEPARENT),
            };
            client_headers = h;
            &client_headers
        }
        _ => &req.headers,
    };
    observer.finish(Finished {
        span,
        trigger: req.trigger.as_str(),
        method: &req.method,
        path: &req.path,
        query: &req.raw_query,
        headers,
        body: body.0,
        body_size: body.1,
        status: outcome.reply.status.as_u16(),
        took: elapsed,
        failure,
        cold_start: started.cold_start.unwrap_or_else(trace::take_cold_start),
        replaced_id: req.replaced_id.as_deref().map(|r| (req.id.as_str(), r)),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_way_the_handler_did_not_answer_has_its_class() {
        use crate::response::ERROR_HEADER;
        let cases = [
            (Ended::TimedOut, "timeout"),
            (Ended::ExitStatus(3), "crash"),
            (Ended::WorkerExited, "crash"),
            (Ended::FailedToStart, "start"),
            (Ended::OutputTooLarge, "limit"),
            // What a persistent request gets when the pool is gone (shutting down).
            (Ended::Unavailable, "unavailable"),
        ];
        for (ended, class) in cases {
            let o = Outcome::failed(ended, StatusCode::BAD_GATEWAY, "x");
            assert_eq!(o.class().map(ErrorClass::as_str), Some(class));
            let header: Vec<_> = o
                .reply
                .headers
                .iter()
                .filter(|(n, _)| *n == ERROR_HEADER)
                .map(|(_, v)| v.to_str().unwrap())
                .collect();
            assert_eq!(header, [class]);
        }
        let answered = Outcome::answered(Reply::error(StatusCode::INTERNAL_SERVER_ERROR, "own"));
        assert_eq!(answered.class(), None);
        assert!(answered
            .reply
            .headers
            .iter()
            .all(|(n, _)| *n != ERROR_HEADER));
    }

    #[test]
    fn timeout_display() {
        assert_eq!(display_timeout(Duration::from_secs(30)), "30s");
        assert_eq!(display_timeout(Duration::from_millis(2500)), "2.5s");
        assert_eq!(display_timeout(Duration::from_millis(250)), "0.25s");
    }
}
