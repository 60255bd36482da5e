//! `runr-prewarm [run|version|help]`: reads the environment, warms the images, prints the JSON
//! summary on stdout and exits 0 (all warmed), 1 (some failed, or stopped by SIGTERM/SIGINT) or 2
//! (bad configuration).

#![forbid(unsafe_code)]

use std::process::ExitCode;

use futures_util::future::Either;
use runr_base::cli::{self, Ask, Exit};

use runr_prewarm::{Config, LOG_FORMAT};

fn main() -> ExitCode {
    match Ask::of(std::env::args().nth(1).as_deref()) {
        Ask::Default | Ask::Command("run") => run(),
        Ask::Version | Ask::Help => cli::print_usage(&usage()),
        Ask::Command(other) => cli::usage_error(
            "runr-prewarm",
            &format!("unknown subcommand {other:?}"),
            &usage(),
        ),
    }
}

fn run() -> ExitCode {
    // First, while the process has one thread: it may set SSL_CERT_FILE (see
    // runr_registry::roots for why a scratch image needs it). Reported once logging is set up.
    let roots = runr_registry::ensure_system_roots();
    // Configuration next: a bad variable must stop the Job before anything is contacted.
    let config = match cli::configure(Config::from_lookup(runr_base::env::process_lookup), || {
        runr_base::log::init(LOG_FORMAT, tracing::Level::INFO)
    }) {
        Ok(config) => config,
        Err(code) => return code,
    };
    runr_base::log::init(LOG_FORMAT, config.log);
    runr_base::env::warn_unknown(
        &["RUNR_PREWARM_", "RUNR_REGISTRY_"],
        &[runr_prewarm::config::VARS, runr_registry::config::VARS],
    );
    if let Err(e) = roots {
        tracing::warn!(error = %e, "cannot provide the built-in CA roots as a system store");
    }
    // One thread: two workers measured no faster on the 500 MiB benchmark (prewarm spends about
    // 0.5 s of CPU on it; the cache's own copying is the bottleneck) and would take a core from
    // a cache running on the same node. See the README's figures.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return Exit::Failed.into();
        }
    };
    let outcome = runtime.block_on(async {
        // Installed first thing in the runtime: a SIGTERM from now on gets the summary out.
        let shutdown = match runr_base::signal::shutdown() {
            Ok(stop) => Either::Left(stop),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch for SIGTERM and SIGINT");
                Either::Right(std::future::pending::<runr_base::signal::Stop>())
            }
        };
        runr_prewarm::run(config, shutdown).await
    });
    // After a signal, a DNS lookup may still run on a blocking thread: the result is in, so the
    // runtime is not waited for.
    runtime.shutdown_background();
    match outcome {
        Ok(summary) => {
            summary.log();
            println!("{}", summary.to_json());
            match summary.success() {
                true => Exit::Done.into(),
                false => Exit::Failed.into(),
            }
        }
        Err(e) => {
            tracing::error!("{e}");
            Exit::Config.into()
        }
    }
}

/// What `version` and `help` print: the version first (deploy checks read that line), then
/// how to run it and every variable, from the tables the parser is tested against.
fn usage() -> String {
    format!(
        "runr-prewarm {}\n{USAGE}\n{}\n{GRAMMAR}",
        env!("CARGO_PKG_VERSION"),
        runr_base::env::help(&[runr_prewarm::config::VARS, runr_registry::config::VARS]),
    )
}

const USAGE: &str = "\
Makes a pull-through cache registry fetch and store images before builds need them.

Usage: runr-prewarm [run|version|help]   (run is the default)

Exit status: 0 every image warmed, 1 some image failed (or SIGTERM/SIGINT stopped the run:
unfinished images fail with the signal), 2 bad configuration.
Stdout: one JSON summary line, also after a signal. Stderr: log lines.
";

const GRAMMAR: &str = "\
Durations: seconds (30, 2.5) or 500ms, 30s, 5m, 1h. Flags: 1/0, true/false, yes/no, on/off.
An empty value counts as unset.
";
