//! runr-wrapper: parses the subcommand and calls it (see [`runr_wrapper::commands`]).

use std::path::Path;
use std::process::ExitCode;

use runr_base::cli::Ask;
use runr_wrapper::commands;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match Ask::of(args.first().map(String::as_str)) {
        Ask::Default | Ask::Command("serve") => commands::serve(),
        Ask::Command("install") => match args.get(1) {
            Some(dest) if args.len() == 2 => commands::install(Path::new(dest)),
            _ => commands::usage("install needs exactly one argument: the destination path"),
        },
        Ask::Command("tick") if args.len() == 1 => commands::tick(),
        Ask::Version | Ask::Help => commands::version(),
        Ask::Command(other) => commands::usage(&format!("unknown subcommand {other:?}")),
    }
}
