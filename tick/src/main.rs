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
            print!("{}", USAGE);
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("[runr-tick] unknown argument {other:?}\n{USAGE}");
            ExitCode::from(runr_tick::EXIT_CONFIG)
        }
        None => {
            runr_tick::log::init("runr-tick");
            runr_tick::command(|name| std::env::var(name).ok())
        }
    }
}

const USAGE: &str = "\
runr-tick: sends one schedule CloudEvent (dev.runr.schedule.tick) and prints the answer.
Exit status: 0 for a status below 400, 1 otherwise or when nothing listens, 2 for bad configuration.

Environment variables:
  PORT            port of the server on 127.0.0.1 (default: 8080)
  RUNR_TICK_URL   http://host:port/path to send to instead (default: unset)
  RUNR_TICK_WAIT  how long to wait for the server to listen (default: 60s)
";
