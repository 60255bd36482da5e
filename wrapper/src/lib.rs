//! runr-wrapper: the entrypoint of RunR function containers. It turns HTTP requests, queue
//! CloudEvents and schedule ticks into invocations of the user's program (exec mode: one
//! process per invocation; persistent mode: long-lived workers speaking JSON lines), and as
//! PID 1 reaps every orphan.
#![forbid(unsafe_code)]

pub mod commands;
pub mod config;
pub mod envelope;
pub mod exec;
pub mod httpmode;
pub mod install;
pub mod invoke;
pub mod logging;
pub mod observe;
pub mod otlp;
pub mod pool;
pub mod process;
pub mod proxy;
pub mod reaper;
pub mod replay;
pub mod response;
pub mod schedule;
pub mod server;
pub mod signal;
pub mod trace;
