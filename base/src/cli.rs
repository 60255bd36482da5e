//! The shape every binary's `main` has, once: what its first argument asks for, the
//! configuration parsed before any runtime or connection exists (one report of what is wrong),
//! and one mapping of how a run ended to the exit status the platform reads:
//! 0 done, 1 failed at run time, 2 bad configuration or usage.
//!
//! Each binary still says what it runs; this module only keeps the edges the same, so an
//! operator reads the same usage error, the same configuration report and the same statuses
//! from every RunR container and Job.

use std::fmt::Display;
use std::process::ExitCode;

use crate::env::ConfigErrors;

/// How a run ended, as every binary's exit status says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done: 0.
    Done,
    /// Failed at run time (a refused push, an unreachable server, a stop before the end): 1.
    Failed,
    /// Bad configuration or usage, nothing started: 2 ([`crate::EXIT_CONFIG`]).
    Config,
}

impl Exit {
    /// The status byte.
    pub const fn code(self) -> u8 {
        match self {
            Exit::Done => 0,
            Exit::Failed => 1,
            Exit::Config => crate::EXIT_CONFIG,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

/// What the first argument asks for, in the words every binary accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask<'a> {
    /// No argument: the binary's default subcommand.
    Default,
    /// `version`, `--version`, `-V`.
    Version,
    /// `help`, `--help`, `-h`.
    Help,
    /// Anything else: a subcommand of the binary's own, or a mistake.
    Command(&'a str),
}

impl<'a> Ask<'a> {
    /// Reads the first argument.
    pub fn of(first: Option<&'a str>) -> Ask<'a> {
        match first {
            None => Ask::Default,
            Some("version" | "--version" | "-V") => Ask::Version,
            Some("help" | "--help" | "-h") => Ask::Help,
            Some(other) => Ask::Command(other),
        }
    }
}

/// `text` (the version line first, then how to run it and its variables) on stdout; exit 0.
pub fn print_usage(text: &str) -> ExitCode {
    print!("{text}");
    Exit::Done.into()
}

/// Bad usage: `[name] problem`, a blank line and the usage `text` on stderr; exit 2.
pub fn usage_error(name: &str, problem: &str, text: &str) -> ExitCode {
    eprintln!("{}", usage_error_text(name, problem, text));
    Exit::Config.into()
}

fn usage_error_text(name: &str, problem: &str, text: &str) -> String {
    format!("[{name}] {problem}\n\n{}", text.trim_end())
}

/// The configuration, or the one report of what is wrong in it and exit 2. `init_log` sets up
/// the binary's log (at INFO, in its format) only when there is something to report: a
/// configuration that parsed sets the log up itself, at the level it names.
pub fn configure<C>(
    parsed: Result<C, ConfigErrors>,
    init_log: impl FnOnce(),
) -> Result<C, ExitCode> {
    parsed.map_err(|errors| {
        init_log();
        errors.report()
    })
}

/// How a run that returns a `Result` ended: 0, or `what failed: <error>` at ERROR and 1.
pub fn finish<E: Display>(what: &str, result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => Exit::Done.into(),
        Err(e) => {
            tracing::error!("{what} failed: {e}");
            Exit::Failed.into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statuses_are_the_platforms() {
        assert_eq!(
            [Exit::Done, Exit::Failed, Exit::Config].map(Exit::code),
            [0, 1, 2]
        );
    }

    #[test]
    fn every_spelling_of_version_and_help_is_read_alike() {
        for v in ["version", "--version", "-V"] {
            assert_eq!(Ask::of(Some(v)), Ask::Version, "{v}");
        }
        for h in ["help", "--help", "-h"] {
            assert_eq!(Ask::of(Some(h)), Ask::Help, "{h}");
        }
        assert_eq!(Ask::of(None), Ask::Default);
        assert_eq!(Ask::of(Some("serve")), Ask::Command("serve"));
        assert_eq!(Ask::of(Some("-v")), Ask::Command("-v"));
    }

    #[test]
    fn a_usage_error_names_the_binary_then_shows_the_usage() {
        assert_eq!(
            usage_error_text(
                "runr-x",
                "unknown argument \"y\"",
                "runr-x 1.0\nUsage: runr-x\n"
            ),
            "[runr-x] unknown argument \"y\"\n\nrunr-x 1.0\nUsage: runr-x"
        );
    }

    #[test]
    fn a_bad_configuration_is_reported_after_the_log_is_set_up() {
        let errors = ConfigErrors(vec![crate::env::ConfigError::new(
            "RUNR_X",
            Some("nope"),
            "must be a number",
        )]);
        let mut logged = false;
        let out = configure::<()>(Err(errors), || logged = true);
        assert!(out.is_err());
        assert!(logged);
        let mut logged = false;
        assert_eq!(configure(Ok(7), || logged = true).ok(), Some(7));
        assert!(!logged, "a good configuration sets up its own log");
    }
}
