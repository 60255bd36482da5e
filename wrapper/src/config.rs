//! The wrapper's configuration: every environment variable, its default, and one error per bad
//! variable (name and value kept in the error) so a single restart shows every mistake.

use std::fmt;
use std::time::Duration;

/// Port the wrapper listens on (all interfaces). `0` picks a free port (logged at startup).
pub const ENV_PORT: &str = "PORT";
const DEFAULT_PORT: u16 = 8080;

/// `exec` (one process per invocation), `persistent` (long-lived workers, JSON lines) or `http`
/// (the program serves HTTP itself). Required.
pub const ENV_MODE: &str = "RUNR_WRAPPER_MODE";

/// The program to run: a JSON array of strings, or a plain string split on whitespace (no shell).
/// Required.
pub const ENV_COMMAND: &str = "RUNR_COMMAND";

/// What an exec-mode handler reads on stdin: `json` (the request envelope) or `raw` (the body).
pub const ENV_INPUT: &str = "RUNR_INPUT";
const DEFAULT_INPUT: Input = Input::Json;

/// Number of persistent-mode workers, 1–16.
pub const ENV_WORKERS: &str = "RUNR_WORKERS";
const DEFAULT_WORKERS: usize = 1;
const MAX_WORKERS: usize = 16;

/// Time limit per invocation: seconds (`30`, `2.5`) or with a unit (`500ms`, `30s`, `5m`).
pub const ENV_TIMEOUT: &str = "RUNR_TIMEOUT";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// An invocation limit above a day is a typo, not a plan.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// What sends the invocations: `http`, `queue` (CloudEvents from the queue consumer) or
/// `schedule` (one tick per run).
pub const ENV_TRIGGER: &str = "RUNR_TRIGGER";
const DEFAULT_TRIGGER: Trigger = Trigger::Http;

/// The wrapper's own log level: `error`, `warn`, `info` or `debug`.
pub const ENV_LOG: &str = "RUNR_LOG";
const DEFAULT_LOG: tracing::Level = tracing::Level::INFO;

/// How the user's program receives invocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One process per invocation.
    Exec,
    /// `RUNR_WORKERS` processes started once, one JSON line per invocation.
    Persistent,
    /// The program serves HTTP on `$PORT` itself.
    Http,
}

/// What an exec-mode handler gets on stdin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// The request envelope as JSON.
    Json,
    /// The request body as it arrived.
    Raw,
}

/// Where invocations come from; it goes into the envelope and `RUNR_TRIGGER`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Plain HTTP requests.
    Http,
    /// CloudEvents in binary mode POSTed by the queue consumer.
    Queue,
    /// Schedule ticks.
    Schedule,
}

impl Trigger {
    /// The name used in the envelope and in `RUNR_TRIGGER`.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Http => "http",
            Trigger::Queue => "queue",
            Trigger::Schedule => "schedule",
        }
    }
}

/// Everything the wrapper reads from its environment, parsed once at startup.
#[derive(Debug, Clone)]
pub struct Config {
    /// `PORT`.
    pub port: u16,
    /// `RUNR_WRAPPER_MODE`.
    pub mode: Mode,
    /// `RUNR_COMMAND`: program and arguments, never empty.
    pub command: Vec<String>,
    /// `RUNR_INPUT`.
    pub input: Input,
    /// `RUNR_WORKERS`.
    pub workers: usize,
    /// `RUNR_TIMEOUT`.
    pub timeout: Duration,
    /// `RUNR_TRIGGER`.
    pub trigger: Trigger,
    /// `RUNR_LOG`.
    pub log_level: tracing::Level,
    /// Tracing, replay capture and the observed proxy's upstream port.
    pub observe: crate::observe::ObserveConfig,
}

/// One bad variable: its name, the value it had (`None` when unset) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={}: {reason}", value.as_deref().map(|v| format!("{v:?}")).unwrap_or_else(|| "<unset>".into()))]
pub struct ConfigError {
    /// The variable.
    pub name: &'static str,
    /// Its value, `None` when it was not set.
    pub value: Option<String>,
    /// What is wrong with it, in words a user can act on.
    pub reason: String,
}

/// Every bad variable found in one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

// === impl Config ===

impl Config {
    /// Parses the configuration from `get` (the process environment in production, a map in
    /// tests), collecting every error before failing. Empty values count as unset.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
        let mut errors = Vec::new();
        let var = |name: &'static str| -> Var {
            let value = get(name).filter(|v| !v.trim().is_empty());
            Var { name, value }
        };

        let port = var(ENV_PORT).parse_or(DEFAULT_PORT, &mut errors, |v| {
            v.trim()
                .parse::<u16>()
                .map_err(|_| "not a port number (0-65535)".to_string())
        });
        let mode = var(ENV_MODE).parse_required(&mut errors, |v| match v.trim() {
            "exec" => Ok(Mode::Exec),
            "persistent" => Ok(Mode::Persistent),
            "http" => Ok(Mode::Http),
            _ => Err("expected exec, persistent or http".into()),
        });
        let command = var(ENV_COMMAND).parse_required(&mut errors, parse_command);
        let input = var(ENV_INPUT).parse_or(DEFAULT_INPUT, &mut errors, |v| match v.trim() {
            "json" => Ok(Input::Json),
            "raw" => Ok(Input::Raw),
            _ => Err("expected json or raw".into()),
        });
        let workers = var(ENV_WORKERS).parse_or(DEFAULT_WORKERS, &mut errors, |v| {
            match v.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_WORKERS).contains(&n) => Ok(n),
                _ => Err(format!("expected a whole number from 1 to {MAX_WORKERS}")),
            }
        });
        let timeout = var(ENV_TIMEOUT).parse_or(DEFAULT_TIMEOUT, &mut errors, parse_timeout);
        let trigger = var(ENV_TRIGGER).parse_or(DEFAULT_TRIGGER, &mut errors, |v| match v.trim() {
            "http" => Ok(Trigger::Http),
            "queue" => Ok(Trigger::Queue),
            "schedule" => Ok(Trigger::Schedule),
            _ => Err("expected http, queue or schedule".into()),
        });
        let log_level = var(ENV_LOG).parse_or(DEFAULT_LOG, &mut errors, |v| {
            match v.trim().to_ascii_lowercase().as_str() {
                "error" => Ok(tracing::Level::ERROR),
                "warn" => Ok(tracing::Level::WARN),
                "info" => Ok(tracing::Level::INFO),
                "debug" => Ok(tracing::Level::DEBUG),
                _ => Err("expected error, warn, info or debug".into()),
            }
        });
        let observe = crate::observe::ObserveConfig::parse(&get, port, &mut errors);

        match (mode, command) {
            (Some(mode), Some(command)) if errors.is_empty() => Ok(Config {
                port,
                mode,
                command,
                input,
                workers,
                timeout,
                trigger,
                log_level,
                observe,
            }),
            _ => Err(ConfigErrors(errors)),
        }
    }

    /// The variables, their defaults and meaning, for `runr-wrapper version` / `--help`.
    pub fn help() -> &'static str {
        "Environment variables:\n\
         \x20 PORT               port to listen on (default: 8080)\n\
         \x20 RUNR_WRAPPER_MODE  exec | persistent | http (required)\n\
         \x20 RUNR_COMMAND       the program: JSON array of strings, or a string split on whitespace (required)\n\
         \x20 RUNR_INPUT         json | raw: what an exec-mode handler reads on stdin (default: json)\n\
         \x20 RUNR_WORKERS       persistent-mode workers, 1-16 (default: 1)\n\
         \x20 RUNR_TIMEOUT       seconds per invocation, or 500ms / 30s / 5m (default: 30)\n\
         \x20 RUNR_TRIGGER       http | queue | schedule (default: http)\n\
         \x20 RUNR_LOG           error | warn | info | debug (default: info)\n"
    }
}

/// A variable being parsed; keeps name and value together for the error.
struct Var {
    name: &'static str,
    value: Option<String>,
}

impl Var {
    fn parse_or<T>(
        self,
        default: T,
        errors: &mut Vec<ConfigError>,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> T {
        match &self.value {
            None => default,
            Some(v) => match parse(v) {
                Ok(t) => t,
                Err(reason) => {
                    errors.push(self.error(reason));
                    default
                }
            },
        }
    }

    fn parse_required<T>(
        self,
        errors: &mut Vec<ConfigError>,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        match &self.value {
            None => {
                errors.push(self.error("required".into()));
                None
            }
            Some(v) => match parse(v) {
                Ok(t) => Some(t),
                Err(reason) => {
                    errors.push(self.error(reason));
                    None
                }
            },
        }
    }

    fn error(&self, reason: String) -> ConfigError {
        ConfigError {
            name: self.name,
            value: self.value.clone(),
            reason,
        }
    }
}

/// `["bash","/app/code/main.sh"]` or `bash /app/code/main.sh`: never through a shell, so what
/// the user wrote is exactly the argv.
pub fn parse_command(v: &str) -> Result<Vec<String>, String> {
    let v = v.trim();
    let argv: Vec<String> = if v.starts_with('[') {
        serde_json::from_str(v).map_err(|e| format!("not a JSON array of strings: {e}"))?
    } else {
        v.split_whitespace().map(str::to_string).collect()
    };
    match argv.first() {
        Some(program) if !program.is_empty() => Ok(argv),
        _ => Err("the command is empty".into()),
    }
}

/// Seconds as a number (`30`, `2.5`), or a number with a unit (`500ms`, `30s`, `5m`).
pub fn parse_timeout(v: &str) -> Result<Duration, String> {
    let v = v.trim();
    let (number, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60.0)
    } else {
        (v, 1.0)
    };
    let bad = || "expected seconds (30, 2.5) or a duration (500ms, 30s, 5m)".to_string();
    let n: f64 = number.trim().parse().map_err(|_| bad())?;
    if !n.is_finite() || n <= 0.0 {
        return Err("must be greater than zero".into());
    }
    let d = Duration::try_from_secs_f64(n * scale).map_err(|_| bad())?;
    if d > MAX_TIMEOUT {
        return Err("must be at most 24 hours".into());
    }
    if d < Duration::from_millis(1) {
        return Err("must be at least 1ms".into());
    }
    Ok(d)
}

/// A duration the way the 504 message shows it: whole seconds as `30s`, else `2.5s`.
pub fn display_timeout(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        let s = format!("{:.3}", d.as_secs_f64());
        format!("{}s", s.trim_end_matches('0').trim_end_matches('.'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn defaults_with_required_variables() {
        let c = parse(&[(ENV_MODE, "exec"), (ENV_COMMAND, "cat")]).unwrap();
        assert_eq!(c.port, 8080);
        assert_eq!(c.mode, Mode::Exec);
        assert_eq!(c.command, vec!["cat"]);
        assert_eq!(c.input, Input::Json);
        assert_eq!(c.workers, 1);
        assert_eq!(c.timeout, Duration::from_secs(30));
        assert_eq!(c.trigger, Trigger::Http);
    }

    #[test]
    fn every_variable_parsed() {
        let c = parse(&[
            (ENV_PORT, "9000"),
            (ENV_MODE, "persistent"),
            (ENV_COMMAND, r#"["python3", "-u", "/app/code/main.py"]"#),
            (ENV_INPUT, "raw"),
            (ENV_WORKERS, "16"),
            (ENV_TIMEOUT, "2.5"),
            (ENV_TRIGGER, "queue"),
            (ENV_LOG, "debug"),
        ])
        .unwrap();
        assert_eq!(c.port, 9000);
        assert_eq!(c.mode, Mode::Persistent);
        assert_eq!(c.command, vec!["python3", "-u", "/app/code/main.py"]);
        assert_eq!(c.input, Input::Raw);
        assert_eq!(c.workers, 16);
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.trigger, Trigger::Queue);
        assert_eq!(c.log_level, tracing::Level::DEBUG);
    }

    #[test]
    fn every_error_is_collected_with_name_and_value() {
        let errs = parse(&[
            (ENV_PORT, "http"),
            (ENV_MODE, "fork"),
            (ENV_WORKERS, "17"),
            (ENV_TIMEOUT, "-1"),
            (ENV_INPUT, "xml"),
            (ENV_TRIGGER, "cron"),
        ])
        .unwrap_err();
        let names: Vec<_> = errs.0.iter().map(|e| e.name).collect();
        assert_eq!(
            names,
            [
                ENV_PORT,
                ENV_MODE,
                ENV_COMMAND,
                ENV_INPUT,
                ENV_WORKERS,
                ENV_TIMEOUT,
                ENV_TRIGGER
            ]
        );
        let text = errs.to_string();
        assert!(text.contains(r#"PORT="http": not a port number"#), "{text}");
        assert!(text.contains("RUNR_COMMAND=<unset>: required"), "{text}");
        assert!(text.contains(r#"RUNR_WORKERS="17""#), "{text}");
    }

    #[test]
    fn workers_bounds() {
        for ok in ["1", "16"] {
            assert!(parse(&[(ENV_MODE, "exec"), (ENV_COMMAND, "x"), (ENV_WORKERS, ok)]).is_ok());
        }
        for bad in ["0", "17", "two", "1.5"] {
            assert!(parse(&[(ENV_MODE, "exec"), (ENV_COMMAND, "x"), (ENV_WORKERS, bad)]).is_err());
        }
    }

    #[test]
    fn command_forms() {
        assert_eq!(
            parse_command("bash  /app/code/main.sh ").unwrap(),
            ["bash", "/app/code/main.sh"]
        );
        assert_eq!(parse_command(r#"["a b", "c"]"#).unwrap(), ["a b", "c"]);
        assert!(parse_command("[]").is_err());
        assert!(parse_command(r#"[""]"#).is_err());
        assert!(parse_command(r#"["a", 1]"#).is_err());
        assert!(parse_command("[not json").is_err());
    }

    #[test]
    fn empty_values_count_as_unset() {
        let c = parse(&[(ENV_MODE, "exec"), (ENV_COMMAND, "cat"), (ENV_PORT, "")]).unwrap();
        assert_eq!(c.port, 8080);
        let e = parse(&[(ENV_MODE, "exec"), (ENV_COMMAND, "  ")]).unwrap_err();
        assert_eq!(e.0[0].name, ENV_COMMAND);
    }

    #[test]
    fn timeout_units() {
        assert_eq!(parse_timeout("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_timeout("0.25").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_timeout("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_timeout("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_timeout("5m").unwrap(), Duration::from_secs(300));
        for bad in [
            "",
            "0",
            "-1",
            "abc",
            "5h",
            "ms",
            "NaN",
            "inf",
            "1e9",
            "0.0000001",
        ] {
            assert!(parse_timeout(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn timeout_display() {
        assert_eq!(display_timeout(Duration::from_secs(30)), "30s");
        assert_eq!(display_timeout(Duration::from_millis(2500)), "2.5s");
        assert_eq!(display_timeout(Duration::from_millis(250)), "0.25s");
    }
}
