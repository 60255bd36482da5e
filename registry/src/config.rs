//! The registry variables shared by the receiver and prewarm, read through
//! [`runr_base::env::Env`] (one grammar and one [`runr_base::env::ConfigError`] for every
//! binary), and their rows of the binaries' variables table ([`VARS`]).

use std::path::PathBuf;

use runr_base::env::{Env, VarDoc};

/// A flag (`1/0`, `true/false`, `yes/no`, `on/off`): on for a registry served over plain HTTP
/// (a region registry inside the cluster).
pub const ENV_PLAIN_HTTP: &str = "RUNR_REGISTRY_PLAIN_HTTP";
/// User name for basic auth, also sent to the token service the registry names.
pub const ENV_USERNAME: &str = "RUNR_REGISTRY_USERNAME";
/// Password (or token) that goes with [`ENV_USERNAME`].
pub const ENV_PASSWORD: &str = "RUNR_REGISTRY_PASSWORD";
/// Optional PEM file with extra CA certificates, for a registry behind a private CA. The built-in
/// (Mozilla) roots stay trusted too.
pub const ENV_CA_FILE: &str = "RUNR_REGISTRY_CA_FILE";

/// The shared registry variables, for the `help`/`version` table of each binary that reads
/// them ([`runr_base::env::help`]).
pub const VARS: &[VarDoc] = &[
    VarDoc::new(ENV_PLAIN_HTTP, "0", "1 for a registry without TLS"),
    VarDoc::optional(ENV_USERNAME, "user for basic auth and the token flow"),
    VarDoc::optional(ENV_PASSWORD, "its password or token"),
    VarDoc::optional(
        ENV_CA_FILE,
        "extra CA certificates, PEM (the built-in roots stay trusted)",
    ),
];

/// How to reach and authenticate to a registry.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RegistryConfig {
    /// Speak plain HTTP instead of HTTPS.
    pub plain_http: bool,
    /// Basic credentials, when the registry needs them.
    pub credentials: Option<(String, String)>,
    /// Extra CA certificates (PEM).
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for RegistryConfig {
    // The password never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("plain_http", &self.plain_http)
            .field("username", &self.credentials.as_ref().map(|(u, _)| u))
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

impl RegistryConfig {
    /// Reads the registry variables through `env`, which collects every problem (so one start
    /// shows every mistake); returns what could be parsed.
    pub fn read(env: &mut Env<'_>) -> RegistryConfig {
        let plain_http = env.flag(ENV_PLAIN_HTTP, false);
        // Not trimmed: a password may begin or end with a blank.
        let username = env.verbatim(ENV_USERNAME);
        let password = env.verbatim(ENV_PASSWORD);
        let credentials = match (username, password) {
            (Some(u), Some(p)) => Some((u, p)),
            (None, None) => None,
            (Some(u), None) => {
                env.reject(
                    ENV_PASSWORD,
                    None,
                    format!("required when {ENV_USERNAME} is set ({u:?})"),
                );
                None
            }
            (None, Some(_)) => {
                env.reject(
                    ENV_USERNAME,
                    None,
                    format!("required when {ENV_PASSWORD} is set"),
                );
                None
            }
        };
        let ca_file = env.optional(ENV_CA_FILE, |v| {
            let path = PathBuf::from(v);
            if path.is_file() {
                Ok(path)
            } else {
                Err("not a readable file".to_string())
            }
        });
        RegistryConfig {
            plain_http,
            credentials,
            ca_file,
        }
    }

    /// The credentials as the client takes them.
    pub fn auth(&self) -> oci_client::secrets::RegistryAuth {
        match &self.credentials {
            Some((u, p)) => oci_client::secrets::RegistryAuth::Basic(u.clone(), p.clone()),
            None => oci_client::secrets::RegistryAuth::Anonymous,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runr_base::env::{names_read, unlisted, ConfigErrors};
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> (RegistryConfig, Result<(), ConfigErrors>) {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |n: &str| map.get(n).cloned();
        let mut env = Env::new(&get);
        let cfg = RegistryConfig::read(&mut env);
        (cfg, env.finish())
    }

    #[test]
    fn defaults_to_https_anonymous() {
        let (cfg, errors) = parse(&[]);
        assert_eq!(errors, Ok(()));
        assert_eq!(cfg, RegistryConfig::default());
        assert!(matches!(
            cfg.auth(),
            oci_client::secrets::RegistryAuth::Anonymous
        ));
        // Empty means unset, for every variable.
        let (cfg, errors) = parse(&[
            (ENV_PLAIN_HTTP, ""),
            (ENV_USERNAME, " "),
            (ENV_PASSWORD, ""),
            (ENV_CA_FILE, ""),
        ]);
        assert_eq!(errors, Ok(()));
        assert_eq!(cfg, RegistryConfig::default());
    }

    #[test]
    fn plain_http_and_credentials() {
        let (cfg, errors) = parse(&[
            (ENV_PLAIN_HTTP, "1"),
            (ENV_USERNAME, "u"),
            (ENV_PASSWORD, " s3cret "),
        ]);
        assert_eq!(errors, Ok(()));
        assert!(cfg.plain_http);
        assert_eq!(cfg.credentials, Some(("u".into(), " s3cret ".into())));
        assert!(!format!("{cfg:?}").contains("s3cret"));
        // The flag grammar of every binary.
        for (v, on) in [
            ("true", true),
            ("yes", true),
            ("ON", true),
            ("0", false),
            ("off", false),
        ] {
            let (cfg, errors) = parse(&[(ENV_PLAIN_HTTP, v)]);
            assert_eq!((cfg.plain_http, errors), (on, Ok(())), "{v}");
        }
    }

    #[test]
    fn every_bad_variable_is_named() {
        let (_, errors) = parse(&[
            (ENV_PLAIN_HTTP, "maybe"),
            (ENV_USERNAME, "u"),
            (ENV_CA_FILE, "/nonexistent/ca.pem"),
        ]);
        let errors = errors.unwrap_err();
        assert_eq!(errors.names(), [ENV_PLAIN_HTTP, ENV_PASSWORD, ENV_CA_FILE]);
        assert_eq!(
            errors.0[0].to_string(),
            "RUNR_REGISTRY_PLAIN_HTTP=\"maybe\": expected 1 or 0 (also true/false, yes/no, on/off)"
        );
        assert_eq!(
            errors.0[1].to_string(),
            "RUNR_REGISTRY_PASSWORD=<unset>: required when RUNR_REGISTRY_USERNAME is set (\"u\")"
        );
        assert_eq!(
            errors.0[2].to_string(),
            "RUNR_REGISTRY_CA_FILE=\"/nonexistent/ca.pem\": not a readable file"
        );
        let (_, errors) = parse(&[(ENV_PASSWORD, "p")]);
        assert_eq!(errors.unwrap_err().names(), [ENV_USERNAME]);
    }

    #[test]
    fn every_variable_read_is_in_the_table() {
        let read = names_read(&[], |get| {
            RegistryConfig::read(&mut Env::new(get));
        });
        assert_eq!(read.len(), VARS.len(), "{read:?}");
        assert_eq!(unlisted(&[VARS], &read), Vec::<String>::new());
    }
}
