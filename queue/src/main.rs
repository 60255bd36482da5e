//! `runr-queue`: the queue trigger's consumer (see the library's docs).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use runr_base::cli::{self, Ask};
use runr_base::env::process_lookup;

fn main() -> ExitCode {
    let usage = || {
        format!(
            "runr-queue {}\n{}",
            env!("CARGO_PKG_VERSION"),
            runr_queue::usage()
        )
    };
    match Ask::of(std::env::args().nth(1).as_deref()) {
        Ask::Default | Ask::Command("run") => runr_queue::command(&process_lookup),
        Ask::Command("create-group") => runr_queue::admin::create_group(&process_lookup),
        Ask::Command("redrive") => {
            let args: Vec<String> = std::env::args().skip(2).collect();
            runr_queue::admin::redrive(&process_lookup, &args)
        }
        Ask::Version | Ask::Help => cli::print_usage(&usage()),
        Ask::Command(other) => cli::usage_error(
            "runr-queue",
            &format!("unknown argument {other:?}"),
            &usage(),
        ),
    }
}
