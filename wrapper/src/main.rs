//! runr-wrapper: parse the subcommand and the environment, set up logs, run, map the result to
//! an exit status (2 for bad configuration or usage, 1 for a failure at run time).

use std::path::Path;
use std::process::ExitCode;

use runr_wrapper::commands;
use runr_wrapper::config::Config;
use runr_wrapper::logging;

use runr_base::EXIT_CONFIG;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None | Some("serve") => serve(),
        Some("install") => match args.get(1) {
            Some(dest) if args.len() == 2 => install(Path::new(dest)),
            _ => usage("install needs exactly one argument: the destination path"),
        },
        Some("tick") if args.len() == 1 => tick(),
        Some("version" | "--version" | "-V" | "help" | "--help" | "-h") => {
            print!("{}", commands::version());
            ExitCode::SUCCESS
        }
        Some(other) => usage(&format!("unknown subcommand {other:?}")),
    }
}

fn serve() -> ExitCode {
    let config = match Config::from_lookup(&runr_base::env::process_lookup) {
        Ok(config) => config,
        Err(errors) => {
            logging::init(tracing::Level::INFO);
            for e in &errors {
                tracing::error!("invalid configuration: {e}");
            }
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    logging::init(config.log_level);
    // http mode without tracing/replay: become the program (returns only when that failed).
    if let Some(code) = runr_wrapper::httpmode::exec_if_direct(&config) {
        return code;
    }
    // One thread: the wrapper's work per request is small, and a single thread keeps its
    // memory small and its spawning/reaping free of cross-thread races.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    // The schedule one-shot (every mode) and the observed proxy (http mode) end with a status.
    if config.trigger == runr_wrapper::config::Trigger::Schedule {
        return ExitCode::from(runtime.block_on(runr_wrapper::schedule::run(config)));
    }
    if config.mode == runr_wrapper::config::Mode::Http {
        return ExitCode::from(runtime.block_on(runr_wrapper::proxy::main(config)));
    }
    match runtime.block_on(commands::serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("serve failed: {}", runr_base::fmt::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// `tick`: the same command as the `runr-tick` binary (its own variables: PORT, RUNR_TICK_URL).
fn tick() -> ExitCode {
    logging::init(tracing::Level::INFO);
    runr_tick::command(&runr_base::env::process_lookup)
}

fn install(dest: &Path) -> ExitCode {
    match commands::install(dest) {
        Ok(()) => {
            eprintln!("{} installed to {}", logging::PREFIX, dest.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "{} install failed: {}",
                logging::PREFIX,
                runr_base::fmt::error_chain(&e)
            );
            ExitCode::FAILURE
        }
    }
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("{} {problem}\n\n{}", logging::PREFIX, commands::version());
    ExitCode::from(EXIT_CONFIG)
}
