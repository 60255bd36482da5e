//! `runr-tick`: sends one schedule CloudEvent to the server on 127.0.0.1:$PORT (or
//! $RUNR_TICK_URL) once it listens, prints the answer, exits 0 for a status below 400.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use runr_base::cli::{self, Ask};

fn main() -> ExitCode {
    match Ask::of(std::env::args().nth(1).as_deref()) {
        Ask::Version => cli::print_usage(&format!("runr-tick {}\n", env!("CARGO_PKG_VERSION"))),
        Ask::Help => cli::print_usage(&usage()),
        Ask::Command(other) => cli::usage_error(
            "runr-tick",
            &format!("unknown argument {other:?}"),
            &usage(),
        ),
        Ask::Default => {
            runr_base::log::init(runr_tick::LOG_FORMAT, tracing::Level::INFO);
            runr_base::env::warn_unknown(&["RUNR_TICK_"], &[runr_tick::config::VARS]);
            runr_tick::command(&runr_base::env::process_lookup)
        }
    }
}

fn usage() -> String {
    format!(
        "runr-tick: sends one schedule CloudEvent (dev.runr.schedule.tick) and prints the answer.\n\
         Exit status: 0 for a status below 400, 1 otherwise or when nothing listens, 2 for bad configuration.\n\n{}",
        runr_base::env::help(&[runr_tick::config::VARS])
    )
}
