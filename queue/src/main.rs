//! `runr-queue`: the queue trigger's consumer (see the library's docs).
#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    let version = concat!("runr-queue ", env!("CARGO_PKG_VERSION"));
    match std::env::args().nth(1).as_deref() {
        None | Some("run") => runr_queue::command(&runr_base::env::process_lookup),
        Some("create-group") => runr_queue::admin::create_group(&runr_base::env::process_lookup),
        Some("redrive") => {
            let args: Vec<String> = std::env::args().skip(2).collect();
            runr_queue::admin::redrive(&runr_base::env::process_lookup, &args)
        }
        Some("version" | "--version" | "-V") => {
            print!("{version}\n{}", runr_queue::usage());
            ExitCode::SUCCESS
        }
        Some("help" | "--help" | "-h") => {
            print!("{version}\n{}", runr_queue::usage());
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!(
                "[runr-queue] ERROR unknown argument {other:?}\n{}",
                runr_queue::usage()
            );
            ExitCode::from(runr_base::EXIT_CONFIG)
        }
    }
}
