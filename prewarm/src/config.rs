//! Everything `runr-prewarm` reads from the environment, parsed in one place.
//!
//! [`Config::from_lookup`] reads through a closure (the real environment in `main`, a map in
//! tests) and collects every bad variable before failing, so one failed Job start shows every
//! mistake.

use std::fmt;
use std::time::Duration;

pub use runr_registry::reference::ImageRef;
pub use runr_registry::ConfigError;
use runr_registry::RegistryConfig;

/// The cache registry to warm, `host[:port]` (required). TLS unless `RUNR_REGISTRY_PLAIN_HTTP=1`.
pub const ENV_REGISTRY: &str = "RUNR_PREWARM_REGISTRY";
/// Image references as the cache serves them, `repository:tag` or `repository@sha256:…`,
/// separated by commas, spaces or newlines (required).
pub const ENV_IMAGES: &str = "RUNR_PREWARM_IMAGES";
/// Platforms of a multi-platform index to warm: `linux/amd64,linux/arm64` or `all`.
pub const ENV_PLATFORMS: &str = "RUNR_PREWARM_PLATFORMS";
/// How many times each image is tried.
pub const ENV_ATTEMPTS: &str = "RUNR_PREWARM_ATTEMPTS";
/// Default of [`ENV_ATTEMPTS`].
pub const DEFAULT_ATTEMPTS: u32 = 3;
/// How long to wait for the registry to answer `GET /v2/` at all (at start, and again whenever
/// it goes away mid-run) before giving up.
pub const ENV_WAIT: &str = "RUNR_PREWARM_WAIT";
/// Default of [`ENV_WAIT`].
pub const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// Blobs fetched at once, across all images.
pub const ENV_CONCURRENCY: &str = "RUNR_PREWARM_CONCURRENCY";
/// Default of [`ENV_CONCURRENCY`].
pub const DEFAULT_CONCURRENCY: usize = 4;
/// Time allowed for one image, all attempts included.
pub const ENV_TIMEOUT: &str = "RUNR_PREWARM_TIMEOUT";
/// Default of [`ENV_TIMEOUT`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);
/// Upper bound of the first pause between two attempts of an image; it doubles per attempt
/// (with jitter, capped at 60 s), and a `Retry-After` longer than it wins.
pub const ENV_BACKOFF: &str = "RUNR_PREWARM_BACKOFF";
/// Default of [`ENV_BACKOFF`].
pub const DEFAULT_BACKOFF: Duration = Duration::from_secs(5);
/// How long the closing Range pass of an attempt waits for the cache to finish storing blobs it
/// has just served (a cache may answer 200 before its copy is committed).
pub const ENV_CONFIRM_WAIT: &str = "RUNR_PREWARM_CONFIRM_WAIT";
/// Default of [`ENV_CONFIRM_WAIT`].
pub const DEFAULT_CONFIRM_WAIT: Duration = Duration::from_secs(60);
/// Log level on stderr: `error`, `warn`, `info` or `debug`.
pub const ENV_LOG: &str = "RUNR_PREWARM_LOG";
/// Default of [`ENV_LOG`].
pub const DEFAULT_LOG: tracing::Level = tracing::Level::INFO;

/// Everything the run needs, parsed and checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// The cache, `host[:port]`.
    pub registry: String,
    /// TLS, credentials and CA of the cache (the shared `RUNR_REGISTRY_*` variables).
    pub access: RegistryConfig,
    /// The images, in the order given, without duplicates.
    pub images: Vec<ImageRef>,
    /// Which platforms of an index to warm.
    pub platforms: Platforms,
    /// Tries per image.
    pub attempts: u32,
    /// Longest wait for the registry to answer.
    pub wait: Duration,
    /// Blob requests at once.
    pub concurrency: usize,
    /// Time per image.
    pub timeout: Duration,
    /// First backoff bound.
    pub backoff: Duration,
    /// Longest wait of one confirmation pass.
    pub confirm_wait: Duration,
    /// Log level.
    pub log: tracing::Level,
}

impl Config {
    /// Reads every variable through `get`; returns all bad variables, not only the first.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, Vec<ConfigError>> {
        let mut errors = Vec::new();
        let access = RegistryConfig::from_lookup(&get, &mut errors);
        let registry = match get(ENV_REGISTRY) {
            Some(v) => match parse_registry(&v) {
                Ok(host) => host,
                Err(reason) => {
                    errors.push(ConfigError::new(ENV_REGISTRY, v, reason));
                    String::new()
                }
            },
            None => {
                errors.push(ConfigError::new(
                    ENV_REGISTRY,
                    "",
                    "is required: the cache registry as host[:port]",
                ));
                String::new()
            }
        };
        let images = match get(ENV_IMAGES) {
            Some(v) => match parse_images(&v) {
                Ok(images) => images,
                Err(reason) => {
                    errors.push(ConfigError::new(ENV_IMAGES, v, reason));
                    Vec::new()
                }
            },
            None => {
                errors.push(ConfigError::new(
                    ENV_IMAGES,
                    "",
                    "is required: repository:tag or repository@sha256:… entries",
                ));
                Vec::new()
            }
        };
        let platforms = parsed(&get, &mut errors, ENV_PLATFORMS, Platforms::All, |v| {
            Platforms::parse(v)
        });
        let attempts = parsed(&get, &mut errors, ENV_ATTEMPTS, DEFAULT_ATTEMPTS, |v| {
            parse_count(v, 100)
        });
        let concurrency = parsed(
            &get,
            &mut errors,
            ENV_CONCURRENCY,
            DEFAULT_CONCURRENCY,
            |v| parse_count(v, 64).map(|n| n as usize),
        );
        let wait = parsed(&get, &mut errors, ENV_WAIT, DEFAULT_WAIT, parse_duration);
        let timeout = parsed(&get, &mut errors, ENV_TIMEOUT, DEFAULT_TIMEOUT, |v| {
            parse_duration(v).and_then(nonzero)
        });
        let backoff = parsed(
            &get,
            &mut errors,
            ENV_BACKOFF,
            DEFAULT_BACKOFF,
            parse_duration,
        );
        let confirm_wait = parsed(
            &get,
            &mut errors,
            ENV_CONFIRM_WAIT,
            DEFAULT_CONFIRM_WAIT,
            parse_duration,
        );
        let log = parsed(&get, &mut errors, ENV_LOG, DEFAULT_LOG, |v| {
            match v.trim().to_ascii_lowercase().as_str() {
                "error" => Ok(tracing::Level::ERROR),
                "warn" => Ok(tracing::Level::WARN),
                "info" => Ok(tracing::Level::INFO),
                "debug" => Ok(tracing::Level::DEBUG),
                _ => Err("expected error, warn, info or debug".to_string()),
            }
        });
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Config {
            registry,
            access,
            images,
            platforms,
            attempts,
            wait,
            concurrency,
            timeout,
            backoff,
            confirm_wait,
            log,
        })
    }
}

/// Reads optional variable `name` with `parse`, falling back to `default` when it is unset or
/// empty, and recording a refusal in `errors`.
fn parsed<T>(
    get: &impl Fn(&str) -> Option<String>,
    errors: &mut Vec<ConfigError>,
    name: &'static str,
    default: T,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> T {
    match get(name).filter(|v| !v.trim().is_empty()) {
        Some(v) => parse(&v).unwrap_or_else(|reason| {
            errors.push(ConfigError::new(name, v, reason));
            default
        }),
        None => default,
    }
}

/// `host[:port]`, nothing else: the scheme comes from `RUNR_REGISTRY_PLAIN_HTTP`.
fn parse_registry(v: &str) -> Result<String, String> {
    let v = v.trim();
    if v.contains("://") {
        return Err(
            "expected host[:port] without a scheme (RUNR_REGISTRY_PLAIN_HTTP=1 selects http)"
                .into(),
        );
    }
    if v.is_empty() || v.contains(['/', '@', '?', '#']) || v.contains(char::is_whitespace) {
        return Err("expected host[:port], e.g. registry.runr-registry.svc:5000".into());
    }
    let url = reqwest::Url::parse(&format!("http://{v}/"))
        .map_err(|e| format!("expected host[:port]: {e}"))?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err("expected host[:port]".into());
    }
    Ok(v.to_string())
}

/// A whole number in `1..=max`.
fn parse_count(v: &str, max: u32) -> Result<u32, String> {
    match v.trim().parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("expected a whole number from 1 to {max}")),
    }
}

fn nonzero(d: Duration) -> Result<Duration, String> {
    if d.is_zero() {
        Err("must be more than zero".into())
    } else {
        Ok(d)
    }
}

/// A duration with a unit (`250ms`, `30s`, `5m`, `1h`); a bare number counts as seconds, the
/// unit the issue gives for the wait and the timeout.
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: u32 = num
        .parse()
        .map_err(|_| "expected a duration like 500ms, 30s, 5m or 1h (bare numbers are seconds)")?;
    let per_unit = match unit {
        "ms" => Duration::from_millis(1),
        "" | "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        _ => return Err(format!("unknown unit {unit:?} (use ms, s, m or h)")),
    };
    per_unit
        .checked_mul(n)
        .ok_or_else(|| "duration too large".to_string())
}

/// Splits the image list on commas, spaces and newlines. An entry that is empty (`a,,b`, a
/// leading or trailing comma) or not a reference fails the whole list, naming the entry.
fn parse_images(v: &str) -> Result<Vec<ImageRef>, String> {
    let mut images: Vec<ImageRef> = Vec::new();
    let pieces: Vec<&str> = v.split(',').collect();
    for (i, piece) in pieces.iter().enumerate() {
        let words: Vec<&str> = piece.split_whitespace().collect();
        if words.is_empty() {
            if pieces.len() == 1 {
                return Err("is empty: name at least one image".into());
            }
            return Err(format!("entry {} is empty (stray comma)", i + 1));
        }
        for word in words {
            let image = ImageRef::parse(word).map_err(|reason| format!("{word:?}: {reason}"))?;
            if !images.contains(&image) {
                images.push(image);
            }
        }
    }
    Ok(images)
}

// === impl Platforms ===

/// Which entries of a multi-platform index to warm. Attestation entries (`unknown/unknown`) are
/// never warmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Platforms {
    /// Every platform of the index.
    All,
    /// Only these.
    Only(Vec<Platform>),
}

/// `os/architecture[/variant]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// e.g. `linux`.
    pub os: String,
    /// e.g. `arm64`.
    pub architecture: String,
    /// e.g. `v8`; `None` matches any variant.
    pub variant: Option<String>,
}

impl Platforms {
    /// Parses `all` or a list of `os/arch[/variant]` separated by commas or spaces.
    pub fn parse(v: &str) -> Result<Platforms, String> {
        if v.trim().eq_ignore_ascii_case("all") {
            return Ok(Platforms::All);
        }
        let mut list = Vec::new();
        for word in v.split([',', ' ', '\n', '\t']).filter(|w| !w.is_empty()) {
            let parts: Vec<&str> = word.split('/').collect();
            let ok = (2..=3).contains(&parts.len()) && parts.iter().all(|p| !p.is_empty());
            if !ok {
                return Err(format!(
                    "{word:?}: expected os/architecture[/variant] (e.g. linux/arm64) or all"
                ));
            }
            list.push(Platform {
                os: parts[0].to_string(),
                architecture: parts[1].to_string(),
                variant: parts.get(2).map(|s| s.to_string()),
            });
        }
        if list.is_empty() {
            return Err("expected os/architecture entries or all".into());
        }
        Ok(Platforms::Only(list))
    }

    /// True when an index entry for `os`/`architecture`/`variant` is to be warmed.
    pub fn wants(&self, os: &str, architecture: &str, variant: Option<&str>) -> bool {
        if os == "unknown" && architecture == "unknown" {
            return false;
        }
        match self {
            Platforms::All => true,
            Platforms::Only(list) => list.iter().any(|p| {
                p.os == os
                    && p.architecture == architecture
                    && (p.variant.is_none() || p.variant.as_deref() == variant)
            }),
        }
    }
}

impl fmt::Display for Platforms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Platforms::All => f.write_str("all"),
            Platforms::Only(list) => {
                for (i, p) in list.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{}/{}", p.os, p.architecture)?;
                    if let Some(v) = &p.variant {
                        write!(f, "/{v}")?;
                    }
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const DIGEST: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn config(vars: &[(&str, &str)]) -> Result<Config, Vec<ConfigError>> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|name| map.get(name).cloned())
    }

    fn names(errors: &[ConfigError]) -> Vec<&'static str> {
        errors.iter().map(|e| e.name).collect()
    }

    #[test]
    fn defaults() {
        let c = config(&[
            (ENV_REGISTRY, "registry.runr-registry.svc:5000"),
            (ENV_IMAGES, "python:3.12"),
        ])
        .unwrap();
        assert_eq!(c.registry, "registry.runr-registry.svc:5000");
        assert_eq!(c.platforms, Platforms::All);
        assert_eq!(c.attempts, 3);
        assert_eq!(c.wait, Duration::from_secs(300));
        assert_eq!(c.concurrency, 4);
        assert_eq!(c.timeout, Duration::from_secs(1800));
        assert!(!c.access.plain_http);
    }

    #[test]
    fn images_split_on_commas_spaces_and_newlines() {
        let c = config(&[
            (ENV_REGISTRY, "127.0.0.1:5000"),
            (
                ENV_IMAGES,
                &format!("python:3.12, node:22\nlibrary/go@{DIGEST} python:3.12\n"),
            ),
        ])
        .unwrap();
        let texts: Vec<_> = c.images.iter().map(|i| i.text.as_str()).collect();
        assert_eq!(
            texts,
            ["python:3.12", "node:22", &format!("library/go@{DIGEST}")]
        );
        assert_eq!(c.images[2].repository, "library/go");
        assert_eq!(c.images[2].manifest_reference(), DIGEST);
        assert_eq!(c.images[1].manifest_reference(), "22");
    }

    #[test]
    fn malformed_and_empty_entries_are_named() {
        for (value, needle) in [
            ("python:3.12,,node:22", "entry 2 is empty"),
            ("python:3.12,", "entry 2 is empty"),
            ("  ", "is empty"),
            ("python", "\"python\": expected repository:tag"),
            ("Python:3", "\"Python:3\": not an image reference"),
            ("python@sha256:abc", "not an image reference"),
        ] {
            let errors = config(&[(ENV_REGISTRY, "r:5000"), (ENV_IMAGES, value)]).unwrap_err();
            assert_eq!(names(&errors), [ENV_IMAGES], "{value}");
            assert!(
                errors[0].to_string().contains(needle),
                "{value}: {}",
                errors[0]
            );
        }
    }

    #[test]
    fn every_bad_variable_is_reported() {
        let errors = config(&[
            (ENV_REGISTRY, "http://r:5000"),
            (ENV_IMAGES, "ok:1"),
            (ENV_PLATFORMS, "linux"),
            (ENV_ATTEMPTS, "0"),
            (ENV_WAIT, "5 minutes"),
            (ENV_CONCURRENCY, "many"),
            (ENV_TIMEOUT, "0"),
            (ENV_LOG, "loud"),
            ("RUNR_REGISTRY_PLAIN_HTTP", "yes"),
        ])
        .unwrap_err();
        assert_eq!(
            names(&errors),
            [
                "RUNR_REGISTRY_PLAIN_HTTP",
                ENV_REGISTRY,
                ENV_PLATFORMS,
                ENV_ATTEMPTS,
                ENV_CONCURRENCY,
                ENV_WAIT,
                ENV_TIMEOUT,
                ENV_LOG
            ]
        );
        assert_eq!(
            errors[3].to_string(),
            "RUNR_PREWARM_ATTEMPTS=\"0\": expected a whole number from 1 to 100"
        );
    }

    #[test]
    fn missing_required_variables() {
        let errors = config(&[]).unwrap_err();
        assert_eq!(names(&errors), [ENV_REGISTRY, ENV_IMAGES]);
    }

    #[test]
    fn registry_is_host_and_port_only() {
        for ok in [
            "r",
            "r:5000",
            "10.0.0.1:5000",
            "[::1]:5000",
            "zot.runr-registry.svc",
        ] {
            assert!(parse_registry(ok).is_ok(), "{ok}");
        }
        for bad in ["", "r/x", "https://r", "r:port", "u@r"] {
            assert!(parse_registry(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_per_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "s", "1.5s", "-1", "5d", "99999999999"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        // The image list comes from a ConfigMap someone edits by hand: any text must give
        // either images or a refusal, never a panic, and accepted entries round-trip.
        #[test]
        fn image_lists_never_panic(text in "[a-zA-Z0-9:@/._, \n-]{0,80}") {
            if let Ok(images) = parse_images(&text) {
                for image in images {
                    proptest::prop_assert!(ImageRef::parse(&image.text).is_ok());
                    proptest::prop_assert!(!image.repository.is_empty());
                }
            }
        }

        #[test]
        fn durations_never_panic(text in "\\PC{0,12}") {
            let _ = parse_duration(&text);
        }

        #[test]
        fn platform_lists_never_panic(text in "[a-z0-9/, ]{0,40}") {
            let _ = Platforms::parse(&text);
        }
    }

    #[test]
    fn platform_filter() {
        let p = Platforms::parse("linux/amd64, linux/arm/v7").unwrap();
        assert!(p.wants("linux", "amd64", None));
        assert!(p.wants("linux", "amd64", Some("v3")));
        assert!(p.wants("linux", "arm", Some("v7")));
        assert!(!p.wants("linux", "arm", Some("v6")));
        assert!(!p.wants("linux", "arm64", Some("v8")));
        assert_eq!(p.to_string(), "linux/amd64,linux/arm/v7");
        assert!(Platforms::All.wants("linux", "s390x", None));
        assert!(!Platforms::All.wants("unknown", "unknown", None));
        assert!(Platforms::parse("linux/").is_err());
        assert!(Platforms::parse(",").is_err());
    }
}
