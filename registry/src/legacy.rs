//! The registry configuration's old entry point, kept only until image-receiver reads its
//! variables through [`runr_base::env::Env`] and calls [`RegistryConfig::read`]: it is the
//! code that was here before, unchanged, so the receiver's behaviour and tests do not move
//! while its engineer switches. Delete this file (and its two lines in `lib.rs`) then; nothing
//! else uses it.

use std::path::PathBuf;

use crate::config::{RegistryConfig, ENV_CA_FILE, ENV_PASSWORD, ENV_PLAIN_HTTP, ENV_USERNAME};

/// One bad variable, in the receiver's old error type (the new one is
/// [`runr_base::env::ConfigError`]).
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

impl RegistryConfig {
    /// The old reader (flags `1/0/true/false` only), for image-receiver until it switches to
    /// [`RegistryConfig::read`]: reads the registry variables through `get`, pushing every
    /// problem onto `errors`.
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
}
