//! runr-queue: the queue trigger's consumer. It reads a Redis stream as a member of a consumer
//! group and POSTs every entry to the function as a CloudEvent in binary mode; a 2xx answer
//! acknowledges the entry, anything else is retried with backoff and, after the last attempt,
//! moved to the dead-letter stream `<stream>-dlq`. At least once: entries a consumer leaves
//! pending (killed, stopped mid-retry) are claimed by another after `RUNR_QUEUE_CLAIM_IDLE`.
//!
//! - [`config`]: every variable and its default;
//! - `event`: the CloudEvent (attributes, the fields as a JSON body);
//! - `answer`: what the function's answer means (ack, retry no earlier than, dead-letter);
//! - `store`: the Redis commands, the two connections, waiting out outages;
//! - `deliver`: the HTTP/1.1 client and its keep-alive pool;
//! - `trace`: the W3C `traceparent` of every attempt (the producer's trace continued);
//! - `metrics`: `/metrics` and `/healthz` on `RUNR_QUEUE_METRICS_PORT`;
//! - `consumer`: the reader (and claims), the heartbeat and one task per entry in hand;
//! - [`admin`]: the operator's subcommands (`create-group`, `redrive`).
#![forbid(unsafe_code)]

pub mod admin;
pub(crate) mod answer;
pub mod config;
pub(crate) mod consumer;
pub(crate) mod deliver;
pub(crate) mod event;
#[cfg(feature = "fuzz")]
pub mod fuzz;
pub(crate) mod metrics;
pub(crate) mod roots;
pub(crate) mod store;
pub(crate) mod trace;

use std::process::ExitCode;

use runr_base::cli::Exit;

pub use config::Config;
pub use consumer::{run, Ended};

/// Exit status when Redis refuses us for good (credentials, permissions, a key that is not a
/// stream) or the runtime cannot start.
pub const EXIT_FATAL: Exit = Exit::Failed;

/// The log format: `[runr-queue] LEVEL message fields…`, no timestamps (the kubelet's log
/// collector adds them).
pub const LOG_FORMAT: runr_base::log::LogFormat = runr_base::log::LogFormat {
    prefix: "runr-queue",
    info_level: true,
    timestamps: false,
};

/// The consumer as `main` runs it: configuration from `get`, logs, the runtime, the run, and
/// the exit status (0 after SIGTERM/SIGINT, 1 fatal, 2 bad configuration).
pub fn command(get: &dyn Fn(&str) -> Option<String>) -> ExitCode {
    let config = match runr_base::cli::configure(Config::from_lookup(get), || {
        runr_base::log::init(LOG_FORMAT, tracing::Level::INFO)
    }) {
        Ok(c) => c,
        Err(code) => return code,
    };
    runr_base::log::init(LOG_FORMAT, config.log_level);
    runr_base::env::warn_unknown(&["RUNR_QUEUE_"], &[config::VARS]);
    // One thread: the work is waiting on sockets; DNS lookups use tokio's blocking pool.
    let ended = runr_base::runtime::block_on(async {
        let shutdown = match runr_base::signal::shutdown() {
            Ok(s) => s,
            Err(e) => return Ended::Fatal(format!("cannot install the signal handlers: {e}")),
        };
        consumer::run(config, shutdown).await
    });
    let Some(ended) = ended else {
        return EXIT_FATAL.into();
    };
    match ended {
        Ended::Stopped { .. } => Exit::Done.into(),
        Ended::Fatal(m) => {
            tracing::error!(error = %m, "exiting");
            EXIT_FATAL.into()
        }
    }
}

/// What `version` and `help` print after their first line.
pub fn usage() -> String {
    format!(
        "Reads a Redis stream as a consumer group member and delivers every entry to \
         RUNR_QUEUE_TARGET as a CloudEvent (binary mode); 2xx acknowledges, anything else is \
         retried with backoff, then moved to <stream>-dlq.\n\
         Usage: runr-queue [run | create-group | redrive … | version | help]\n\
         create-group: creates the group at RUNR_QUEUE_START unless it exists (needs only \
         RUNR_QUEUE_REDIS_URL, RUNR_QUEUE_STREAM, RUNR_QUEUE_GROUP).\n\
         {}: moves dead letters back to the stream (each in one MULTI/EXEC) and prints how \
         many; --only lists runr-error classes and runr-status values.\n\
         Exit status: 0 after SIGTERM/SIGINT, 1 when Redis refuses us for good, 2 for bad \
         configuration.\n\n{}",
        admin::REDRIVE_USAGE,
        runr_base::env::help(&[config::VARS])
    )
}
