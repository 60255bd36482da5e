//! The schedule tick of RunR: one CloudEvent (`dev.runr.schedule.tick`, binary content mode) sent
//! to a server on 127.0.0.1:$PORT once it listens.
//!
//! One implementation, two entrypoints: the `runr-tick` binary (WebAssembly images that need only
//! the tick) and `runr-wrapper tick`; the wrapper's schedule trigger also reuses the event, the
//! wait-for-listener loop and the send.
#![forbid(unsafe_code)]

pub mod client;
pub mod config;
pub mod event;

use std::io::Write;
use std::process::ExitCode;

use runr_base::cli::Exit;
use runr_base::log::LogFormat;

pub use client::{send, send_with, wait_and_send, wait_for_listener, TickError, TickResponse};
pub use config::{Target, TickConfig};
pub use event::ScheduleEvent;

/// The log lines of the `runr-tick` binary: prefixed, INFO named (a Job's log has nothing else
/// to tell our lines from the server's).
pub const LOG_FORMAT: LogFormat = LogFormat {
    prefix: "runr-tick",
    info_level: true,
    timestamps: false,
};

/// The whole `tick` command after logging is set up: reads the configuration through `get`,
/// sends one tick, prints the response body to stdout and returns the exit status (0 below 400,
/// 1 for an error status or no answer, 2 for bad configuration).
pub fn command(get: &dyn Fn(&str) -> Option<String>) -> ExitCode {
    // The log is set up (by main) before the configuration is read.
    let config = match runr_base::cli::configure(TickConfig::from_lookup(get), || {}) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let event = ScheduleEvent::new();
    match runr_base::runtime::block_on(wait_and_send(&config.target, config.wait, &event)) {
        None => Exit::Failed.into(),
        Some(Ok(response)) => ExitCode::from(print_response(&response)),
        Some(Err(e)) => {
            tracing::error!(target_url = %config.target, "{}", runr_base::fmt::error_chain(&e));
            Exit::Failed.into()
        }
    }
}

/// Writes the body to stdout and logs an error status; returns the exit status for `response`.
pub fn print_response(response: &TickResponse) -> u8 {
    let mut out = std::io::stdout().lock();
    let written = out.write_all(&response.body).and_then(|()| {
        if !response.body.ends_with(b"\n") && !response.body.is_empty() {
            out.write_all(b"\n")?;
        }
        out.flush()
    });
    if let Err(e) = written {
        // A closed stdout (BrokenPipe) loses the printout but not the tick's outcome.
        tracing::warn!(error = %e, "cannot write the response body to stdout");
    }
    if response.status >= 400 {
        tracing::error!(
            status = response.status,
            "the schedule event was answered with an error status"
        );
    }
    response.exit_code()
}
