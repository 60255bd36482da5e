//! The receiver's configuration: every environment variable, its default, and one error per bad
//! variable (name and value kept in the error, [`ConfigError`] shared with `runr-registry`) so a
//! single restart shows every mistake.

use std::path::PathBuf;

use runr_registry::{ConfigError, RegistryConfig};

pub use crate::image::pipeline::Compress;

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

/// The receiver's own log level: `error`, `warn`, `info` or `debug`.
pub const ENV_LOG: &str = "RUNR_LOG";
const DEFAULT_LOG: tracing::Level = tracing::Level::INFO;

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
    /// `RUNR_REGISTRY_*`.
    pub registry: RegistryConfig,
    /// `RUNR_LOG`.
    pub log_level: tracing::Level,
}

/// Every bad variable found in one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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
        let get = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let mut errors = Vec::new();

        let port = optional(&get, ENV_PORT, DEFAULT_PORT, &mut errors, |v| {
            v.parse::<u16>()
                .map_err(|_| "not a port number (0-65535)".into())
        });
        let upload_dir = PathBuf::from(get(ENV_UPLOAD_DIR).unwrap_or(DEFAULT_UPLOAD_DIR.into()));
        if !upload_dir.is_dir() {
            errors.push(ConfigError::new(
                ENV_UPLOAD_DIR,
                upload_dir.display().to_string(),
                "is not an existing directory",
            ));
        }
        let size = required(&get, ENV_UPLOAD_SIZE, &mut errors, |v| {
            match v.parse::<u64>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err("expected the file size in bytes, a whole number above 0".into()),
            }
        });
        let sha256 = required(&get, ENV_UPLOAD_SHA256, &mut errors, parse_sha256);
        let filename = get(ENV_UPLOAD_FILENAME).map(|v| v.trim().to_string());
        let name = get(ENV_UPLOAD_NAME).map(|v| v.trim().to_string());
        if let Some(n) = &name {
            if let Err(reason) = check_name(n) {
                errors.push(ConfigError::new(ENV_UPLOAD_NAME, n.clone(), reason));
            }
        }
        let target = required(&get, ENV_UPLOAD_TARGET, &mut errors, parse_target);
        let compress = optional(
            &get,
            ENV_UPLOAD_COMPRESS,
            DEFAULT_COMPRESS,
            &mut errors,
            |v| match v {
                "gzip" => Ok(Compress::Gzip),
                "none" => Ok(Compress::None),
                _ => Err("expected gzip or none".into()),
            },
        );
        let log_level = optional(&get, ENV_LOG, DEFAULT_LOG, &mut errors, |v| {
            match v.to_ascii_lowercase().as_str() {
                "error" => Ok(tracing::Level::ERROR),
                "warn" => Ok(tracing::Level::WARN),
                "info" => Ok(tracing::Level::INFO),
                "debug" => Ok(tracing::Level::DEBUG),
                _ => Err("expected error, warn, info or debug".into()),
            }
        });
        let registry = RegistryConfig::from_lookup(&get, &mut errors);

        match (size, sha256, target) {
            (Some(size), Some(sha256), Some(target)) if errors.is_empty() => Ok(Config {
                port,
                upload_dir,
                size,
                sha256,
                filename,
                name,
                target,
                compress,
                registry,
                log_level,
            }),
            _ => Err(ConfigErrors(errors)),
        }
    }

    /// The variables, their defaults and meaning, for `runr-image-upload version` / `--help`.
    pub fn help() -> &'static str {
        "Environment variables (serve):\n\
         \x20 PORT                      port to listen on (default: 8080)\n\
         \x20 RUNR_UPLOAD_DIR           where the upload is kept; the only place written (default: /work)\n\
         \x20 RUNR_UPLOAD_SIZE          declared file size in bytes (required)\n\
         \x20 RUNR_UPLOAD_SHA256        declared SHA-256, 64 hex digits (required)\n\
         \x20 RUNR_UPLOAD_FILENAME      the user's file name, for messages\n\
         \x20 RUNR_UPLOAD_NAME          repository[:tag]: picks one image out of an archive holding several\n\
         \x20 RUNR_UPLOAD_TARGET        host[:port]/path/repository:tag to push to (required)\n\
         \x20 RUNR_UPLOAD_COMPRESS      gzip | none: layers of a classic docker save archive (default: gzip)\n\
         \x20 RUNR_REGISTRY_PLAIN_HTTP  1 for a registry without TLS (default: 0)\n\
         \x20 RUNR_REGISTRY_USERNAME    registry user (basic auth and token flow)\n\
         \x20 RUNR_REGISTRY_PASSWORD    registry password or token\n\
         \x20 RUNR_REGISTRY_CA_FILE     extra CA certificates (PEM)\n\
         \x20 RUNR_LOG                  error | warn | info | debug (default: info)\n"
    }
}

/// Parses `name` with `parse` when set, else `default`; a refusal goes onto `errors`.
fn optional<T>(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: T,
    errors: &mut Vec<ConfigError>,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> T {
    match get(name) {
        None => default,
        Some(v) => match parse(v.trim()) {
            Ok(t) => t,
            Err(reason) => {
                errors.push(ConfigError::new(name, v, reason));
                default
            }
        },
    }
}

/// Parses `name` with `parse`; unset or refused goes onto `errors` and gives `None`.
fn required<T>(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    errors: &mut Vec<ConfigError>,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Option<T> {
    match get(name) {
        None => {
            errors.push(ConfigError::new(name, "", "is required"));
            None
        }
        Some(v) => match parse(v.trim()) {
            Ok(t) => Some(t),
            Err(reason) => {
                errors.push(ConfigError::new(name, v, reason));
                None
            }
        },
    }
}

/// 64 hex digits, optionally prefixed `sha256:`; returned lowercase without the prefix.
pub fn parse_sha256(v: &str) -> Result<String, String> {
    let hex = v.strip_prefix("sha256:").unwrap_or(v);
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex.to_ascii_lowercase())
    } else {
        Err("expected a SHA-256 digest: 64 hex digits".into())
    }
}

/// `host[:port]/path/repository:tag`: the registry host must be explicit (a name with a dot or
/// a port, or `localhost`), and so must the tag; a digest is refused because the receiver
/// pushes a tag and reads it back.
pub fn parse_target(v: &str) -> Result<String, String> {
    const SHAPE: &str = "expected host[:port]/path/repository:tag";
    if v.contains('@') {
        return Err(format!("{SHAPE} (a tag, not a digest)"));
    }
    let Some((host, rest)) = v.split_once('/') else {
        return Err(format!("{SHAPE} (no registry host)"));
    };
    if !(host.contains('.') || host.contains(':') || host == "localhost") {
        return Err(format!("{SHAPE} ({host:?} is not a registry host)"));
    }
    let last = rest.rsplit('/').next().unwrap_or(rest);
    if !last.contains(':') {
        return Err(format!("{SHAPE} (no tag)"));
    }
    // The client crate's parser checks the rest of the grammar (characters, lengths).
    v.parse::<runr_registry::oci_client::Reference>()
        .map_err(|e| format!("{SHAPE} ({e})"))?;
    Ok(v.to_string())
}

/// `repository[:tag]` in the grammar of image references (lowercase path components).
fn check_name(v: &str) -> Result<(), String> {
    let probe = format!("localhost/{v}");
    match probe.parse::<runr_registry::oci_client::Reference>() {
        Ok(_) if !v.contains('@') => Ok(()),
        _ => Err("expected repository[:tag], e.g. myapp:1.0".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const SUM: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
        let dir = std::env::temp_dir();
        let mut map: HashMap<String, String> = HashMap::new();
        map.insert(ENV_UPLOAD_DIR.into(), dir.display().to_string());
        for (k, v) in vars {
            map.insert(k.to_string(), v.to_string());
        }
        Config::from_lookup(|n| map.get(n).cloned())
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
            ("RUNR_REGISTRY_PLAIN_HTTP", "1"),
        ]);
        let c = parse(&vars).expect("valid");
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
        assert_eq!(e.0[0].to_string(), "RUNR_UPLOAD_SIZE=\"\": is required");
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
            (ENV_LOG, "loud"),
            ("RUNR_REGISTRY_PLAIN_HTTP", "yes"),
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
                ENV_LOG,
                "RUNR_REGISTRY_PLAIN_HTTP"
            ]
        );
        assert!(e.to_string().contains("RUNR_UPLOAD_COMPRESS=\"zstd\""));
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
    fn sha256_forms() {
        assert_eq!(parse_sha256(SUM).unwrap(), SUM);
        assert_eq!(parse_sha256(&format!("sha256:{SUM}")).unwrap(), SUM);
        assert_eq!(parse_sha256(&SUM.to_uppercase()).unwrap(), SUM);
        assert!(parse_sha256(&SUM[1..]).is_err());
        assert!(parse_sha256(&format!("{}g", &SUM[1..])).is_err());
        assert!(parse_sha256(&format!("md5:{SUM}")).is_err());
    }

    #[test]
    fn target_forms() {
        for ok in [
            "127.0.0.1:5000/runr-uploads/platform/app:1.0",
            "registry.example.com/a/b/c:latest",
            "localhost/app:v1",
            "10.43.0.5:5000/app:1",
        ] {
            assert_eq!(parse_target(ok).as_deref(), Ok(ok), "{ok}");
        }
        for bad in [
            "app:1.0",
            "corpus/app:1.0",
            "registry.example.com/app",
            "127.0.0.1:5000/app@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "127.0.0.1:5000/App:1",
            "127.0.0.1:5000/:1",
        ] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }
}
