//! Everything `runr-prewarm` reads from the environment, parsed in one place.
//!
//! [`Config::from_lookup`] reads through a closure (the real environment in `main`, a map in
//! tests) with [`runr_base::env::Env`], the grammar every binary shares (durations, counts,
//! flags; an empty value is unset), and collects every bad variable before failing, so one
//! failed Job start shows every mistake. [`VARS`] is the table `help`/`version` print.

use std::fmt;
use std::time::Duration;

use runr_base::env::{ConfigErrors, Env, VarDoc};
pub use runr_registry::reference::ImageRef;
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

/// prewarm's own variables, for `help`/`version` (the shared `RUNR_REGISTRY_*` ones are
/// [`runr_registry::config::VARS`]). A test checks the defaults shown here are the parser's.
pub const VARS: &[VarDoc] = &[
    VarDoc::required(ENV_REGISTRY, "the cache, host[:port]"),
    VarDoc::required(
        ENV_IMAGES,
        "repository:tag or repository@sha256:…, separated by commas, spaces or newlines",
    ),
    VarDoc::new(
        ENV_PLATFORMS,
        "all",
        "platforms of an index to warm, os/arch[/variant],… or all",
    ),
    VarDoc::new(ENV_ATTEMPTS, "3", "tries per image, 1 to 100"),
    VarDoc::new(ENV_WAIT, "300s", "wait for the registry to answer GET /v2/"),
    VarDoc::new(
        ENV_CONCURRENCY,
        "4",
        "blobs fetched at once across images, 1 to 64",
    ),
    VarDoc::new(
        ENV_TIMEOUT,
        "1800s",
        "time per image, all attempts included",
    ),
    VarDoc::new(ENV_BACKOFF, "5s", "first pause between attempts, doubling"),
    VarDoc::new(
        ENV_CONFIRM_WAIT,
        "60s",
        "wait for the cache to store what it served",
    ),
    VarDoc::new(ENV_LOG, "info", "error, warn, info or debug"),
];

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
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
        let mut env = Env::new(&get);
        let access = RegistryConfig::read(&mut env);
        let registry = required(
            &mut env,
            ENV_REGISTRY,
            "required: the cache registry as host[:port]",
            parse_registry,
        );
        let images = required(
            &mut env,
            ENV_IMAGES,
            "required: repository:tag or repository@sha256:… entries",
            parse_images,
        );
        let platforms = env.parse(ENV_PLATFORMS, Platforms::All, Platforms::parse);
        let attempts = env.count(ENV_ATTEMPTS, DEFAULT_ATTEMPTS, 1..=100);
        let concurrency = env.count(ENV_CONCURRENCY, DEFAULT_CONCURRENCY, 1..=64);
        let wait = env.duration(ENV_WAIT, DEFAULT_WAIT);
        let timeout = env.duration_in(
            ENV_TIMEOUT,
            DEFAULT_TIMEOUT,
            Duration::from_nanos(1)..=Duration::MAX,
        );
        let backoff = env.duration(ENV_BACKOFF, DEFAULT_BACKOFF);
        let confirm_wait = env.duration(ENV_CONFIRM_WAIT, DEFAULT_CONFIRM_WAIT);
        let log = env.level(ENV_LOG, DEFAULT_LOG);
        let config = registry.zip(images).map(|(registry, images)| Config {
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
        });
        env.finish_with(config)
    }
}

/// A required variable whose refusal when unset says what to write.
fn required<T>(
    env: &mut Env<'_>,
    name: &'static str,
    when_unset: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Option<T> {
    if env.value(name).is_none() {
        env.reject(name, None, when_unset);
        return None;
    }
    env.optional(name, parse)
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
    use runr_base::env::{names_read, unlisted, DefaultValue};

    const DIGEST: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn config(vars: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
        Config::from_lookup(runr_base::env::pairs_lookup(vars))
    }

    fn names(errors: &ConfigErrors) -> Vec<&'static str> {
        errors.names()
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
            // Blank is unset for every variable of every binary, so this one is missing.
            (
                "  ",
                "RUNR_PREWARM_IMAGES=<unset>: required: repository:tag",
            ),
            ("python", "\"python\": expected repository:tag"),
            ("Python:3", "\"Python:3\": not an image reference"),
            ("python@sha256:abc", "not an image reference"),
        ] {
            let errors = config(&[(ENV_REGISTRY, "r:5000"), (ENV_IMAGES, value)]).unwrap_err();
            assert_eq!(names(&errors), [ENV_IMAGES], "{value}");
            assert!(
                errors.0[0].to_string().contains(needle),
                "{value}: {}",
                errors.0[0]
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
            ("RUNR_REGISTRY_PLAIN_HTTP", "maybe"),
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
            errors.0[3].to_string(),
            "RUNR_PREWARM_ATTEMPTS=\"0\": expected a whole number from 1 to 100"
        );
    }

    #[test]
    fn missing_required_variables() {
        let errors = config(&[]).unwrap_err();
        assert_eq!(names(&errors), [ENV_REGISTRY, ENV_IMAGES]);
        assert_eq!(
            errors.0[0].to_string(),
            "RUNR_PREWARM_REGISTRY=<unset>: required: the cache registry as host[:port]"
        );
        let errors = config(&[(ENV_REGISTRY, ""), (ENV_IMAGES, "\n")]).unwrap_err();
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

    /// Every form the durations took before the grammar was shared still reads the same, and
    /// the shared grammar's additions (decimals, exponents, any number of seconds) are accepted.
    #[test]
    fn durations_through_the_shared_grammar() {
        let registry = [(ENV_REGISTRY, "r:5000"), (ENV_IMAGES, "a:1")];
        for (text, want) in [
            ("250ms", Duration::from_millis(250)),
            ("30", Duration::from_secs(30)),
            ("30s", Duration::from_secs(30)),
            ("5m", Duration::from_secs(300)),
            ("1h", Duration::from_secs(3600)),
            ("0", Duration::ZERO),
            ("1.5s", Duration::from_millis(1500)),
            ("2.5", Duration::from_millis(2500)),
            ("99999999999", Duration::from_secs(99_999_999_999)),
            ("+30", Duration::from_secs(30)),
            ("1e3", Duration::from_secs(1000)),
        ] {
            let mut vars = registry.to_vec();
            vars.push((ENV_WAIT, text));
            assert_eq!(config(&vars).unwrap().wait, want, "{text}");
        }
        for bad in ["s", "-1", "5d", "5 minutes", "1e"] {
            let mut vars = registry.to_vec();
            vars.push((ENV_WAIT, bad));
            assert_eq!(names(&config(&vars).unwrap_err()), [ENV_WAIT], "{bad}");
        }
        // Empty is unset: the default.
        let mut vars = registry.to_vec();
        vars.push((ENV_WAIT, ""));
        assert_eq!(config(&vars).unwrap().wait, DEFAULT_WAIT);
    }

    /// The defaults `help` shows are the ones the parser uses: setting every variable to the
    /// value its row shows gives the same configuration as setting none.
    #[test]
    fn the_table_shows_the_parsers_defaults() {
        let required = [(ENV_REGISTRY, "r:5000"), (ENV_IMAGES, "a:1")];
        let mut shown = required.to_vec();
        for row in VARS.iter().chain(runr_registry::config::VARS) {
            if let DefaultValue::Is(v) = row.default {
                shown.push((row.name, v));
            }
        }
        assert!(shown.len() >= 10, "{shown:?}");
        let by_table = format!("{:?}", config(&shown).unwrap());
        assert_eq!(by_table, format!("{:?}", config(&required).unwrap()));
    }

    /// Every variable the parser asks for is in one of the two tables `help` prints.
    #[test]
    fn every_variable_read_is_in_the_tables() {
        let read = names_read(&[], |get| {
            let _ = Config::from_lookup(get);
        });
        assert!(read.iter().any(|n| n == ENV_CONFIRM_WAIT), "{read:?}");
        assert!(
            read.iter().any(|n| n == "RUNR_REGISTRY_CA_FILE"),
            "{read:?}"
        );
        let tables = [VARS, runr_registry::config::VARS];
        assert_eq!(unlisted(&tables, &read), Vec::<String>::new());
        // And nothing in the tables goes unread.
        for row in tables.iter().flat_map(|t| t.iter()) {
            assert!(
                read.iter().any(|n| n == row.name),
                "{} is never read",
                row.name
            );
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
