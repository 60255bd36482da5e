//! The subcommands: `serve` (the default), `install <dest>` and `version`.

use std::path::Path;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::{Config, Mode};
use crate::invoke::Invoker;
use crate::{reaper, server, signal};

/// Why `serve` stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listening socket could not be bound.
    #[error("cannot listen on port {0}")]
    Bind(u16, #[source] std::io::Error),
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers")]
    Signals(#[source] std::io::Error),
    /// The configured mode is not served by this build.
    #[error("RUNR_WRAPPER_MODE={0:?} is not supported by this build")]
    Unsupported(&'static str),
}

/// Runs the wrapper as configured until SIGTERM/SIGINT, then drains and stops the workers.
pub async fn serve(config: Config) -> Result<(), ServeError> {
    crate::observe::install(&config.observe);
    reaper::adopt_orphans();
    // Before anything is spawned (persistent workers start right away).
    reaper::ensure_started().map_err(ServeError::Signals)?;
    let shutdown = signal::shutdown().map_err(ServeError::Signals)?;
    let invoker = match Invoker::new(&config) {
        Some(invoker) => Arc::new(invoker),
        None => return Err(ServeError::Unsupported(mode_name(config.mode))),
    };
    let listener = TcpListener::bind(("0.0.0.0", config.port))
        .await
        .map_err(|e| ServeError::Bind(config.port, e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| ServeError::Bind(config.port, e))?;
    tracing::info!(
        %addr,
        mode = %mode_name(config.mode),
        command = ?config.command,
        trigger = %config.trigger.as_str(),
        workers = config.workers,
        timeout = %crate::config::display_timeout(config.timeout),
        "listening"
    );
    server::run(listener, invoker.clone(), config.trigger, shutdown).await;
    invoker.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Exec => "exec",
        Mode::Persistent => "persistent",
        Mode::Http => "http",
    }
}

/// `install <dest>`.
pub fn install(dest: &Path) -> Result<(), crate::install::InstallError> {
    crate::install::install(dest)
}

/// `version`: the version line, then the environment variables and their defaults.
pub fn version() -> String {
    format!(
        "runr-wrapper {}\n\nUsage: runr-wrapper [serve | install <dest> | tick | version]\n\n{}\n{}",
        env!("CARGO_PKG_VERSION"),
        runr_base::env::help(&[crate::config::VARS, crate::observe::VARS]),
        TICK_VARS
    )
}

/// What `tick` reads: the `runr-tick` binary's variables.
const TICK_VARS: &str = "tick reads PORT, RUNR_TICK_URL and RUNR_TICK_WAIT (see runr-tick help).\n";
