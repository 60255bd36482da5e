//! How the wrapper treats the handler's processes beyond the spec's defaults: the grace between
//! SIGTERM and SIGKILL at a timeout, the result channel on fd 3, the persistent workers' ready
//! handshake and their recycling. Every one of them is off (or the spec's behaviour) when unset.

use std::time::Duration;

use runr_base::env::{Env, VarDoc};

/// Time between SIGTERM and SIGKILL to a handler's group at its timeout; `0` (the default):
/// SIGKILL at once. The 504 is answered at the timeout either way.
pub const ENV_KILL_GRACE: &str = "RUNR_KILL_GRACE";
/// A grace above an hour is a typo, not a plan.
const MAX_KILL_GRACE: Duration = Duration::from_secs(60 * 60);

/// `3`: the handler gets a pipe as fd 3 for its answer, and its stdout goes to the logs.
pub const ENV_RESULT_FD: &str = "RUNR_RESULT_FD";
/// The one descriptor the result channel can be.
pub const RESULT_FD: i32 = 3;

/// `1`: a persistent worker counts as started only once it wrote the line `{"ready":true}`.
pub const ENV_WORKER_READY: &str = "RUNR_WORKER_READY";

/// Requests after which a persistent worker is replaced (±10 %); unset: never.
pub const ENV_WORKER_MAX_REQUESTS: &str = "RUNR_WORKER_MAX_REQUESTS";
/// Age after which a persistent worker is replaced (±10 %); unset: never.
pub const ENV_WORKER_MAX_AGE: &str = "RUNR_WORKER_MAX_AGE";
/// Replacing workers more often than every second would spend the pod on start-ups.
const MIN_WORKER_MAX_AGE: Duration = Duration::from_secs(1);
const MAX_WORKER_MAX_AGE: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// The handler variables, for `version`/`help`.
pub const VARS: &[VarDoc] = &[
    VarDoc::new(
        ENV_KILL_GRACE,
        "0",
        "at the timeout: SIGTERM to the group, SIGKILL after this (0: SIGKILL at once)",
    ),
    VarDoc::optional(
        ENV_RESULT_FD,
        "3: the answer is written to fd 3, stdout goes to the logs (default: stdout answers)",
    ),
    VarDoc::new(
        ENV_WORKER_READY,
        "0",
        "1 | 0: a persistent worker is started once it printed {\"ready\":true}",
    ),
    VarDoc::optional(
        ENV_WORKER_MAX_REQUESTS,
        "replace a persistent worker after this many requests, ±10 % (default: never)",
    ),
    VarDoc::optional(
        ENV_WORKER_MAX_AGE,
        "replace a persistent worker at this age, ±10 % (default: never)",
    ),
];

/// The handler part of the configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HandlerConfig {
    /// `RUNR_KILL_GRACE`.
    pub kill_grace: Duration,
    /// `RUNR_RESULT_FD=3`.
    pub result_fd: bool,
    /// `RUNR_WORKER_READY`.
    pub worker_ready: bool,
    /// `RUNR_WORKER_MAX_REQUESTS`.
    pub max_requests: Option<u64>,
    /// `RUNR_WORKER_MAX_AGE`.
    pub max_age: Option<Duration>,
}

impl HandlerConfig {
    /// Reads the handler variables from `env` (which collects the errors).
    pub fn parse(env: &mut Env) -> HandlerConfig {
        let kill_grace = env.duration_in(
            ENV_KILL_GRACE,
            Duration::ZERO,
            Duration::ZERO..=MAX_KILL_GRACE,
        );
        let result_fd = env
            .optional(ENV_RESULT_FD, |v| match v {
                "3" => Ok(()),
                _ => Err("only 3 is supported".to_string()),
            })
            .is_some();
        let worker_ready = env.flag(ENV_WORKER_READY, false);
        let max_requests = env.optional(ENV_WORKER_MAX_REQUESTS, |v| {
            runr_base::env::parse_count(v, &(1..=u64::MAX))
        });
        let max_age = env.optional(ENV_WORKER_MAX_AGE, |v| {
            let d = runr_base::env::parse_duration(v)?;
            runr_base::env::check_duration(d, &(MIN_WORKER_MAX_AGE..=MAX_WORKER_MAX_AGE))
        });
        HandlerConfig {
            kill_grace,
            result_fd,
            worker_ready,
            max_requests,
            max_age,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> (HandlerConfig, Vec<&'static str>) {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |n: &str| map.get(n).cloned();
        let mut env = Env::new(&get);
        let c = HandlerConfig::parse(&mut env);
        let names = env.finish().err().map(|e| e.names()).unwrap_or_default();
        (c, names)
    }

    #[test]
    fn the_spec_behaviour_by_default() {
        let (c, e) = parse(&[]);
        assert!(e.is_empty());
        assert_eq!(c, HandlerConfig::default());
        assert_eq!(c.kill_grace, Duration::ZERO);
    }

    #[test]
    fn every_variable_parsed() {
        let (c, e) = parse(&[
            (ENV_KILL_GRACE, "2s"),
            (ENV_RESULT_FD, "3"),
            (ENV_WORKER_READY, "yes"),
            (ENV_WORKER_MAX_REQUESTS, "1000"),
            (ENV_WORKER_MAX_AGE, "1h"),
        ]);
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(
            c,
            HandlerConfig {
                kill_grace: Duration::from_secs(2),
                result_fd: true,
                worker_ready: true,
                max_requests: Some(1000),
                max_age: Some(Duration::from_secs(3600)),
            }
        );
        assert_eq!(
            parse(&[(ENV_KILL_GRACE, "250ms")]).0.kill_grace,
            Duration::from_millis(250)
        );
    }

    #[test]
    fn bad_values_are_named() {
        let (_, e) = parse(&[
            (ENV_KILL_GRACE, "2h"),
            (ENV_RESULT_FD, "4"),
            (ENV_WORKER_READY, "maybe"),
            (ENV_WORKER_MAX_REQUESTS, "0"),
            (ENV_WORKER_MAX_AGE, "10ms"),
        ]);
        assert_eq!(
            e,
            [
                ENV_KILL_GRACE,
                ENV_RESULT_FD,
                ENV_WORKER_READY,
                ENV_WORKER_MAX_REQUESTS,
                ENV_WORKER_MAX_AGE
            ]
        );
        assert_eq!(parse(&[(ENV_KILL_GRACE, "soon")]).1, [ENV_KILL_GRACE]);
        assert_eq!(
            parse(&[(ENV_WORKER_MAX_REQUESTS, "-1")]).1,
            [ENV_WORKER_MAX_REQUESTS]
        );
    }
}
