//! Where the tick goes and how long to wait for it to be accepted, from environment variables
//! (read through [`runr_base::env`]: one grammar, one error per bad variable).

use std::time::Duration;

use runr_base::env::{ConfigErrors, Env, VarDoc};

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

/// Every variable the tick reads, for `help` and the test that the parser reads no other.
pub const VARS: &[VarDoc] = &[
    VarDoc::new(ENV_PORT, "8080", "port of the server on 127.0.0.1"),
    VarDoc::optional(ENV_TICK_URL, "http://host:port/path to send to instead"),
    VarDoc::new(
        ENV_TICK_WAIT,
        "60s",
        "how long to wait for the server to listen",
    ),
];

/// An HTTP endpoint to send the tick to (the same endpoint type the OTLP exporter posts to).
pub use runr_base::target::Target;

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
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<TickConfig, ConfigErrors> {
        let mut env = Env::new(get);
        // The port is checked even when the URL wins: a bad PORT is a mistake either way.
        let port = env.port(ENV_PORT, DEFAULT_PORT);
        let target =
            Target::optional(&mut env, ENV_TICK_URL).unwrap_or_else(|| Target::local(port));
        let wait = env.duration(ENV_TICK_WAIT, DEFAULT_TICK_WAIT);
        env.finish()?;
        Ok(TickConfig { target, wait })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<TickConfig, ConfigErrors> {
        TickConfig::from_lookup(&runr_base::env::pairs_lookup(vars))
    }

    #[test]
    fn defaults_to_local_port_8080() {
        let c = config(&[]).unwrap();
        assert_eq!(c.target, Target::local(8080));
        assert_eq!(c.wait, Duration::from_secs(60));
        assert_eq!(c.target.to_string(), "http://127.0.0.1:8080/");
    }

    #[test]
    fn empty_values_are_unset() {
        // `PORT=""` is the default here as it is for `runr-wrapper serve` (it was an error).
        let c = config(&[("PORT", ""), ("RUNR_TICK_URL", " "), ("RUNR_TICK_WAIT", "")]).unwrap();
        assert_eq!(c, config(&[]).unwrap());
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
        assert_eq!(errs.names(), ["PORT", "RUNR_TICK_URL", "RUNR_TICK_WAIT"]);
        assert_eq!(
            errs.0[0].to_string(),
            "PORT=\"http\": expected a port number from 1 to 65535"
        );
        assert!(config(&[("PORT", "0")]).is_err());
        assert!(config(&[("RUNR_TICK_URL", "not a url")]).is_err());
    }

    #[test]
    fn the_wait_takes_the_common_duration_grammar() {
        let wait = |v: &str| config(&[("RUNR_TICK_WAIT", v)]).map(|c| c.wait);
        assert_eq!(wait("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(wait("30"), Ok(Duration::from_secs(30)));
        assert_eq!(wait("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(wait("1h"), Ok(Duration::from_secs(3600)));
        // Valid in the grammar of every binary.
        assert_eq!(wait("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(wait("5 m"), Ok(Duration::from_secs(300)));
        for bad in ["s", "-1s", "10d", "99999999999999999999h"] {
            assert!(wait(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn every_variable_read_is_in_the_table() {
        let read =
            runr_base::env::names_read(&[("PORT", "1"), ("RUNR_TICK_URL", "http://x/")], |get| {
                let _ = TickConfig::from_lookup(get);
            });
        assert_eq!(read, ["PORT", "RUNR_TICK_URL", "RUNR_TICK_WAIT"]);
        assert_eq!(
            runr_base::env::unlisted(&[VARS], &read),
            Vec::<String>::new()
        );
    }
}
