//! The subcommands, `serve` (the default), `install <dest>`, `tick` and `version`, each turned
//! into an exit status: 2 for bad configuration or usage, 1 for a failure at run time.
//!
//! `serve` sets up once, for every shape of run, what they all need: the log format, the one
//! thread runtime, the reaper, the observer and (for the servers) the shutdown signal; then it
//! runs the exec/persistent server, http mode (direct exec or the observed proxy) or the
//! schedule one-shot, and flushes the spans still queued.

use std::future::Future;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use runr_base::cli::Exit;
use runr_base::env::process_lookup;
use runr_base::fmt::error_chain;

use crate::config::telemetry::{self, LogFormat};
use crate::config::{Config, Mode};
use crate::observe::{self, logs, LOG_FORMAT, PREFIX};
use crate::process::{reaper, result_fd};
use crate::request::trigger::TriggerRule;
use crate::{http, schedule};

/// How long the exporter gets at exit for the spans (and the writer for the captures) still
/// queued.
const FLUSH_LIMIT: Duration = Duration::from_secs(2);

/// `serve`: runs as configured until SIGTERM/SIGINT (servers) or until the one-shot is done.
pub fn serve() -> ExitCode {
    let parsed = Config::from_lookup(&process_lookup);
    let config = match runr_base::cli::configure(parsed, || {
        // In the format asked for, when that variable itself is good.
        init_logs(
            telemetry::log_format_of(&process_lookup),
            tracing::Level::INFO,
        )
    }) {
        Ok(config) => config,
        Err(code) => return code,
    };
    init_logs(config.telemetry.log_format, config.log_level);
    logs::install(&config.telemetry);
    // A misspelt variable would otherwise be ignored without a word. Names the wrapper sets for
    // its handlers (`RUNR_HEADER_*`, `RUNR_METHOD`, …) are only in the handlers' environment;
    // those the platform sets in every function container are never warned about.
    runr_base::env::warn_unknown(
        &["RUNR_"],
        &[crate::config::TABLES, &[runr_tick::config::VARS][..]].concat(),
    );
    // http mode without tracing/replay: become the program (returns only when that failed).
    // Before any runtime or signal handler exists: execve keeps the signal mask and ignored
    // signals.
    if let Some(code) = http::direct::exec_if_direct(&config) {
        return code;
    }
    // Before the runtime opens its descriptors: fd 3 stays ours from here on.
    if config.handler.result_fd && matches!(config.mode, Mode::Exec | Mode::Persistent) {
        if let Err(e) = result_fd::reserve() {
            tracing::error!(error = %e, "cannot reserve fd 3 for RUNR_RESULT_FD");
            return ExitCode::from(Exit::Failed);
        }
    }
    // One thread: the wrapper's work per request is small, and a single thread keeps its
    // memory small and its spawning/reaping free of cross-thread races.
    match runr_base::runtime::block_on(run(&config)) {
        Some(code) => ExitCode::from(code),
        None => ExitCode::from(Exit::Failed),
    }
}

/// The wrapper's own lines in `format`, from `level` on.
fn init_logs(format: LogFormat, level: tracing::Level) {
    let style = match format {
        LogFormat::Text => runr_base::log::Style::Text,
        LogFormat::Json => runr_base::log::Style::Json,
    };
    runr_base::log::init_styled(LOG_FORMAT, style, level);
}

/// Everything after the runtime exists: observer, reaper, signals, then the run's shape.
async fn run(config: &Config) -> u8 {
    observe::install(&config.observe);
    reaper::adopt_orphans();
    // Before anything is spawned (persistent workers start right away).
    if let Err(e) = reaper::ensure_started() {
        tracing::error!(error = %e, "cannot install signal handlers");
        return 1;
    }
    let code = if TriggerRule::of_config(config).runs_once() {
        // A one-shot has nothing to drain: SIGTERM keeps its default action and ends it.
        schedule::run(config).await
    } else {
        let shutdown = match shutdown() {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot install signal handlers");
                return 1;
            }
        };
        match config.mode {
            Mode::Http => http::proxy::run(config, shutdown).await,
            Mode::Exec | Mode::Persistent | Mode::Lambda => {
                http::server::run(config, shutdown).await
            }
        }
    };
    observe::flush(FLUSH_LIMIT).await;
    code
}

/// Resolves on the first SIGTERM (the kubelet: scale-down, a new revision) or SIGINT (Ctrl-C by
/// hand), saying which; the handlers are installed when this is called.
fn shutdown() -> std::io::Result<impl Future<Output = ()>> {
    let stop = runr_base::signal::shutdown()?;
    Ok(async move {
        let signal = stop.await;
        tracing::info!(signal = signal.name(), "shutdown requested");
    })
}

/// `tick`: the same command as the `runr-tick` binary (its own variables: PORT, RUNR_TICK_URL,
/// RUNR_TICK_WAIT), with the wrapper's log prefix.
pub fn tick() -> ExitCode {
    runr_base::log::init(LOG_FORMAT, tracing::Level::INFO);
    runr_tick::command(&process_lookup)
}

/// `install <dest>`: copies this executable to `dest`.
pub fn install(dest: &Path) -> ExitCode {
    match crate::install::install(dest) {
        Ok(()) => {
            eprintln!("{PREFIX} installed to {}", dest.display());
            ExitCode::from(Exit::Done)
        }
        Err(e) => {
            eprintln!("{PREFIX} install failed: {}", error_chain(&e));
            ExitCode::from(Exit::Failed)
        }
    }
}

/// `version` / `help`: the version line, the usage, the variables and their defaults.
pub fn version() -> ExitCode {
    runr_base::cli::print_usage(&version_text())
}

/// Bad usage: `problem`, then the usage, on stderr; exit 2.
pub fn usage(problem: &str) -> ExitCode {
    runr_base::cli::usage_error("runr-wrapper", problem, &version_text())
}

fn version_text() -> String {
    format!(
        "runr-wrapper {}\n\nUsage: runr-wrapper [serve | install <dest> | tick | version]\n\n{}\n\
         tick reads PORT, RUNR_TICK_URL and RUNR_TICK_WAIT (see runr-tick help).\n",
        env!("CARGO_PKG_VERSION"),
        runr_base::env::help(crate::config::TABLES),
    )
}
