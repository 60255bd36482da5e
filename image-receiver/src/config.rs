//! The receiver's configuration: every environment variable, its default, and one error per bad
//! variable (name and value kept in the error) so a single restart shows every mistake. Read
//! through [`runr_base::env::Env`], with its grammar (an empty value is unset, flags, levels);
//! [`VARS`] and the registry's own rows (`runr_registry::config::VARS`) are the table
//! `version`/`help` print.

use std::path::PathBuf;
use std::time::Duration;

use runr_base::env::{ConfigErrors, Env, VarDoc};
use runr_registry::config::VARS as REGISTRY_VARS;
use runr_registry::digest::parse_sha256;
use runr_registry::reference::{check_image_name, parse_push_target};
use runr_registry::RegistryConfig;

use crate::image::pipeline::Compress;

/// Port the receiver listens on (all interfaces). `0` picks a free port (logged at startup).
pub const ENV_PORT: &str = "PORT";
const DEFAULT_PORT: u16 = 8080;

/// The directory the upload is written to (an emptyDir in Kubernetes); the only place the
/// receiver writes. It must exist.
pub const ENV_UPLOAD_DIR: &str = "RUNR_UPLOAD_DIR";
const DEFAULT_UPLOAD_DIR: &str = "/work";

/// The declared size of the file in bytes. Required.
pub const ENV_UPLOAD_SIZE: &str = "RUNR_UPLOAD_SIZE";

/// The declared SHA-256 of the file, 64 hex digits (a `sha256:` prefix is accepted). Required.
pub const ENV_UPLOAD_SHA256: &str = "RUNR_UPLOAD_SHA256";

/// The user's file name, for messages only (formats are detected from content).
pub const ENV_UPLOAD_FILENAME: &str = "RUNR_UPLOAD_FILENAME";

/// The upload's name, `repository[:tag]`: picks one image out of an archive that holds several.
pub const ENV_UPLOAD_NAME: &str = "RUNR_UPLOAD_NAME";

/// Where to push: `host[:port]/path/repository:tag`. Required.
pub const ENV_UPLOAD_TARGET: &str = "RUNR_UPLOAD_TARGET";

/// `gzip` | `none`: how the uncompressed layers of a classic `docker save` archive are pushed.
pub const ENV_UPLOAD_COMPRESS: &str = "RUNR_UPLOAD_COMPRESS";
const DEFAULT_COMPRESS: Compress = Compress::Gzip;

/// How long a chunk's body may make no progress before the chunk is abandoned: the connection
/// is closed (after a `408`), the bytes it reserved are released and nothing of it is recorded.
/// A half-open connection (a proxy leg that died without a FIN) would otherwise pin them.
pub const ENV_UPLOAD_CHUNK_IDLE: &str = "RUNR_UPLOAD_CHUNK_IDLE";
const DEFAULT_CHUNK_IDLE: Duration = Duration::from_secs(30);

/// The receiver's own log level: `error`, `warn`, `info` or `debug`.
pub const ENV_LOG: &str = "RUNR_LOG";
const DEFAULT_LOG: tracing::Level = tracing::Level::INFO;

/// The variables of `serve`, as `version`/`help` print them.
pub const VARS: &[VarDoc] = &[
    VarDoc::new(ENV_PORT, "8080", "port to listen on"),
    VarDoc::new(
        ENV_UPLOAD_DIR,
        DEFAULT_UPLOAD_DIR,
        "where the upload is kept; the only place written",
    ),
    VarDoc::required(ENV_UPLOAD_SIZE, "declared file size in bytes"),
    VarDoc::required(ENV_UPLOAD_SHA256, "declared SHA-256, 64 hex digits"),
    VarDoc::optional(ENV_UPLOAD_FILENAME, "the user's file name, for messages"),
    VarDoc::optional(
        ENV_UPLOAD_NAME,
        "repository[:tag]: picks one image out of an archive holding several",
    ),
    VarDoc::required(
        ENV_UPLOAD_TARGET,
        "host[:port]/path/repository:tag to push to",
    ),
    VarDoc::new(
        ENV_UPLOAD_COMPRESS,
        "gzip",
        "gzip | none: layers of a classic docker save archive",
    ),
    VarDoc::new(
        ENV_UPLOAD_CHUNK_IDLE,
        "30s",
        "a chunk whose body makes no progress this long is dropped, its connection closed",
    ),
    VarDoc::new(ENV_LOG, "info", "error | warn | info | debug"),
];

/// The `Environment variables:` section of `version`/`help`.
pub fn help() -> String {
    runr_base::env::help(&[VARS, REGISTRY_VARS])
}

/// Everything `serve` reads from its environment, parsed once at startup.
#[derive(Debug, Clone)]
pub struct Config {
    /// `PORT`.
    pub port: u16,
    /// `RUNR_UPLOAD_DIR`.
    pub upload_dir: PathBuf,
    /// `RUNR_UPLOAD_SIZE`.
    pub size: u64,
    /// `RUNR_UPLOAD_SHA256`, 64 lowercase hex digits.
    pub sha256: String,
    /// `RUNR_UPLOAD_FILENAME`.
    pub filename: Option<String>,
    /// `RUNR_UPLOAD_NAME`.
    pub name: Option<String>,
    /// `RUNR_UPLOAD_TARGET`.
    pub target: String,
    /// `RUNR_UPLOAD_COMPRESS`.
    pub compress: Compress,
    /// `RUNR_UPLOAD_CHUNK_IDLE`.
    pub chunk_idle: Duration,
    /// `RUNR_REGISTRY_*`.
    pub registry: RegistryConfig,
    /// `RUNR_LOG`.
    pub log_level: tracing::Level,
}

// === impl Config ===

impl Config {
    /// Parses the configuration from `get` (the process environment in production, a map in
    /// tests), collecting every error before failing. Empty values count as unset.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
        let mut env = Env::new(get);
        let port = env.listen_port(ENV_PORT, DEFAULT_PORT);
        let upload_dir = PathBuf::from(
            env.value(ENV_UPLOAD_DIR)
                .unwrap_or_else(|| DEFAULT_UPLOAD_DIR.into()),
        );
        if !upload_dir.is_dir() {
            let shown = upload_dir.display().to_string();
            env.reject(ENV_UPLOAD_DIR, Some(&shown), "is not an existing directory");
        }
        let size = env.required(ENV_UPLOAD_SIZE, |v| match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err("expected the file size in bytes, a whole number above 0".into()),
        });
        let sha256 = env.required(ENV_UPLOAD_SHA256, parse_sha256);
        let filename = env.value(ENV_UPLOAD_FILENAME);
        let name = env.optional(ENV_UPLOAD_NAME, |v| {
            check_image_name(v).map(|()| v.to_string())
        });
        let target = env.required(ENV_UPLOAD_TARGET, parse_push_target);
        let compress = env.parse(ENV_UPLOAD_COMPRESS, DEFAULT_COMPRESS, |v| match v {
            "gzip" => Ok(Compress::Gzip),
            "none" => Ok(Compress::None),
            _ => Err("expected gzip or none".into()),
        });
        let chunk_idle = env.duration_in(
            ENV_UPLOAD_CHUNK_IDLE,
            DEFAULT_CHUNK_IDLE,
            Duration::from_millis(1)..=Duration::from_secs(3600),
        );
        let log_level = env.level(ENV_LOG, DEFAULT_LOG);
        let registry = RegistryConfig::read(&mut env);
        let required = size.zip(sha256).zip(target);
        env.finish_with(required.map(|((size, sha256), target)| Config {
            port,
            upload_dir,
            size,
            sha256,
            filename,
            name,
            target,
            compress,
            chunk_idle,
            registry,
            log_level,
        }))
    }
}

/// The registry variables alone (`fetch`).
pub fn registry_from_lookup(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<RegistryConfig, ConfigErrors> {
    let mut env = Env::new(get);
    let registry = RegistryConfig::read(&mut env);
    env.finish_with(Some(registry))
}

#[cfg(test)]
mod tests {
    use super::*;
    use runr_base::env::{names_read, unlisted};

    const SUM: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
        let dir = std::env::temp_dir().display().to_string();
        let mut all = vec![(ENV_UPLOAD_DIR, dir.as_str())];
        all.extend_from_slice(vars);
        Config::from_lookup(&runr_base::env::pairs_lookup(&all))
    }

    fn valid() -> Vec<(&'static str, &'static str)> {
        vec![
            (ENV_UPLOAD_SIZE, "4"),
            (ENV_UPLOAD_SHA256, SUM),
            (
                ENV_UPLOAD_TARGET,
                "127.0.0.1:5000/runr-uploads/platform/app:1.0",
            ),
        ]
    }

    fn names(errors: &ConfigErrors) -> Vec<&'static str> {
        errors.0.iter().map(|e| e.name).collect()
    }

    #[test]
    fn defaults() {
        let c = parse(&valid()).expect("valid");
        assert_eq!(c.port, 8080);
        assert_eq!(c.size, 4);
        assert_eq!(c.sha256, SUM);
        assert_eq!(c.compress, Compress::Gzip);
        assert_eq!(c.name, None);
        assert!(!c.registry.plain_http);
        assert_eq!(c.log_level, tracing::Level::INFO);
        assert_eq!(c.chunk_idle, Duration::from_secs(30));
    }

    #[test]
    fn every_variable_is_read() {
        let mut vars = valid();
        vars.extend([
            (ENV_PORT, "9000"),
            (ENV_UPLOAD_COMPRESS, "none"),
            (ENV_UPLOAD_NAME, "corpus/app:v1"),
            (ENV_UPLOAD_FILENAME, "app.tar"),
            (ENV_LOG, "debug"),
            (ENV_UPLOAD_CHUNK_IDLE, "1.5s"),
            ("RUNR_REGISTRY_PLAIN_HTTP", "1"),
        ]);
        let c = parse(&vars).expect("valid");
        assert_eq!(c.chunk_idle, Duration::from_millis(1500));
        assert_eq!(c.port, 9000);
        assert_eq!(c.compress, Compress::None);
        assert_eq!(c.name.as_deref(), Some("corpus/app:v1"));
        assert_eq!(c.filename.as_deref(), Some("app.tar"));
        assert!(c.registry.plain_http);
    }

    #[test]
    fn missing_required_variables_are_all_named() {
        let e = parse(&[]).unwrap_err();
        assert_eq!(
            names(&e),
            [ENV_UPLOAD_SIZE, ENV_UPLOAD_SHA256, ENV_UPLOAD_TARGET]
        );
        assert_eq!(e.0[0].to_string(), "RUNR_UPLOAD_SIZE=<unset>: required");
    }

    #[test]
    fn bad_values_are_named_with_their_value() {
        let e = parse(&[
            (ENV_PORT, "http"),
            (ENV_UPLOAD_DIR, "/nonexistent/dir"),
            (ENV_UPLOAD_SIZE, "-1"),
            (ENV_UPLOAD_SHA256, "abc"),
            (ENV_UPLOAD_TARGET, "app:1.0"),
            (ENV_UPLOAD_COMPRESS, "zstd"),
            (ENV_UPLOAD_NAME, "Bad Name"),
            (ENV_UPLOAD_CHUNK_IDLE, "0"),
            (ENV_LOG, "loud"),
            ("RUNR_REGISTRY_PLAIN_HTTP", "maybe"),
        ])
        .unwrap_err();
        assert_eq!(
            names(&e),
            [
                ENV_PORT,
                ENV_UPLOAD_DIR,
                ENV_UPLOAD_SIZE,
                ENV_UPLOAD_SHA256,
                ENV_UPLOAD_NAME,
                ENV_UPLOAD_TARGET,
                ENV_UPLOAD_COMPRESS,
                ENV_UPLOAD_CHUNK_IDLE,
                ENV_LOG,
                "RUNR_REGISTRY_PLAIN_HTTP"
            ]
        );
        assert!(e.to_string().contains("RUNR_UPLOAD_COMPRESS=\"zstd\""));
        assert!(e
            .to_string()
            .contains("RUNR_UPLOAD_CHUNK_IDLE=\"0\": must be at least 1ms"));
    }

    #[test]
    fn size_must_be_positive() {
        for bad in ["0", "1.5", "ten", "18446744073709551616"] {
            let mut vars = valid();
            vars.push((ENV_UPLOAD_SIZE, bad));
            assert_eq!(
                names(&parse(&vars).unwrap_err()),
                [ENV_UPLOAD_SIZE],
                "{bad}"
            );
        }
    }

    #[test]
    fn every_variable_read_is_in_the_table() {
        let dir = std::env::temp_dir().display().to_string();
        let ca = std::env::current_exe().unwrap().display().to_string();
        let mut vars: Vec<(&str, &str)> = valid();
        vars.extend([
            (ENV_UPLOAD_DIR, dir.as_str()),
            (ENV_UPLOAD_NAME, "app:1"),
            ("RUNR_REGISTRY_USERNAME", "u"),
            ("RUNR_REGISTRY_PASSWORD", "p"),
            ("RUNR_REGISTRY_CA_FILE", ca.as_str()),
        ]);
        let read = names_read(&vars, |get| {
            Config::from_lookup(get).expect("valid");
        });
        assert_eq!(
            unlisted(&[VARS, REGISTRY_VARS], &read),
            Vec::<String>::new()
        );
        // And no row is stale: the parser reads every variable the table names.
        for v in VARS.iter().chain(REGISTRY_VARS) {
            assert!(read.iter().any(|n| n == v.name), "{} is never read", v.name);
        }
        let fetch = names_read(&vars, |get| {
            registry_from_lookup(get).expect("valid");
        });
        assert_eq!(unlisted(&[REGISTRY_VARS], &fetch), Vec::<String>::new());
        assert!(!fetch.is_empty());
    }

    #[test]
    fn help_lists_every_variable_with_its_default() {
        let text = help();
        assert!(text.starts_with("Environment variables:\n"), "{text}");
        for v in VARS.iter().chain(REGISTRY_VARS) {
            let line = text
                .lines()
                .find(|l| l.split_whitespace().next() == Some(v.name))
                .unwrap_or_else(|| panic!("{} missing from {text}", v.name));
            if let runr_base::env::DefaultValue::Is(d) = v.default {
                assert!(line.ends_with(&format!("(default: {d})")), "{line}");
            }
        }
        assert!(text.contains("RUNR_UPLOAD_TARGET"), "{text}");
    }

    #[test]
    fn registry_credentials_are_kept_as_written() {
        let mut vars = valid();
        vars.extend([
            ("RUNR_REGISTRY_USERNAME", "runr"),
            ("RUNR_REGISTRY_PASSWORD", " s3cret\t"),
        ]);
        let c = parse(&vars).expect("valid");
        assert_eq!(
            c.registry.credentials,
            Some(("runr".to_string(), " s3cret\t".to_string()))
        );
        // Blank is unset: the other half of the pair is then missing.
        let mut vars = valid();
        vars.extend([
            ("RUNR_REGISTRY_USERNAME", "runr"),
            ("RUNR_REGISTRY_PASSWORD", "  "),
        ]);
        let e = parse(&vars).unwrap_err();
        assert_eq!(names(&e), ["RUNR_REGISTRY_PASSWORD"]);
    }
}
