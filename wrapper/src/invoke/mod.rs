//! The mode-agnostic way to run one invocation: the server (or the schedule one-shot) makes an
//! [`Invocation`] of a request and hands it to [`Invoker::invoke`], which runs it in the
//! configured mode and gives back its [`Outcome`] — the answer, streamed or whole, plus what
//! happened to the handler — having observed it ([`Invocation::finish`]; a streamed answer
//! where its body ends).

pub(crate) mod budget;
pub(crate) mod exec;
pub(crate) mod invocation;
pub(crate) mod lambda;
pub(crate) mod outcome;
pub(crate) mod pool;

use std::path::PathBuf;

use crate::config::{Config, Mode};
use crate::envelope::{BODY_PIECE, WRITE_CHUNK};
use crate::process::arg_limit::TooLarge;
use crate::request::body::{BodyError, BodyReader};
use crate::request::Request;
use budget::Held;
use exec::Exec;
pub use invocation::{Client, Invocation};
use lambda::Lambda;
pub use outcome::{Ended, Outcome, MAX_OUTPUT};
use pool::Pool;

/// Where code-mounted functions find their files; the handler's cwd when it exists.
pub const CODE_DIR: &str = "/app/code";

/// What one envelope encoding holds besides the body: one piece being encoded (a piece at
/// most 6 times as long once JSON-escaped) and one write to the pipe.
const ENVELOPE_PIECE: u64 = (6 * BODY_PIECE + WRITE_CHUNK) as u64;

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
    /// whole.
    pub fn streams_body(&self) -> bool {
        match self {
            Invoker::Exec(exec) => exec.streams_body(),
            Invoker::Pool(_) | Invoker::Lambda(_) => false,
        }
    }

    /// Bytes held per body byte: lambda mode builds its event whole (the body as base64 or
    /// JSON-escaped text beside it), the other modes hold the body once.
    fn body_factor(&self) -> u64 {
        match self {
            Invoker::Lambda(_) => 3,
            _ => 1,
        }
    }

    /// The bytes a request with a body of `body` bytes will hold while it runs, reserved
    /// before a byte of the body is read: the body (unless raw input streams it), the envelope
    /// being encoded, the start of the body a replay capture keeps (`keep`). Its answer is
    /// charged once it is known.
    pub fn holds(&self, body: u64, keep: usize) -> u64 {
        let capture = body.min(keep as u64);
        if self.streams_body() {
            return capture;
        }
        let envelope = match self {
            Invoker::Exec(_) | Invoker::Pool(_) if body > 0 => ENVELOPE_PIECE,
            _ => 0,
        };
        body * self.body_factor() + envelope + capture
    }

    /// Gives `inv` its body: left on the connection for a handler that takes it as it arrives,
    /// else read whole by the deadline (what it did not need of the `reserved` bytes goes
    /// back).
    pub async fn take_body(
        &self,
        inv: &mut Invocation,
        body: BodyReader,
        declared: Option<u64>,
        reserved: u64,
    ) -> Result<(), BodyError> {
        if self.streams_body() {
            inv.stream_body(body);
            return Ok(());
        }
        inv.read_body(body, declared, reserved, self.body_factor())
            .await
    }

    /// Runs `inv` to its end, answering 504 at its deadline, and observes it; never fails:
    /// every failure is an answer. A streamed answer is observed where its body ends.
    pub async fn invoke(&self, mut inv: Invocation) -> Outcome {
        inv.begin();
        let mut outcome = match self {
            Invoker::Exec(exec) => exec.invoke(&mut inv).await,
            Invoker::Pool(pool) => pool.invoke(&mut inv).await,
            Invoker::Lambda(lambda) => lambda.invoke(&mut inv).await,
        };
        match outcome.stream.take() {
            Some(stream) => {
                // Its bytes pass through to the client: none stay held.
                *inv.held() = Held::unlimited();
                let status = outcome.reply.status;
                outcome.stream = Some(stream.on_end(move |end| {
                    inv.finish(&Outcome::streamed(status, end.ended()));
                }));
            }
            None => {
                // The answer is held until it is written to the client: counted until then.
                inv.held().charge(outcome.reply.body.len() as u64);
                outcome.held = std::mem::replace(inv.held(), Held::unlimited());
                inv.finish(&outcome);
            }
        }
        outcome
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

    /// What a probe is answered while [`Invoker::ready`] is false.
    pub fn not_ready(&self) -> &'static str {
        match self {
            Invoker::Pool(_) => "no worker is ready",
            _ => "the function is not ready",
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
