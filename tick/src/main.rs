//! `runr-tick`: sends one schedule CloudEvent to the server on 127.0.0.1:$PORT (or
//! $RUNR_TICK_URL) once it listens, prints the answer, exits 0 for a status below 400.
#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        Some("version" | "--version" | "-V") => {
            println!("runr-tick {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some("help" | "--help" | "-h") => {
            print!("{}", usage());
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("[runr-tick] unknown argument {other:?}\n{}", usage());
            ExitCode::from(runr_base::EXIT_CONFIG)
        }
        None => {
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
