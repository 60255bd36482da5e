//! runr-wrapper: the entrypoint of RunR function containers. It turns HTTP requests, queue
//! CloudEvents and schedule ticks into invocations of the user's program (exec mode: one
//! process per invocation; persistent mode: long-lived workers speaking JSON lines; http mode:
//! the program's own server, directly or behind the observed proxy), and as PID 1 reaps every
//! orphan.
//!
//! The layers, each using only those below it:
//!
//! - [`commands`]: the subcommands, and what every run sets up once;
//! - `schedule`, `install`: the schedule one-shots; copying the binary;
//! - `http`: the server of exec/persistent mode (admission control), the observed proxy, http
//!   mode's direct run, the metrics endpoint;
//! - `invoke`: one invocation (its deadline, span and bytes held, and the one place it is
//!   observed) and the invoker of each mode: exec (with its variables), persistent, lambda;
//! - `envelope`: the JSON envelope a handler reads, encoded from the request as it is written;
//! - `process`: spawning in process groups (fd 3 included), the handler's log pipes, the one
//!   reaper, and the one supervisor of long-lived children;
//! - `observe`: the finished-invocation record, spans, OTLP export, replay capture, metrics,
//!   the handler's log lines and the per-invocation line, log format;
//! - `request`: the request value every mode uses, its id and CloudEvent, which trigger sent
//!   it, its body (read only once a handler can take it) and the body's errors;
//! - `response`: what the handler wrote → the answer (and the error classes of the wrapper's
//!   own answers);
//! - `config`: every variable.
#![forbid(unsafe_code)]

pub mod commands;
pub(crate) mod config;
pub(crate) mod envelope;
#[cfg(any(test, feature = "fuzz"))]
pub mod fuzz;
pub(crate) mod http;
pub(crate) mod install;
pub(crate) mod invoke;
pub(crate) mod observe;
pub(crate) mod process;
pub(crate) mod request;
pub(crate) mod response;
pub(crate) mod schedule;
