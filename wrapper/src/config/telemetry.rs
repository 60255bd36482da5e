//! What operators see of a running wrapper besides the answers: the Prometheus endpoint and the
//! log lines (their style, the per-invocation line, the cap on a handler's log output). Plain
//! values here; [`crate::observe::metrics`] and [`crate::observe::logs`] act on them.

use runr_base::env::{Env, VarDoc};

/// Port of the Prometheus endpoint (`GET /metrics`, all interfaces); unset: no endpoint. Must
/// differ from `PORT` (`0` for both is allowed: the kernel picks two different ports).
pub const ENV_METRICS_PORT: &str = "RUNR_METRICS_PORT";
/// `text` (the prefixed lines) or `json` (one JSON object per line, handler lines included).
pub const ENV_LOG_FORMAT: &str = "RUNR_LOG_FORMAT";
/// `1`: one log line per finished invocation (id, trigger, status, duration, error class, exit
/// status, peak RSS in exec mode).
pub const ENV_LOG_INVOCATIONS: &str = "RUNR_LOG_INVOCATIONS";
/// Handler log output kept per invocation (bytes, `KiB`, `MiB`); the rest is read and dropped,
/// and one line says how much. Unset (the default): no cap, every line is streamed to the logs
/// as the contract says.
pub const ENV_LOG_MAX_BYTES: &str = "RUNR_LOG_MAX_BYTES";

/// The telemetry variables, for `version`/`help`.
pub const VARS: &[VarDoc] = &[
    VarDoc::optional(
        ENV_METRICS_PORT,
        "port of GET /metrics (Prometheus text format); must differ from PORT (default: off)",
    ),
    VarDoc::new(
        ENV_LOG_FORMAT,
        "text",
        "text | json: every line the wrapper writes, handler lines included",
    ),
    VarDoc::new(
        ENV_LOG_INVOCATIONS,
        "0",
        "1 | 0: one line per finished invocation (status, duration, error, exit, peak RSS)",
    ),
    VarDoc::optional(
        ENV_LOG_MAX_BYTES,
        "handler log output kept per invocation; the rest is dropped with one line saying so (default: no cap)",
    ),
];

/// How the wrapper's lines and the handler's lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// `[runr-wrapper] ...` lines, handler lines as they are.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The telemetry part of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// `RUNR_METRICS_PORT`.
    pub metrics_port: Option<u16>,
    /// `RUNR_LOG_FORMAT`.
    pub log_format: LogFormat,
    /// `RUNR_LOG_INVOCATIONS`.
    pub log_invocations: bool,
    /// `RUNR_LOG_MAX_BYTES`; `None`: no cap.
    pub log_max_bytes: Option<u64>,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            metrics_port: None,
            log_format: LogFormat::Text,
            log_invocations: false,
            log_max_bytes: None,
        }
    }
}

impl TelemetryConfig {
    /// Reads the telemetry variables from `env` (which collects the errors). `port` is the
    /// wrapper's own port, which the metrics endpoint must not share.
    pub fn parse(env: &mut Env, port: u16) -> TelemetryConfig {
        let metrics_port = env.optional(ENV_METRICS_PORT, |v| {
            v.parse::<u16>()
                .map_err(|_| "expected a port number from 0 to 65535".to_string())
        });
        if let Some(p) = metrics_port.filter(|p| *p == port && *p != 0) {
            env.reject(
                ENV_METRICS_PORT,
                Some(&p.to_string()),
                "must differ from PORT",
            );
        }
        TelemetryConfig {
            metrics_port,
            log_format: env.parse(ENV_LOG_FORMAT, LogFormat::Text, parse_log_format),
            log_invocations: env.flag(ENV_LOG_INVOCATIONS, false),
            log_max_bytes: env.optional(ENV_LOG_MAX_BYTES, runr_base::env::parse_size),
        }
    }
}

/// `text` or `json`.
pub fn parse_log_format(v: &str) -> Result<LogFormat, String> {
    match v.to_ascii_lowercase().as_str() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err("expected text or json".into()),
    }
}

/// `RUNR_LOG_FORMAT` alone, for the lines that report a configuration that did not parse
/// (text when it is unset or bad itself).
pub fn log_format_of(get: &dyn Fn(&str) -> Option<String>) -> LogFormat {
    let mut env = Env::new(get);
    env.parse(ENV_LOG_FORMAT, LogFormat::Text, parse_log_format)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)], port: u16) -> (TelemetryConfig, Vec<&'static str>) {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |n: &str| map.get(n).cloned();
        let mut env = Env::new(&get);
        let c = TelemetryConfig::parse(&mut env, port);
        let names = env.finish().err().map(|e| e.names()).unwrap_or_default();
        (c, names)
    }

    #[test]
    fn off_and_text_by_default() {
        let (c, e) = parse(&[], 8080);
        assert!(e.is_empty());
        assert_eq!(c, TelemetryConfig::default());
        assert_eq!(c.log_max_bytes, None, "no cap");
    }

    #[test]
    fn every_variable_parsed() {
        let (c, e) = parse(
            &[
                (ENV_METRICS_PORT, "9090"),
                (ENV_LOG_FORMAT, "JSON"),
                (ENV_LOG_INVOCATIONS, "1"),
                (ENV_LOG_MAX_BYTES, "64KiB"),
            ],
            8080,
        );
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(c.metrics_port, Some(9090));
        assert_eq!(c.log_format, LogFormat::Json);
        assert!(c.log_invocations);
        assert_eq!(c.log_max_bytes, Some(64 << 10));
        for (v, bytes) in [("100", 100), ("2MiB", 2 << 20), ("0", 0)] {
            assert_eq!(
                parse(&[(ENV_LOG_MAX_BYTES, v)], 8080).0.log_max_bytes,
                Some(bytes)
            );
        }
    }

    #[test]
    fn the_metrics_port_must_differ_from_port() {
        assert_eq!(
            parse(&[(ENV_METRICS_PORT, "8080")], 8080).1,
            [ENV_METRICS_PORT]
        );
        // Both 0: two ports the kernel picks, never the same.
        assert!(parse(&[(ENV_METRICS_PORT, "0")], 0).1.is_empty());
        assert!(parse(&[(ENV_METRICS_PORT, "0")], 8080).1.is_empty());
    }

    #[test]
    fn bad_values_are_named() {
        let (_, e) = parse(
            &[
                (ENV_METRICS_PORT, "http"),
                (ENV_LOG_FORMAT, "xml"),
                (ENV_LOG_INVOCATIONS, "sometimes"),
                (ENV_LOG_MAX_BYTES, "1 parsec"),
            ],
            8080,
        );
        assert_eq!(
            e,
            [
                ENV_METRICS_PORT,
                ENV_LOG_FORMAT,
                ENV_LOG_INVOCATIONS,
                ENV_LOG_MAX_BYTES
            ]
        );
        let get = |n: &str| (n == ENV_LOG_FORMAT).then(|| "json".to_string());
        assert_eq!(log_format_of(&get), LogFormat::Json);
        let bad = |n: &str| (n == ENV_LOG_FORMAT).then(|| "xml".to_string());
        assert_eq!(log_format_of(&bad), LogFormat::Text);
    }
}
