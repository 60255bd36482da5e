//! runr-wrapper: parses the subcommand and calls it (see [`runr_wrapper::commands`]).

use std::path::Path;
use std::process::ExitCode;

use runr_wrapper::commands;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None | Some("serve") => commands::serve(),
        Some("install") => match args.get(1) {
            Some(dest) if args.len() == 2 => commands::install(Path::new(dest)),
            _ => commands::usage("install needs exactly one argument: the destination path"),
        },
        Some("tick") if args.len() == 1 => commands::tick(),
        Some("version" | "--version" | "-V" | "help" | "--help" | "-h") => commands::version(),
        Some(other) => commands::usage(&format!("unknown subcommand {other:?}")),
    }
}
