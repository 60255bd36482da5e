//! The operator's subcommands: `create-group` (the group ahead of any consumer, e.g. from an
//! init container, so an autoscaler that starts consumers from zero finds it) and `redrive`
//! (dead letters back to the stream). Both read the consumer's variables (only Redis, the stream
//! and the group are required) and wait out a Redis that is not there yet, like the consumer.

use std::process::ExitCode;

use crate::config::{self, Config, Role};
use crate::store::{Refusal, Store};
use crate::{Ended, EXIT_FATAL, LOG_FORMAT};

/// The configuration of an admin command, or its exit status (2, with one line per bad variable).
fn config_for_admin(get: &dyn Fn(&str) -> Option<String>) -> Result<Config, ExitCode> {
    match Config::for_role(get, Role::Admin) {
        Ok(c) => {
            runr_base::log::init(LOG_FORMAT, c.log_level);
            runr_base::env::warn_unknown(&["RUNR_QUEUE_"], &[config::VARS]);
            Ok(c)
        }
        Err(errors) => {
            runr_base::log::init(LOG_FORMAT, tracing::Level::INFO);
            for line in config::error_lines(&errors) {
                tracing::error!("invalid configuration: {line}");
            }
            Err(ExitCode::from(runr_base::EXIT_CONFIG))
        }
    }
}

/// Runs `work` with a store for `config` until it ends or SIGTERM/SIGINT; the exit status.
fn run_admin<F>(config: &Config, work: impl FnOnce(Store) -> F) -> ExitCode
where
    F: std::future::Future<Output = Result<(), Refusal>>,
{
    let ended = runr_base::runtime::block_on(async {
        crate::roots::install_crypto_provider();
        let shutdown = match runr_base::signal::shutdown() {
            Ok(s) => s,
            Err(e) => return Ended::Fatal(format!("cannot install the signal handlers: {e}")),
        };
        let store = match Store::new(config) {
            Ok(s) => s,
            Err(e) => return Ended::Fatal(e.to_string()),
        };
        tokio::select! {
            r = work(store) => match r {
                Ok(()) => Ended::Stopped { drained: true },
                Err(r) => {
                    tracing::error!(command = %r.command, key = %r.key, error = %r.error, "redis refused a command");
                    Ended::Fatal(r.to_string())
                }
            },
            signal = shutdown => {
                tracing::info!(signal = %signal, "stopped before the end");
                Ended::Stopped { drained: false }
            }
        }
    });
    match ended {
        Some(Ended::Stopped { .. }) => ExitCode::SUCCESS,
        Some(Ended::Fatal(_)) | None => ExitCode::from(EXIT_FATAL),
    }
}

/// `runr-queue create-group`: `XGROUP CREATE <stream> <group> <RUNR_QUEUE_START> MKSTREAM`
/// unless the group exists (which is no error: the command can run before every pod start).
pub fn create_group(get: &dyn Fn(&str) -> Option<String>) -> ExitCode {
    let config = match config_for_admin(get) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let c = config.clone();
    run_admin(&config, |store| async move {
        let config = c;
        let created = store.retry(|| store.create_group()).await?;
        if created {
            println!(
                "created group {} on stream {} at {}",
                config.group, config.stream, config.start
            );
        } else {
            println!(
                "group {} on stream {} exists: left as it is",
                config.group, config.stream
            );
        }
        Ok(())
    })
}
