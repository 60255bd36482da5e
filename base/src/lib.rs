//! runr-base: what the edge of every RunR data-plane binary needs, once.
//!
//! - [`backoff`]: the one backoff (exponential, capped, equal jitter);
//! - [`cli`]: the shape of every `main`: the first argument, the configuration report, the exit
//!   statuses;
//! - [`cloudevent`]: the attributes of the schedule and queue CloudEvents;
//! - [`env`]: reading configuration from environment variables, one grammar for durations,
//!   sizes, flags, ports and levels; one [`env::ConfigError`]; the variables table that
//!   `help`/`version` render;
//! - [`log`]: the prefixed one-line log format, in [`logfmt`]'s quoting;
//! - [`signal`]: the shutdown future (SIGTERM, SIGINT);
//! - [`runtime`]: the one-thread tokio runtime;
//! - [`logfmt`]: logfmt's quoting of values, messages and bare tokens;
//! - [`platform`]: the names the platform sets in every function container, which are never
//!   "unknown variables";
//! - [`fmt`]: hex, RFC 3339, random ids, UUID v4, error chains, control-character escaping;
//! - [`traceparent`]: W3C Trace Context's `traceparent`, parsed and written;
//! - [`target`]: a plain-HTTP endpoint from a URL;
//! - `serve` (feature `serve`): the HTTP/1 accept loop with a bounded drain;
//! - `otlp` (feature `otlp`): the OTLP/HTTP JSON span exporter and its `OTEL_*` variables;
//! - `roots` (feature `roots`): the compiled-in TLS roots as one PEM bundle.
//!
//! It depends only on crates the smallest binary (runr-tick) links anyway, so using it makes
//! no binary bigger; what needs more sits behind a feature.
#![forbid(unsafe_code)]

pub mod backoff;
pub mod cli;
pub mod cloudevent;
pub mod env;
pub mod fmt;
pub mod log;
pub mod logfmt;
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod platform;
#[cfg(feature = "roots")]
pub mod roots;
pub mod runtime;
#[cfg(feature = "serve")]
pub mod serve;
pub mod signal;
pub mod target;
pub mod traceparent;

/// Exit status for bad configuration or usage (the platform's contract: one line per bad
/// variable on stderr, then exit 2).
pub const EXIT_CONFIG: u8 = 2;
