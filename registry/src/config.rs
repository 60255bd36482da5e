//! The registry variables shared by the receiver and prewarm.

use std::path::PathBuf;

/// `1` (or `true`) for a registry served over plain HTTP (a region registry inside the cluster).
pub const ENV_PLAIN_HTTP: &str = "RUNR_REGISTRY_PLAIN_HTTP";
/// User name for basic auth, also sent to the token service the registry names.
pub const ENV_USERNAME: &str = "RUNR_REGISTRY_USERNAME";
/// Password (or token) that goes with [`ENV_USERNAME`].
pub const ENV_PASSWORD: &str = "RUNR_REGISTRY_PASSWORD";
/// Optional PEM file with extra CA certificates, for a registry behind a private CA. The built-in
/// (Mozilla) roots stay trusted too.
pub const ENV_CA_FILE: &str = "RUNR_REGISTRY_CA_FILE";

/// One bad variable: its name, the value it had and why it was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?}: {reason}")]
pub struct ConfigError {
    /// The variable's name.
    pub name: &'static str,
    /// The value it had (empty when it was missing).
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ConfigError {
    /// A refusal of `name`'s `value`.
    pub fn new(name: &'static str, value: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            name,
            value: value.into(),
            reason: reason.into(),
        }
    }
}

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
    /// Reads the registry variables through `get`, pushing every problem onto `errors` (so one
    /// start shows every mistake) and returning what could be parsed.
    pub fn from_lookup(
        get: &impl Fn(&str) -> Option<String>,
        errors: &mut Vec<ConfigError>,
    ) -> RegistryConfig {
        let plain_http = match get(ENV_PLAIN_HTTP).as_deref().map(str::trim) {
            None | Some("") | Some("0") | Some("false") => false,
            Some("1") | Some("true") => true,
            Some(other) => {
                errors.push(ConfigError::new(
                    ENV_PLAIN_HTTP,
                    other,
                    "expected 1 or 0 (true or false)",
                ));
                false
            }
        };
        let username = get(ENV_USERNAME).filter(|s| !s.is_empty());
        let password = get(ENV_PASSWORD).filter(|s| !s.is_empty());
        let credentials = match (username, password) {
            (Some(u), Some(p)) => Some((u, p)),
            (None, None) => None,
            (Some(u), None) => {
                errors.push(ConfigError::new(
                    ENV_PASSWORD,
                    "",
                    format!("is required when {ENV_USERNAME} is set ({u:?})"),
                ));
                None
            }
            (None, Some(_)) => {
                errors.push(ConfigError::new(
                    ENV_USERNAME,
                    "",
                    format!("is required when {ENV_PASSWORD} is set"),
                ));
                None
            }
        };
        let ca_file = get(ENV_CA_FILE)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
        if let Some(path) = &ca_file {
            if !path.is_file() {
                errors.push(ConfigError::new(
                    ENV_CA_FILE,
                    path.display().to_string(),
                    "is not a readable file",
                ));
            }
        }
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
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> (RegistryConfig, Vec<ConfigError>) {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut errors = Vec::new();
        let cfg = RegistryConfig::from_lookup(&|n| map.get(n).cloned(), &mut errors);
        (cfg, errors)
    }

    #[test]
    fn defaults_to_https_anonymous() {
        let (cfg, errors) = parse(&[]);
        assert!(errors.is_empty());
        assert_eq!(cfg, RegistryConfig::default());
        assert!(matches!(
            cfg.auth(),
            oci_client::secrets::RegistryAuth::Anonymous
        ));
    }

    #[test]
    fn plain_http_and_credentials() {
        let (cfg, errors) = parse(&[
            (ENV_PLAIN_HTTP, "1"),
            (ENV_USERNAME, "u"),
            (ENV_PASSWORD, "s3cret"),
        ]);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(cfg.plain_http);
        assert_eq!(cfg.credentials, Some(("u".into(), "s3cret".into())));
        assert!(!format!("{cfg:?}").contains("s3cret"));
    }

    #[test]
    fn every_bad_variable_is_named() {
        let (_, errors) = parse(&[
            (ENV_PLAIN_HTTP, "yes"),
            (ENV_USERNAME, "u"),
            (ENV_CA_FILE, "/nonexistent/ca.pem"),
        ]);
        let names: Vec<_> = errors.iter().map(|e| e.name).collect();
        assert_eq!(names, [ENV_PLAIN_HTTP, ENV_PASSWORD, ENV_CA_FILE]);
        assert_eq!(
            errors[0].to_string(),
            "RUNR_REGISTRY_PLAIN_HTTP=\"yes\": expected 1 or 0 (true or false)"
        );
    }
}
