//! Configuration from environment variables, with one grammar for every binary.
//!
//! A binary's `Config` parser creates one [`Env`] over a lookup function (the process
//! environment in `main`, a map in tests: `std::env::set_var` is a data race), reads each
//! variable once with the typed readers below, and fails with every bad variable at once
//! ([`ConfigErrors`]), each naming the variable and its value. The grammar, the same
//! everywhere:
//!
//! - an empty (or all-blank) value means unset, for every variable of every binary;
//! - durations: a number of seconds, whole or decimal (`30`, `2.5`), or a number with a unit
//!   `ms`, `s`, `m` or `h` (`500ms`, `1.5s`, `5m`, `1h`, `5 m`); variables whose meaning an
//!   outside standard fixes in milliseconds (OpenTelemetry's `OTEL_*_TIMEOUT`, `OTEL_BSP_*`)
//!   take a bare number as milliseconds and the same units otherwise ([`Env::duration_ms`]);
//! - sizes: bytes (`1048576`), or a number with a unit, all powers of 1024: `KiB`, `MiB`,
//!   `GiB`, `TiB`, also written `Ki`/`KB`/`k`, `Mi`/`MB`/`m`, … in any case (the wrapper's
//!   replay sizes read `10MB` as 10 MiB before, as Docker's `--memory 512m` does, and a value
//!   that was valid keeps its meaning);
//! - flags: `1`, `true`, `yes`, `on` and `0`, `false`, `no`, `off`, in any case;
//! - log levels: `error`, `warn`, `info`, `debug`, `trace`, in any case.
//!
//! Each binary also declares its variables in a table of [`VarDoc`]s, from which `version` and
//! `help` print the "Environment variables" section ([`help`]); [`names_read`] and [`unlisted`]
//! let a test check that every variable the parser reads is in that table.

use std::cell::RefCell;
use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

// === the variables table ===

/// What a variable is when it is not set, as `help` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultValue {
    /// The binary refuses to start without it.
    Required,
    /// Unset means "off" or "none"; nothing to show.
    Unset,
    /// This value, as a user would write it.
    Is(&'static str),
}

/// One row of a binary's variables table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VarDoc {
    /// The variable's name.
    pub name: &'static str,
    /// What it is when unset.
    pub default: DefaultValue,
    /// What it does, in a few words.
    pub meaning: &'static str,
}

impl VarDoc {
    /// A variable with a default value.
    pub const fn new(name: &'static str, default: &'static str, meaning: &'static str) -> VarDoc {
        VarDoc {
            name,
            default: DefaultValue::Is(default),
            meaning,
        }
    }

    /// A required variable.
    pub const fn required(name: &'static str, meaning: &'static str) -> VarDoc {
        VarDoc {
            name,
            default: DefaultValue::Required,
            meaning,
        }
    }

    /// A variable that is off or empty when unset.
    pub const fn optional(name: &'static str, meaning: &'static str) -> VarDoc {
        VarDoc {
            name,
            default: DefaultValue::Unset,
            meaning,
        }
    }
}

/// The `Environment variables:` section of `help`/`version`: one line per variable, names
/// aligned, then its meaning and `(default: …)` or `(required)` (tini's `print_usage` shape).
pub fn help(tables: &[&[VarDoc]]) -> String {
    let rows = || tables.iter().flat_map(|t| t.iter());
    let width = rows().map(|v| v.name.len()).max().unwrap_or(0);
    let mut out = String::from("Environment variables:\n");
    for v in rows() {
        let tail = match v.default {
            DefaultValue::Required => " (required)".to_string(),
            DefaultValue::Unset => String::new(),
            DefaultValue::Is(d) => format!(" (default: {d})"),
        };
        out.push_str(&format!("  {:<width$}  {}{tail}\n", v.name, v.meaning));
    }
    out
}

/// Every name `parse` asks its lookup for, in order. The lookup answers from `vars`, so a test
/// can drive the parser down each branch (a mode, a feature switched on).
pub fn names_read(
    vars: &[(&str, &str)],
    parse: impl FnOnce(&dyn Fn(&str) -> Option<String>),
) -> Vec<String> {
    let seen = RefCell::new(Vec::new());
    let lookup = |name: &str| {
        seen.borrow_mut().push(name.to_string());
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    };
    parse(&lookup);
    seen.into_inner()
}

/// The names in `read` that no row of `tables` documents (a test asserts it is empty).
pub fn unlisted(tables: &[&[VarDoc]], read: &[String]) -> Vec<String> {
    let mut out: Vec<String> = read
        .iter()
        .filter(|n| !tables.iter().flat_map(|t| t.iter()).any(|v| v.name == *n))
        .cloned()
        .collect();
    out.dedup();
    out
}

/// A variable present in the environment, named like a binary's own (its prefixes), that none of
/// its tables documents. Most often a typo or a variable of another binary, which would otherwise
/// be ignored without a word; `nearest` is the documented name it most likely meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown {
    /// The name as it is set.
    pub name: String,
    /// A documented name within a few edits of it, or with the same last two words.
    pub nearest: Option<&'static str>,
}

/// The names among `present` that start with one of `prefixes`, that no row of `tables`
/// documents and that the platform does not set in function containers
/// ([`crate::platform::VARS`]), sorted, each with its likely intended name.
pub fn unknown(
    prefixes: &[&str],
    tables: &[&[VarDoc]],
    present: impl IntoIterator<Item = String>,
) -> Vec<Unknown> {
    let documented = || tables.iter().flat_map(|t| t.iter()).map(|v| v.name);
    let mut out: Vec<Unknown> = present
        .into_iter()
        .filter(|n| {
            prefixes.iter().any(|p| n.starts_with(p))
                && !documented().any(|d| d == n)
                && !crate::platform::sets(n)
        })
        .map(|name| {
            let nearest = documented()
                .map(|d| (edit_distance(&name, d), d))
                .filter(|&(distance, d)| distance <= 3 || same_tail(&name, d))
                .min()
                .map(|(_, d)| d);
            Unknown { name, nearest }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup();
    out
}

/// Logs a warning for every [`unknown`] variable of the process environment (once logging is
/// set up, after the configuration was accepted). Names that are not UTF-8 are not ours.
pub fn warn_unknown(prefixes: &[&str], tables: &[&[VarDoc]]) {
    let present = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
    for u in unknown(prefixes, tables, present) {
        match u.nearest {
            Some(nearest) => tracing::warn!(
                variable = %u.name,
                did_you_mean = nearest,
                "unknown variable, ignored"
            ),
            None => tracing::warn!(variable = %u.name, "unknown variable, ignored"),
        }
    }
}

/// Whether two names end in the same two `_`-separated words (`RUNR_PREWARM_PLAIN_HTTP` and
/// `RUNR_REGISTRY_PLAIN_HTTP`): the same setting under another binary's prefix.
fn same_tail(a: &str, b: &str) -> bool {
    let tail = |s: &str| {
        let words: Vec<&str> = s.rsplitn(3, '_').collect();
        (words.len() == 3).then(|| (words[0].to_string(), words[1].to_string()))
    };
    tail(a).is_some_and(|t| Some(t) == tail(b))
}

/// Levenshtein distance over bytes (names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != cb))
                .min(above + 1)
                .min(row[j] + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

// === errors ===

/// One bad variable: its name, the value it had (`None` when unset) and what is wrong with it,
/// in words a user can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={}: {reason}", display_value(value))]
pub struct ConfigError {
    /// The variable.
    pub name: &'static str,
    /// Its value, `None` when it was not set.
    pub value: Option<String>,
    /// What is wrong with it.
    pub reason: String,
}

fn display_value(value: &Option<String>) -> String {
    match value {
        Some(v) => format!("{v:?}"),
        None => "<unset>".to_string(),
    }
}

impl ConfigError {
    /// An error for `name` holding `value` (`None`: unset).
    pub fn new(name: &'static str, value: Option<&str>, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            name,
            value: value.map(str::to_string),
            reason: reason.into(),
        }
    }
}

/// Every bad variable found in one pass, in the order they were read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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

impl ConfigErrors {
    /// The one report of bad configuration every binary makes: a line per bad variable at ERROR
    /// on the log the caller set up (`invalid configuration: NAME="value": reason`), and the
    /// exit status for it, [`crate::EXIT_CONFIG`].
    #[cold]
    pub fn report(&self) -> std::process::ExitCode {
        for e in &self.0 {
            tracing::error!("invalid configuration: {e}");
        }
        std::process::ExitCode::from(crate::EXIT_CONFIG)
    }

    /// The variables named, in order (tests).
    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|e| e.name).collect()
    }

    /// True when nothing was wrong.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

// === the reader ===

/// Reads variables through a lookup function and collects what is wrong with them.
pub struct Env<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
    errors: Vec<ConfigError>,
}

impl<'a> Env<'a> {
    /// A reader over `get`.
    pub fn new(get: &'a dyn Fn(&str) -> Option<String>) -> Env<'a> {
        Env {
            get,
            errors: Vec::new(),
        }
    }

    /// The value of `name` as set, trimmed; `None` when unset or blank.
    pub fn value(&self, name: &str) -> Option<String> {
        (self.get)(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// The value of `name` exactly as set, not trimmed (a password may begin or end with a
    /// blank); `None` when unset or all blank, as for every other reader.
    pub fn verbatim(&self, name: &str) -> Option<String> {
        (self.get)(name).filter(|v| !v.trim().is_empty())
    }

    /// Records that `name` (holding `value`) is bad.
    pub fn reject(&mut self, name: &'static str, value: Option<&str>, reason: impl Into<String>) {
        self.push_error(name, value, reason.into());
    }

    // Out of line and cold: a bad variable ends the process, and each binary reads dozens of
    // variables whose readers would otherwise all carry a copy of this.
    #[cold]
    #[inline(never)]
    fn push_error(&mut self, name: &'static str, value: Option<&str>, reason: String) {
        self.errors.push(ConfigError::new(name, value, reason));
    }

    /// `name` parsed with `parse`, `None` when unset (or bad: the error is recorded).
    pub fn optional<T>(
        &mut self,
        name: &'static str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        let value = self.value(name)?;
        self.check(name, &value, parse)
    }

    fn check<T>(
        &mut self,
        name: &'static str,
        value: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        match parse(value) {
            Ok(t) => Some(t),
            Err(reason) => {
                self.reject(name, Some(value), reason);
                None
            }
        }
    }

    /// `name` parsed with `parse`, `default` when unset (or bad: the error is recorded).
    pub fn parse<T>(
        &mut self,
        name: &'static str,
        default: T,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> T {
        self.optional(name, parse).unwrap_or(default)
    }

    /// `name` parsed with `parse`; unset is an error (`required`).
    pub fn required<T>(
        &mut self,
        name: &'static str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        match self.value(name) {
            Some(value) => self.check(name, &value, parse),
            None => {
                self.reject(name, None, "required");
                None
            }
        }
    }

    /// A flag (`1/0/true/false/yes/no/on/off`).
    pub fn flag(&mut self, name: &'static str, default: bool) -> bool {
        self.parse(name, default, parse_flag)
    }

    /// A duration (see the module docs for the grammar), zero allowed.
    pub fn duration(&mut self, name: &'static str, default: Duration) -> Duration {
        self.parse(name, default, parse_duration)
    }

    /// A duration where a bare number counts as milliseconds, for variables an outside
    /// standard defines in milliseconds (OpenTelemetry's `OTEL_EXPORTER_OTLP_TIMEOUT=10000`);
    /// with a unit it is the common grammar (`500ms`, `10s`).
    pub fn duration_ms(&mut self, name: &'static str, default: Duration) -> Duration {
        self.parse(name, default, parse_duration_ms)
    }

    /// A duration within `range` (both ends included).
    pub fn duration_in(
        &mut self,
        name: &'static str,
        default: Duration,
        range: RangeInclusive<Duration>,
    ) -> Duration {
        self.parse(name, default, |v| {
            let d = parse_duration(v)?;
            check_duration(d, &range)
        })
    }

    /// A size in bytes (see the module docs for the units).
    pub fn size(&mut self, name: &'static str, default: u64) -> u64 {
        self.parse(name, default, parse_size)
    }

    /// A size within `range` bytes.
    pub fn size_in(&mut self, name: &'static str, default: u64, range: RangeInclusive<u64>) -> u64 {
        self.parse(name, default, |v| {
            let n = parse_size(v)?;
            if range.contains(&n) {
                Ok(n)
            } else {
                Err(format!(
                    "expected a size from {} to {} bytes",
                    range.start(),
                    range.end()
                ))
            }
        })
    }

    /// A whole number within `range`.
    pub fn count<T>(&mut self, name: &'static str, default: T, range: RangeInclusive<T>) -> T
    where
        T: std::str::FromStr + PartialOrd + fmt::Display + Copy,
    {
        self.parse(name, default, |v| parse_count(v, &range))
    }

    /// A port to listen on: 0–65535, where 0 lets the kernel pick one (tests read the bound
    /// port from the `listening` line).
    pub fn listen_port(&mut self, name: &'static str, default: u16) -> u16 {
        self.parse(name, default, |v| {
            v.parse::<u16>()
                .map_err(|_| "expected a port number from 0 to 65535".to_string())
        })
    }

    /// A port to connect to: 1–65535.
    pub fn port(&mut self, name: &'static str, default: u16) -> u16 {
        self.parse(name, default, parse_port)
    }

    /// A log level.
    pub fn level(&mut self, name: &'static str, default: tracing::Level) -> tracing::Level {
        self.parse(name, default, parse_level)
    }

    /// True when some variable was bad so far.
    pub fn has_errors(&self) -> bool {
        !self.errors.is_empty()
    }

    /// Ends the pass: `Ok` when every variable was good.
    pub fn finish(self) -> Result<(), ConfigErrors> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(self.errors))
        }
    }

    /// Ends the pass with `value` when every variable was good (required ones included: pass
    /// them as `Option`s inside `value`'s builder and unwrap there with [`Option::zip`] etc.).
    pub fn finish_with<T>(self, value: Option<T>) -> Result<T, ConfigErrors> {
        match (self.errors.is_empty(), value) {
            (true, Some(v)) => Ok(v),
            (_, _) => Err(ConfigErrors(self.errors)),
        }
    }
}

/// The process environment as a lookup (values that are not UTF-8 are read lossily).
pub fn process_lookup(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// A lookup of fixed `name, value` pairs (a later pair wins): the environment a configuration
/// test, or a caller that builds one, hands to a `from_lookup` parser.
pub fn pairs_lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: std::collections::HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

// === the grammar ===

/// `1/0/true/false/yes/no/on/off`, any case.
pub fn parse_flag(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("expected 1 or 0 (also true/false, yes/no, on/off)".to_string()),
    }
}

/// `error`, `warn`, `info`, `debug` or `trace`, any case.
pub fn parse_level(v: &str) -> Result<tracing::Level, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "error" => Ok(tracing::Level::ERROR),
        "warn" | "warning" => Ok(tracing::Level::WARN),
        "info" => Ok(tracing::Level::INFO),
        "debug" => Ok(tracing::Level::DEBUG),
        "trace" => Ok(tracing::Level::TRACE),
        _ => Err("expected error, warn, info or debug".to_string()),
    }
}

/// A port to connect to, 1–65535.
pub fn parse_port(v: &str) -> Result<u16, String> {
    match v.trim().parse::<u16>() {
        Ok(0) | Err(_) => Err("expected a port number from 1 to 65535".to_string()),
        Ok(p) => Ok(p),
    }
}

/// A whole number within `range`.
pub fn parse_count<T>(v: &str, range: &RangeInclusive<T>) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + fmt::Display,
{
    match v.trim().parse::<T>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a whole number from {} to {}",
            range.start(),
            range.end()
        )),
    }
}

const DURATION_FORMS: &str = "expected seconds (30, 2.5) or a duration (500ms, 30s, 5m, 1h)";

/// A duration: seconds, whole or decimal, or a number with `ms`, `s`, `m` or `h`. Exact (no
/// floating point): `0.1s` is 100 ms, not 99.999… ms.
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let v = v.trim();
    let (number, unit) = split_number(v);
    let nanos_per_unit: u128 = match unit.trim() {
        "ms" => 1_000_000,
        "" | "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        other => return Err(format!("unknown unit {other:?}: {DURATION_FORMS}")),
    };
    let (scaled, denominator) = decimal(number).ok_or_else(|| DURATION_FORMS.to_string())?;
    let nanos = scaled
        .checked_mul(nanos_per_unit)
        .map(|n| n / denominator)
        .ok_or_else(|| "duration too large".to_string())?;
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| "duration too large")?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// A duration where a bare number counts as milliseconds (`10000`, `2.5`), else the common
/// grammar (`500ms`, `10s`, `1m`).
pub fn parse_duration_ms(v: &str) -> Result<Duration, String> {
    const FORMS: &str = "expected milliseconds (10000) or a duration (500ms, 10s, 1m)";
    let v = v.trim();
    let (number, unit) = split_number(v);
    let with_unit = if unit.trim().is_empty() {
        parse_duration(&format!("{number}ms"))
    } else {
        parse_duration(v)
    };
    with_unit.map_err(|e| {
        if e.contains("too large") {
            e
        } else {
            FORMS.to_string()
        }
    })
}

/// `d` if it lies in `range`, else a message naming the range the way a user writes it.
pub fn check_duration(d: Duration, range: &RangeInclusive<Duration>) -> Result<Duration, String> {
    if d < *range.start() {
        if range.start().is_zero() || *range.start() <= Duration::from_nanos(1) {
            return Err("must be greater than zero".to_string());
        }
        return Err(format!(
            "must be at least {}",
            display_duration(*range.start())
        ));
    }
    if d > *range.end() {
        return Err(format!(
            "must be at most {}",
            display_duration(*range.end())
        ));
    }
    Ok(d)
}

/// A size in bytes: a number, optionally with a unit that is a power of 1024 (`KiB`, `Ki`, `KB`,
/// `k`, `MiB`, …, any case); a decimal number with a unit (`1.5MiB`) is rounded down to whole
/// bytes.
pub fn parse_size(v: &str) -> Result<u64, String> {
    const FORMS: &str = "expected bytes (1048576) or a size (512KiB, 64MiB, 2GiB)";
    let (number, unit) = split_number(v.trim());
    let per_unit: u128 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "ki" | "kb" | "k" => 1 << 10,
        "mib" | "mi" | "mb" | "m" => 1 << 20,
        "gib" | "gi" | "gb" | "g" => 1 << 30,
        "tib" | "ti" | "tb" | "t" => 1 << 40,
        other => return Err(format!("unknown unit {other:?}: {FORMS}")),
    };
    let (scaled, denominator) = decimal(number).ok_or_else(|| FORMS.to_string())?;
    scaled
        .checked_mul(per_unit)
        .map(|n| n / denominator)
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| "size too large".to_string())
}

/// The leading number (`[+]digits[.digits][e[+-]digits]`) and the rest (the unit). No unit of
/// the grammar starts with `e`, so an exponent is never mistaken for one.
fn split_number(v: &str) -> (&str, &str) {
    let b = v.as_bytes();
    let mut end = usize::from(b.first() == Some(&b'+'));
    while end < b.len() && (b[end].is_ascii_digit() || b[end] == b'.') {
        end += 1;
    }
    if end < b.len() && matches!(b[end], b'e' | b'E') {
        let mut exp = end + 1;
        if exp < b.len() && matches!(b[exp], b'+' | b'-') {
            exp += 1;
        }
        let digits = b[exp..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits > 0 {
            end = exp + digits;
        }
    }
    v.split_at(end)
}

/// `12.5` as (125, 10), `2.5e1` as (25, 1), `1e-3` as (1, 1000): exact. A leading `+` and an
/// exponent are accepted because the wrapper's timeout used to be read as a float (`+30`,
/// `1e3`) and a value that was valid stays valid; at least one digit, at most 18 decimals and
/// exponents within ±30.
fn decimal(number: &str) -> Option<(u128, u128)> {
    let number = number.strip_prefix('+').unwrap_or(number);
    let (mantissa, exponent) = match number.find(['e', 'E']) {
        Some(i) => (&number[..i], number[i + 1..].parse::<i32>().ok()?),
        None => (number, 0),
    };
    let (whole, frac) = match mantissa.split_once('.') {
        Some((w, f)) => (w, f),
        None => (mantissa, ""),
    };
    if whole.is_empty() && frac.is_empty() || frac.contains('.') || frac.len() > 18 {
        return None;
    }
    if exponent.unsigned_abs() > 30 {
        return None;
    }
    let scaled: u128 = format!("{whole}{frac}").parse().ok()?;
    let mut denominator = 10u128.pow(frac.len() as u32);
    let power = 10u128.pow(exponent.unsigned_abs());
    if exponent >= 0 {
        Some((scaled.checked_mul(power)?, denominator))
    } else {
        denominator = denominator.checked_mul(power)?;
        Some((scaled, denominator))
    }
}

/// A duration the way a user writes it: `30s`, `2.5s`, `500ms`, `5m`, `1h`; exact (integer
/// arithmetic: a float would print `88888888888885.547s` for `88888888888885.55`), so what it
/// prints reads back as the same duration.
pub fn display_duration(d: Duration) -> String {
    let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
    if nanos == 0 {
        if secs >= 3600 && secs.is_multiple_of(3600) {
            format!("{}h", secs / 3600)
        } else if secs >= 60 && secs.is_multiple_of(60) {
            format!("{}m", secs / 60)
        } else {
            format!("{secs}s")
        }
    } else if secs == 0 && nanos.is_multiple_of(1_000_000) {
        format!("{}ms", nanos / 1_000_000)
    } else {
        let frac = format!("{nanos:09}");
        format!("{secs}.{}s", frac.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn durations_every_unit() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2.5"), Ok(MS(2500)));
        assert_eq!(parse_duration("0.25"), Ok(MS(250)));
        assert_eq!(parse_duration(".5"), Ok(MS(500)));
        assert_eq!(parse_duration("500ms"), Ok(MS(500)));
        assert_eq!(parse_duration("1.5ms"), Ok(Duration::from_micros(1500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1.5s"), Ok(MS(1500)));
        assert_eq!(parse_duration("0.1s"), Ok(MS(100)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("5 m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration(" 1h "), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        // The wrapper's RUNR_TIMEOUT used to be read as a float: those forms stay valid.
        assert_eq!(parse_duration("+30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1e3"), Ok(Duration::from_secs(1000)));
        assert_eq!(parse_duration("2.5e1s"), Ok(Duration::from_secs(25)));
        assert_eq!(parse_duration("1E-3"), Ok(MS(1)));
        assert_eq!(
            parse_duration("1e9"),
            Ok(Duration::from_secs(1_000_000_000))
        );
    }

    #[test]
    fn durations_invalid_forms() {
        for bad in [
            "",
            "s",
            "ms",
            ".",
            "1.2.3",
            "-1",
            "-1s",
            "++1s",
            "abc",
            "NaN",
            "inf",
            "1e",
            "e3",
            "1e3.5",
            "1e99",
            "10d",
            "5 mins",
            "1h30m",
            "99999999999999999999h",
            "1,5s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn millisecond_durations_for_outside_standards() {
        assert_eq!(parse_duration_ms("10000"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration_ms(" 100 "), Ok(MS(100)));
        assert_eq!(parse_duration_ms("2.5"), Ok(Duration::from_micros(2500)));
        assert_eq!(parse_duration_ms("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration_ms("500ms"), Ok(MS(500)));
        assert_eq!(parse_duration_ms("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration_ms("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration_ms("1e3"), Ok(MS(1000)));
        for bad in ["", "ms", "-1", "10d", "1e", "soon"] {
            assert_eq!(
                parse_duration_ms(bad).unwrap_err(),
                "expected milliseconds (10000) or a duration (500ms, 10s, 1m)",
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_duration_ms("99999999999999999999999").unwrap_err(),
            "duration too large"
        );
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// A bare number is that many milliseconds, exactly.
            #[test]
            fn bare_numbers_are_milliseconds(ms in 0u64..1 << 40, frac in 0u32..1000) {
                prop_assert_eq!(parse_duration_ms(&ms.to_string()), Ok(MS(ms)));
                let expected = MS(ms) + Duration::from_micros(u64::from(frac));
                prop_assert_eq!(parse_duration_ms(&format!("{ms}.{frac:03}")), Ok(expected));
            }

            /// With a unit it is the common grammar.
            #[test]
            fn numbers_with_a_unit_keep_it(n in 0u64..1 << 20, unit in 0usize..4, space in any::<bool>()) {
                let (name, per) = [("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000)][unit];
                let v = format!("{n}{}{name}", if space { " " } else { "" });
                prop_assert_eq!(parse_duration_ms(&v), Ok(MS(n * per)));
            }

            /// Any text: an answer, never a panic.
            #[test]
            fn any_text_is_answered(v in "\\PC{0,24}") {
                let _ = parse_duration_ms(&v);
            }
        }
    }

    #[test]
    fn duration_ranges_and_display() {
        let r = MS(1)..=Duration::from_secs(86_400);
        assert_eq!(check_duration(MS(1), &r), Ok(MS(1)));
        assert_eq!(
            check_duration(Duration::from_micros(10), &r).unwrap_err(),
            "must be at least 1ms"
        );
        assert_eq!(
            check_duration(Duration::from_secs(86_401), &r).unwrap_err(),
            "must be at most 24h"
        );
        let positive = Duration::from_nanos(1)..=Duration::MAX;
        assert_eq!(
            check_duration(Duration::ZERO, &positive).unwrap_err(),
            "must be greater than zero"
        );
        assert_eq!(display_duration(Duration::from_secs(30)), "30s");
        assert_eq!(display_duration(MS(2500)), "2.5s");
        assert_eq!(display_duration(MS(250)), "250ms");
        assert_eq!(display_duration(Duration::from_secs(300)), "5m");
        assert_eq!(display_duration(Duration::from_nanos(1_500)), "0.0000015s");
    }

    /// Found by fuzz/fuzz_targets/env_grammar.rs: a float-formatted display did not read back.
    #[test]
    fn regression_large_decimal_durations_read_back() {
        let d = parse_duration("88888888888885.55").unwrap();
        assert_eq!(display_duration(d), "88888888888885.55s");
        assert_eq!(parse_duration(&display_duration(d)), Ok(d));
    }

    #[test]
    fn sizes_every_unit() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1 MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1Mi"), Ok(1 << 20));
        assert_eq!(parse_size("64kib"), Ok(64 << 10));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("10KB"), Ok(10 << 10));
        assert_eq!(parse_size("10k"), Ok(10 << 10));
        assert_eq!(parse_size("3M"), Ok(3 << 20));
        assert_eq!(parse_size("1gb"), Ok(1 << 30));
        assert_eq!(parse_size("5B"), Ok(5));
        assert_eq!(parse_size("1e3"), Ok(1000));
        for bad in [
            "",
            "MiB",
            "-1",
            "1.2.3KiB",
            "1XB",
            "1e",
            "99999999999TiB",
            "one",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn flags_ports_counts_levels() {
        for t in ["1", "true", "TRUE", "yes", "on", "On"] {
            assert_eq!(parse_flag(t), Ok(true), "{t}");
        }
        for f in ["0", "false", "no", "off", "OFF"] {
            assert_eq!(parse_flag(f), Ok(false), "{f}");
        }
        for bad in ["2", "y", "enabled", ""] {
            assert!(parse_flag(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_port("8080"), Ok(8080));
        assert!(parse_port("0").is_err());
        assert!(parse_port("65536").is_err());
        assert_eq!(parse_count("16", &(1..=16)), Ok(16));
        assert_eq!(
            parse_count::<u32>("17", &(1..=16)).unwrap_err(),
            "expected a whole number from 1 to 16"
        );
        assert!(parse_count::<u32>("1.5", &(1..=16)).is_err());
        assert_eq!(parse_level("DEBUG"), Ok(tracing::Level::DEBUG));
        assert!(parse_level("loud").is_err());
    }

    proptest::proptest! {
        // Values come from manifests people edit by hand: any text is a value or a reason.
        #[test]
        fn durations_and_sizes_never_panic(text in "\\PC{0,16}") {
            let _ = parse_duration(&text);
            let _ = parse_size(&text);
        }

        // `<whole>.<millis><unit>` against the same value computed in whole nanoseconds.
        #[test]
        fn durations_agree_with_integer_arithmetic(
            whole in 0u64..10_000_000,
            millis in 0u64..1000,
            unit in 0usize..4,
        ) {
            let (suffix, nanos_per_unit) =
                [("ms", 1_000_000u128), ("s", 1_000_000_000), ("m", 60_000_000_000), ("h", 3_600_000_000_000)][unit];
            let nanos = (u128::from(whole) * 1000 + u128::from(millis)) * nanos_per_unit / 1000;
            let want = Duration::new((nanos / 1_000_000_000) as u64, (nanos % 1_000_000_000) as u32);
            proptest::prop_assert_eq!(parse_duration(&format!("{whole}.{millis:03}{suffix}")), Ok(want));
            if millis == 0 {
                proptest::prop_assert_eq!(parse_duration(&format!("{whole}{suffix}")), Ok(want));
            }
            if unit == 1 {
                proptest::prop_assert_eq!(parse_duration(&format!("{whole}.{millis:03}")), Ok(want));
            }
        }
    }

    fn lookup(vars: &[(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        pairs_lookup(vars)
    }

    #[test]
    fn every_error_is_collected_with_name_and_value() {
        let get = lookup(&[
            ("A_PORT", "http"),
            ("A_WAIT", "soon"),
            ("A_FLAG", "maybe"),
            ("A_EMPTY", "   "),
        ]);
        let mut env = Env::new(&get);
        assert_eq!(env.listen_port("A_PORT", 8080), 8080);
        assert_eq!(env.duration("A_WAIT", MS(5)), MS(5));
        assert!(!env.flag("A_FLAG", false));
        assert_eq!(env.required("A_EMPTY", |v| Ok(v.to_string())), None);
        assert_eq!(env.count("A_UNSET", 4u32, 1..=8), 4);
        let errors = env.finish().unwrap_err();
        assert_eq!(errors.names(), ["A_PORT", "A_WAIT", "A_FLAG", "A_EMPTY"]);
        let text = errors.to_string();
        assert!(
            text.starts_with(r#"A_PORT="http": expected a port number from 0 to 65535; "#),
            "{text}"
        );
        assert!(text.ends_with("A_EMPTY=<unset>: required"), "{text}");
    }

    #[test]
    fn finish_with_needs_no_errors_and_a_value() {
        let get = lookup(&[("B", "7")]);
        let mut env = Env::new(&get);
        let b = env.required("B", |v| v.parse::<u8>().map_err(|e| e.to_string()));
        assert_eq!(env.finish_with(b), Ok(7));
        let get = lookup(&[]);
        let mut env = Env::new(&get);
        let b = env.required("B", |v| v.parse::<u8>().map_err(|e| e.to_string()));
        assert_eq!(env.finish_with(b).unwrap_err().names(), ["B"]);
    }

    #[test]
    fn verbatim_keeps_blanks_inside_a_value_and_blank_is_unset() {
        let get = lookup(&[("P", " s3cret "), ("B", " \t ")]);
        let env = Env::new(&get);
        assert_eq!(env.verbatim("P").as_deref(), Some(" s3cret "));
        assert_eq!(env.value("P").as_deref(), Some("s3cret"));
        assert_eq!(env.verbatim("B"), None);
        assert_eq!(env.verbatim("UNSET"), None);
    }

    const TABLE: &[VarDoc] = &[
        VarDoc::new("PORT", "8080", "port to listen on"),
        VarDoc::required("RUNR_X_MODE", "exec | http"),
        VarDoc::optional("RUNR_X_TRACE", "1: trace every request"),
    ];

    #[test]
    fn unknown_names_with_the_prefix_are_found_with_what_they_meant() {
        const OWN: &[VarDoc] = &[VarDoc::new("RUNR_TIMEOUT", "30", "per invocation")];
        const REGISTRY: &[VarDoc] = &[VarDoc::new("RUNR_REGISTRY_PLAIN_HTTP", "false", "http")];
        let present = [
            "RUNR_TIMOUT",             // a typo of a documented name
            "RUNR_PREWARM_PLAIN_HTTP", // another binary's prefix, the same setting
            "RUNR_SOMETHING_ELSE",     // nothing like it
            "RUNR_TIMEOUT",            // documented
            "PATH",                    // not ours
            "RUNR_TIMOUT",             // twice is reported once
            "RUNR_MODE",               // the platform's, not a mistake
            "RUNR_MODEL_GPT4_URL",     // the platform's, by pattern
        ]
        .map(String::from);
        let found = unknown(&["RUNR_"], &[TABLE, OWN, REGISTRY], present);
        assert_eq!(
            found,
            [
                Unknown {
                    name: "RUNR_PREWARM_PLAIN_HTTP".into(),
                    nearest: Some("RUNR_REGISTRY_PLAIN_HTTP")
                },
                Unknown {
                    name: "RUNR_SOMETHING_ELSE".into(),
                    nearest: None
                },
                Unknown {
                    name: "RUNR_TIMOUT".into(),
                    nearest: Some("RUNR_TIMEOUT")
                },
            ]
        );
        assert!(unknown(&["RUNR_"], &[OWN], ["RUNR_TIMEOUT".to_string()]).is_empty());
        assert!(unknown(
            &["RUNR_QUEUE_", "RUNR_X_"],
            &[OWN],
            ["RUNR_TIMOUT".to_string()]
        )
        .is_empty());
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("RUNR_TIMEOUT", "RUNR_TIMEOUT"), 0);
        assert_eq!(edit_distance("RUNR_TIMOUT", "RUNR_TIMEOUT"), 1);
        assert_eq!(edit_distance("RUNR_WORKER", "RUNR_WORKERS"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("abc", ""), 3);
    }

    #[test]
    fn help_renders_the_table() {
        assert_eq!(
            help(&[TABLE]),
            "Environment variables:\n\
             \x20 PORT          port to listen on (default: 8080)\n\
             \x20 RUNR_X_MODE   exec | http (required)\n\
             \x20 RUNR_X_TRACE  1: trace every request\n"
        );
    }

    #[test]
    fn names_read_finds_what_the_table_lacks() {
        let read = names_read(&[("RUNR_X_MODE", "exec")], |get| {
            let mut env = Env::new(get);
            env.listen_port("PORT", 8080);
            env.required("RUNR_X_MODE", |v| Ok(v.to_string()));
            env.flag("RUNR_X_SECRET", false);
        });
        assert_eq!(read, ["PORT", "RUNR_X_MODE", "RUNR_X_SECRET"]);
        assert_eq!(unlisted(&[TABLE], &read), ["RUNR_X_SECRET"]);
    }
}
