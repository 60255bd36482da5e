//! Where the tick goes and how long to wait for it to be accepted, from environment variables.

use std::time::Duration;

/// Port of the local server, on 127.0.0.1 (Knative and the CronJob set it).
pub const ENV_PORT: &str = "PORT";
/// Default of [`ENV_PORT`].
pub const DEFAULT_PORT: u16 = 8080;
/// Full `http://host:port/path` URL to send the tick to instead of 127.0.0.1:$PORT.
pub const ENV_TICK_URL: &str = "RUNR_TICK_URL";
/// How long to wait for the server to accept connections (`500ms`, `30s`, `2m`, or seconds).
pub const ENV_TICK_WAIT: &str = "RUNR_TICK_WAIT";
/// Default of [`ENV_TICK_WAIT`]: the 60 s of the schedule invoke sequence.
pub const DEFAULT_TICK_WAIT: Duration = Duration::from_secs(60);

/// A variable with a value we cannot use; the message names both.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?}: {reason}")]
pub struct ConfigError {
    /// The variable.
    pub name: String,
    /// The value it had.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ConfigError {
    /// An error for variable `name` holding `value`.
    pub fn new(name: &str, value: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            name: name.to_string(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

/// An HTTP endpoint to send the tick to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The `Host` header value.
    pub authority: String,
    /// Path and query of the request line.
    pub path: String,
}

impl Target {
    /// `http://127.0.0.1:<port>/`.
    pub fn local(port: u16) -> Target {
        Target {
            host: "127.0.0.1".to_string(),
            port,
            authority: format!("127.0.0.1:{port}"),
            path: "/".to_string(),
        }
    }

    /// Parses an `http://host[:port][/path]` URL; TLS is not spoken (the tick stays in the pod).
    pub fn parse_url(url: &str) -> Result<Target, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err("only http:// URLs are supported".to_string());
        }
        let authority = uri.authority().ok_or("the URL has no host")?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err("the URL has no host".to_string());
        }
        let path = uri
            .path_and_query()
            .map(|p| p.as_str())
            .filter(|p| !p.is_empty())
            .unwrap_or("/");
        Ok(Target {
            host: host.to_string(),
            port: authority.port_u16().unwrap_or(80),
            authority: authority.as_str().to_string(),
            path: path.to_string(),
        })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.authority, self.path)
    }
}

/// Everything `runr-tick` and `runr-wrapper tick` read from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TickConfig {
    /// Where the event goes.
    pub target: Target,
    /// How long to wait for a listener.
    pub wait: Duration,
}

impl TickConfig {
    /// Reads the configuration through `get` (the real environment, or a map in tests); returns
    /// every bad variable, not only the first.
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<TickConfig, Vec<ConfigError>> {
        let mut errors = Vec::new();
        let port = match get(ENV_PORT) {
            Some(v) => parse_port(&v).unwrap_or_else(|reason| {
                errors.push(ConfigError::new(ENV_PORT, &v, reason));
                DEFAULT_PORT
            }),
            None => DEFAULT_PORT,
        };
        let target = match get(ENV_TICK_URL).filter(|v| !v.is_empty()) {
            Some(v) => Target::parse_url(&v).unwrap_or_else(|reason| {
                errors.push(ConfigError::new(ENV_TICK_URL, &v, reason));
                Target::local(port)
            }),
            None => Target::local(port),
        };
        let wait = match get(ENV_TICK_WAIT) {
            Some(v) => parse_duration(&v).unwrap_or_else(|reason| {
                errors.push(ConfigError::new(ENV_TICK_WAIT, &v, reason));
                DEFAULT_TICK_WAIT
            }),
            None => DEFAULT_TICK_WAIT,
        };
        if errors.is_empty() {
            Ok(TickConfig { target, wait })
        } else {
            Err(errors)
        }
    }
}

/// A TCP port, 1–65535.
pub fn parse_port(v: &str) -> Result<u16, String> {
    match v.trim().parse::<u16>() {
        Ok(0) | Err(_) => Err("expected a port number between 1 and 65535".to_string()),
        Ok(p) => Ok(p),
    }
}

/// A duration with a unit (`250ms`, `30s`, `5m`, `1h`); a bare number counts as seconds, the unit
/// of the spec's timeouts.
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| "expected a duration like 500ms, 30s, 5m or 1h".to_string())?;
    let per_unit = match unit {
        "ms" => Duration::from_millis(1),
        "" | "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        _ => return Err(format!("unknown unit {unit:?} (use ms, s, m or h)")),
    };
    per_unit
        .checked_mul(u32::try_from(n).map_err(|_| "duration too large".to_string())?)
        .ok_or_else(|| "duration too large".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<TickConfig, Vec<ConfigError>> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        TickConfig::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn defaults_to_local_port_8080() {
        let c = config(&[]).unwrap();
        assert_eq!(c.target, Target::local(8080));
        assert_eq!(c.wait, Duration::from_secs(60));
        assert_eq!(c.target.to_string(), "http://127.0.0.1:8080/");
    }

    #[test]
    fn url_wins_over_port() {
        let c = config(&[
            ("PORT", "9000"),
            ("RUNR_TICK_URL", "http://fn.local:81/tick?x=1"),
        ])
        .unwrap();
        assert_eq!(c.target.host, "fn.local");
        assert_eq!(c.target.port, 81);
        assert_eq!(c.target.authority, "fn.local:81");
        assert_eq!(c.target.path, "/tick?x=1");
        let c = config(&[("RUNR_TICK_URL", "http://[::1]")]).unwrap();
        assert_eq!((c.target.host.as_str(), c.target.port), ("::1", 80));
        assert_eq!(c.target.path, "/");
    }

    #[test]
    fn every_bad_variable_is_reported() {
        let errs = config(&[
            ("PORT", "http"),
            ("RUNR_TICK_URL", "https://x/"),
            ("RUNR_TICK_WAIT", "soon"),
        ])
        .unwrap_err();
        let names: Vec<_> = errs.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["PORT", "RUNR_TICK_URL", "RUNR_TICK_WAIT"]);
        assert_eq!(
            errs[0].to_string(),
            "PORT=\"http\": expected a port number between 1 and 65535"
        );
        assert!(config(&[("PORT", "0")]).is_err());
        assert!(config(&[("RUNR_TICK_URL", "not a url")]).is_err());
    }

    #[test]
    fn durations_per_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "s", "1.5s", "-1s", "10d", "5 m", "99999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
