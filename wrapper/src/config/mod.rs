//! The wrapper's configuration: every environment variable, its default, and one error per bad
//! variable (name and value kept in the error) so a single restart shows every mistake. Read
//! through [`runr_base::env`]: the grammar of durations, flags and ports is every binary's.

pub(crate) mod handler;
pub(crate) mod lambda;
pub(crate) mod memory;
pub(crate) mod observe;
pub(crate) mod telemetry;

use std::time::Duration;

use runr_base::env::{ConfigErrors, Env, VarDoc};

use handler::HandlerConfig;
use lambda::LambdaConfig;
use memory::MemoryConfig;
use observe::ObserveConfig;
use telemetry::TelemetryConfig;

/// Port the wrapper listens on (all interfaces). `0` picks a free port (logged at startup).
pub const ENV_PORT: &str = "PORT";
const DEFAULT_PORT: u16 = 8080;

/// `exec` (one process per invocation), `persistent` (long-lived workers, JSON lines), `http`
/// (the program serves HTTP itself) or `lambda` (runtimes speaking the AWS Lambda Runtime API).
/// Required.
pub const ENV_MODE: &str = "RUNR_WRAPPER_MODE";

/// The program to run: a JSON array of strings, or a plain string split on whitespace (no shell).
/// Required, except in lambda mode when a `bootstrap` is found (see [`lambda`]).
pub const ENV_COMMAND: &str = "RUNR_COMMAND";

/// What an exec-mode handler reads on stdin: `json` (the request envelope) or `raw` (the body).
pub const ENV_INPUT: &str = "RUNR_INPUT";
const DEFAULT_INPUT: Input = Input::Json;

/// Number of persistent-mode workers (lambda mode: runtime processes), 1–16.
pub const ENV_WORKERS: &str = "RUNR_WORKERS";
const DEFAULT_WORKERS: usize = 1;
const MAX_WORKERS: usize = 16;

/// Time limit per invocation: seconds (`30`, `2.5`) or with a unit (`500ms`, `30s`, `5m`, `1h`).
pub const ENV_TIMEOUT: &str = "RUNR_TIMEOUT";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Below a millisecond no handler can even start.
const MIN_TIMEOUT: Duration = Duration::from_millis(1);
/// An invocation limit above a day is a typo, not a plan.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// Exec mode: handler processes running at once; further requests wait in line
/// ([`ENV_MAX_QUEUE`]). Persistent mode runs one request per worker at once instead.
pub const ENV_MAX_INFLIGHT: &str = "RUNR_MAX_INFLIGHT";
const DEFAULT_MAX_INFLIGHT: usize = 256;
const MAX_MAX_INFLIGHT: usize = 65536;

/// Requests waiting for a handler slot (exec) or a free worker (persistent) at most; a request
/// that finds the line full answers 503 `overloaded` with `Retry-After: 1` without its body
/// being read. `0`: none wait.
pub const ENV_MAX_QUEUE: &str = "RUNR_MAX_QUEUE";
const DEFAULT_MAX_QUEUE: usize = 1024;
const MAX_MAX_QUEUE: usize = 1 << 20;

/// What sends the invocations: `http`, `queue` (CloudEvents from the queue consumer) or
/// `schedule` (one tick per run). When set it decides for the pod; unset, `RUNR_MODE` and each
/// request's CloudEvent do ([`crate::request::trigger`]).
pub const ENV_TRIGGER: &str = "RUNR_TRIGGER";

/// The container's run shape, set by the platform (a CronJob's container has `schedule`):
/// without `RUNR_TRIGGER`, `schedule` runs the schedule one-shot; other values belong to other
/// images and are ignored.
pub const ENV_RUN_MODE: &str = "RUNR_MODE";

/// The wrapper's own log level: `error`, `warn`, `info` or `debug`.
pub const ENV_LOG: &str = "RUNR_LOG";
const DEFAULT_LOG: tracing::Level = tracing::Level::INFO;

/// Every variable `serve` documents: what `version` prints, and (with the tick's table, whose
/// `RUNR_TICK_WAIT` it reads too) what the warning about unknown `RUNR_*` names knows.
pub const TABLES: &[&[VarDoc]] = &[
    VARS,
    handler::VARS,
    telemetry::VARS,
    observe::VARS,
    lambda::VARS,
];

/// The variables of `serve` itself (the handler, telemetry, observation and lambda ones are in
/// [`handler::VARS`], [`telemetry::VARS`], [`observe::VARS`] and [`lambda::VARS`]).
pub const VARS: &[VarDoc] = &[
    VarDoc::new(ENV_PORT, "8080", "port to listen on"),
    VarDoc::required(ENV_MODE, "exec | persistent | http | lambda"),
    VarDoc::required(
        ENV_COMMAND,
        "the program: JSON array of strings, or a string split on whitespace",
    ),
    VarDoc::new(
        ENV_INPUT,
        "json",
        "json | raw: what an exec-mode handler reads on stdin",
    ),
    VarDoc::new(
        ENV_WORKERS,
        "1",
        "persistent-mode workers (lambda mode: runtime processes), 1-16",
    ),
    VarDoc::new(
        ENV_TIMEOUT,
        "30s",
        "time per invocation: seconds, or 500ms / 30s / 5m / 1h",
    ),
    VarDoc::new(
        ENV_MAX_INFLIGHT,
        "256",
        "exec mode: handler processes at once, 1-65536",
    ),
    VarDoc::new(
        ENV_MAX_QUEUE,
        "1024",
        "requests waiting for a handler or worker, 0-1048576; beyond: 503",
    ),
    VarDoc::new(
        memory::ENV_MAX_INFLIGHT_BYTES,
        "half the cgroup memory limit",
        "bytes held for invocations at most (bodies, envelopes, answers, captures), or unlimited",
    ),
    VarDoc::optional(
        ENV_TRIGGER,
        "http | queue | schedule, for the whole pod; unset: RUNR_MODE=schedule runs the \
         schedule one-shot, else each request's CloudEvent decides (http without one)",
    ),
    VarDoc::optional(
        ENV_RUN_MODE,
        "set by the platform; schedule (and no RUNR_TRIGGER): the schedule one-shot",
    ),
    VarDoc::new(ENV_LOG, "info", "error | warn | info | debug"),
];

/// How the user's program receives invocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One process per invocation.
    Exec,
    /// `RUNR_WORKERS` processes started once, one JSON line per invocation.
    Persistent,
    /// The program serves HTTP on `$PORT` itself.
    Http,
    /// `RUNR_WORKERS` runtime processes that poll the wrapper's AWS Lambda Runtime API.
    Lambda,
}

impl Mode {
    /// The name used in `RUNR_WRAPPER_MODE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Exec => "exec",
            Mode::Persistent => "persistent",
            Mode::Http => "http",
            Mode::Lambda => "lambda",
        }
    }
}

/// What an exec-mode handler gets on stdin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// The request envelope as JSON.
    Json,
    /// The request body as it arrived.
    Raw,
}

/// Where invocations come from; it goes into the envelope and `RUNR_TRIGGER`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Plain HTTP requests.
    Http,
    /// CloudEvents in binary mode POSTed by the queue consumer.
    Queue,
    /// Schedule ticks.
    Schedule,
}

impl Trigger {
    /// The name used in the envelope and in `RUNR_TRIGGER`.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Http => "http",
            Trigger::Queue => "queue",
            Trigger::Schedule => "schedule",
        }
    }
}

/// Everything the wrapper reads from its environment, parsed once at startup.
#[derive(Debug, Clone)]
pub struct Config {
    /// `PORT`.
    pub port: u16,
    /// `RUNR_WRAPPER_MODE`.
    pub mode: Mode,
    /// `RUNR_COMMAND`: program and arguments, never empty.
    pub command: Vec<String>,
    /// `RUNR_INPUT`.
    pub input: Input,
    /// `RUNR_WORKERS`.
    pub workers: usize,
    /// `RUNR_TIMEOUT`.
    pub timeout: Duration,
    /// `RUNR_MAX_INFLIGHT`.
    pub max_inflight: usize,
    /// `RUNR_MAX_QUEUE`.
    pub max_queue: usize,
    /// The cgroup's memory limit and `RUNR_MAX_INFLIGHT_BYTES`.
    pub memory: MemoryConfig,
    /// `RUNR_TRIGGER`, when set.
    pub trigger: Option<Trigger>,
    /// `RUNR_MODE`, when set.
    pub run_mode: Option<String>,
    /// `RUNR_LOG`.
    pub log_level: tracing::Level,
    /// Kill grace, the result channel, the ready handshake, worker recycling.
    pub handler: HandlerConfig,
    /// Metrics endpoint and log lines.
    pub telemetry: TelemetryConfig,
    /// Tracing, replay capture and the observed proxy's upstream port.
    pub observe: ObserveConfig,
    /// lambda mode's own variables (`None` in the other modes).
    pub lambda: Option<LambdaConfig>,
}

// === impl Config ===

impl Config {
    /// Parses the configuration from `get` (the process environment in production, a map in
    /// tests), collecting every error before failing. Empty values count as unset.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
        let mut env = Env::new(get);
        let port = env.listen_port(ENV_PORT, DEFAULT_PORT);
        let mode = env.required(ENV_MODE, |v| match v {
            "exec" => Ok(Mode::Exec),
            "persistent" => Ok(Mode::Persistent),
            "http" => Ok(Mode::Http),
            "lambda" => Ok(Mode::Lambda),
            _ => Err("expected exec, persistent, http or lambda".into()),
        });
        let lambda = (mode == Some(Mode::Lambda)).then(|| LambdaConfig::parse(&mut env));
        let command = match &lambda {
            Some(lambda) => lambda.command(&mut env),
            None => env.required(ENV_COMMAND, parse_command),
        };
        let input = env.parse(ENV_INPUT, DEFAULT_INPUT, |v| match v {
            "json" => Ok(Input::Json),
            "raw" => Ok(Input::Raw),
            _ => Err("expected json or raw".into()),
        });
        let workers = env.count(ENV_WORKERS, DEFAULT_WORKERS, 1..=MAX_WORKERS);
        let timeout = env.duration_in(ENV_TIMEOUT, DEFAULT_TIMEOUT, MIN_TIMEOUT..=MAX_TIMEOUT);
        let max_inflight = env.count(ENV_MAX_INFLIGHT, DEFAULT_MAX_INFLIGHT, 1..=MAX_MAX_INFLIGHT);
        let max_queue = env.count(ENV_MAX_QUEUE, DEFAULT_MAX_QUEUE, 0..=MAX_MAX_QUEUE);
        let memory = MemoryConfig::parse(&mut env, memory::cgroup_limit());
        let trigger = env.optional(ENV_TRIGGER, |v| match v {
            "http" => Ok(Trigger::Http),
            "queue" => Ok(Trigger::Queue),
            "schedule" => Ok(Trigger::Schedule),
            _ => Err("expected http, queue or schedule".into()),
        });
        let run_mode = env.value(ENV_RUN_MODE);
        let log_level = env.level(ENV_LOG, DEFAULT_LOG);
        let handler = HandlerConfig::parse(&mut env);
        let telemetry = TelemetryConfig::parse(&mut env, port);
        let observe = ObserveConfig::parse(&mut env, port);
        // Metrics in http mode run the observed proxy: its upstream port is in use then too.
        if let (Some(Mode::Http), Some(metrics)) = (mode, telemetry.metrics_port) {
            let upstream = observe.upstream_port;
            if upstream == port && !observe.observed() {
                env.reject(
                    observe::ENV_UPSTREAM_PORT,
                    Some(&upstream.to_string()),
                    "must differ from PORT",
                );
            }
            if metrics == upstream {
                env.reject(
                    telemetry::ENV_METRICS_PORT,
                    Some(&metrics.to_string()),
                    "must differ from RUNR_UPSTREAM_PORT (http mode)",
                );
            }
        }
        let config = mode.zip(command).map(|(mode, command)| Config {
            port,
            mode,
            command,
            input,
            workers,
            timeout,
            max_inflight,
            max_queue,
            memory,
            trigger,
            run_mode,
            log_level,
            handler,
            telemetry,
            observe,
            lambda,
        });
        env.finish_with(config)
    }
}

/// `["bash","/app/code/main.sh"]` or `bash /app/code/main.sh`: never through a shell, so what
/// the user wrote is exactly the argv.
pub fn parse_command(v: &str) -> Result<Vec<String>, String> {
    let v = v.trim();
    let argv: Vec<String> = if v.starts_with('[') {
        serde_json::from_str(v).map_err(|e| format!("not a JSON array of strings: {e}"))?
    } else {
        v.split_whitespace().map(str::to_string).collect()
    };
    match argv.first() {
        Some(program) if !program.is_empty() => Ok(argv),
        _ => Err("the command is empty".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
        Config::from_lookup(&runr_base::env::pairs_lookup(vars))
    }

    #[test]
    fn defaults_with_required_variables() {
        let c = parse(&[(ENV_MODE, "exec"), (ENV_COMMAND, "cat")]).unwrap();
        assert_eq!(c.port, 8080);
        assert_eq!(c.mode, Mode::Exec);
        assert_eq!(c.command, vec!["cat"]);
        assert_eq!(c.input, Input::Json);
        assert_eq!(c.workers, 1);
        assert_eq!(c.timeout, Duration::from_secs(30));
        assert_eq!(c.trigger, None);
        assert_eq!(c.run_mode, None);
        assert_eq!(c.max_inflight, 256);
        assert_eq!(c.max_queue, 1024);
    }

    #[test]
    fn every_variable_parsed() {
        let c = parse(&[
            (ENV_PORT, "9000"),
            (ENV_MODE, "persistent"),
            (ENV_COMMAND, r#"["python3", "-u", "/app/code/main.py"]"#),
            (ENV_INPUT, "raw"),
            (ENV_WORKERS, "16"),
            (ENV_TIMEOUT, "2.5"),
            (ENV_TRIGGER, "queue"),
            (ENV_RUN_MODE, "schedule"),
            (ENV_LOG, "debug"),
            (ENV_MAX_INFLIGHT, "8"),
            (ENV_MAX_QUEUE, "0"),
        ])
        .unwrap();
        assert_eq!((c.max_inflight, c.max_queue), (8, 0));
        assert_eq!(c.port, 9000);
        assert_eq!(c.mode, Mode::Persistent);
        assert_eq!(c.command, vec!["python3", "-u", "/app/code/main.py"]);
        assert_eq!(c.input, Input::Raw);
        assert_eq!(c.workers, 16);
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.trigger, Some(Trigger::Queue));
        assert_eq!(c.run_mode.as_deref(), Some("schedule"));
        assert_eq!(c.log_level, tracing::Level::DEBUG);
    }

    #[test]
    fn every_error_is_collected_with_name_and_value() {
        let errs = parse(&[
            (ENV_PORT, "http"),
            (ENV_MODE, "fork"),
            (ENV_WORKERS, "17"),
            (ENV_TIMEOUT, "-1"),
            (ENV_INPUT, "xml"),
            (ENV_TRIGGER, "cron"),
        ])
        .unwrap_err();
        assert_eq!(
            errs.names(),
            [
                ENV_PORT,
                ENV_MODE,
                ENV_COMMAND,
                ENV_INPUT,
                ENV_WORKERS,
                ENV_TIMEOUT,
                ENV_TRIGGER
            ]
        );
        let text = errs.to_string();
        assert!(
            text.contains(r#"PORT="http": expected a port number from 0 to 65535"#),
            "{text}"
        );
        assert!(text.contains("RUNR_COMMAND=<unset>: required"), "{text}");
        assert!(text.contains(r#"RUNR_WORKERS="17""#), "{text}");
    }

    #[test]
    fn metrics_in_http_mode_need_a_free_upstream_port() {
        let base = [(ENV_MODE, "http"), (ENV_COMMAND, "srv")];
        let names = |extra: &[(&'static str, &'static str)]| {
            parse(&[&base[..], extra].concat())
                .err()
                .map(|e| e.names())
                .unwrap_or_default()
        };
        assert!(names(&[(telemetry::ENV_METRICS_PORT, "9090")]).is_empty());
        assert_eq!(
            names(&[(telemetry::ENV_METRICS_PORT, "8081")]),
            [telemetry::ENV_METRICS_PORT]
        );
        assert_eq!(
            names(&[
                (telemetry::ENV_METRICS_PORT, "9090"),
                (ENV_PORT, "7000"),
                (observe::ENV_UPSTREAM_PORT, "7000")
            ]),
            [observe::ENV_UPSTREAM_PORT]
        );
        // Exec mode has no upstream.
        let exec = parse(&[
            (ENV_MODE, "exec"),
            (ENV_COMMAND, "x"),
            (telemetry::ENV_METRICS_PORT, "8081"),
        ]);
        assert!(exec.is_ok());
    }

    #[test]
    fn workers_bounds() {
        for ok in ["1", "16"] {
            assert!(parse(&[(ENV_MODE, "exec"), (ENV_COMMAND, "x"), (ENV_WORKERS, ok)]).is_ok());
        }
        for bad in ["0", "17", "two", "1.5"] {
            assert!(parse(&[(ENV_MODE, "exec"), (ENV_COMMAND, "x"), (ENV_WORKERS, bad)]).is_err());
        }
    }

    #[test]
    fn admission_bounds() {
        let get = |k, v| parse(&[(ENV_MODE, "exec"), (ENV_COMMAND, "x"), (k, v)]);
        assert_eq!(get(ENV_MAX_INFLIGHT, "65536").unwrap().max_inflight, 65536);
        assert_eq!(get(ENV_MAX_QUEUE, "1048576").unwrap().max_queue, 1 << 20);
        for bad in ["0", "65537", "-1", "many", "2.5"] {
            let e = get(ENV_MAX_INFLIGHT, bad).unwrap_err();
            assert_eq!(e.names(), [ENV_MAX_INFLIGHT], "{bad}");
        }
        for bad in ["1048577", "-1", "x"] {
            let e = get(ENV_MAX_QUEUE, bad).unwrap_err();
            assert_eq!(e.names(), [ENV_MAX_QUEUE], "{bad}");
        }
    }

    #[test]
    fn command_forms() {
        assert_eq!(
            parse_command("bash  /app/code/main.sh ").unwrap(),
            ["bash", "/app/code/main.sh"]
        );
        assert_eq!(parse_command(r#"["a b", "c"]"#).unwrap(), ["a b", "c"]);
        assert!(parse_command("[]").is_err());
        assert!(parse_command(r#"[""]"#).is_err());
        assert!(parse_command(r#"["a", 1]"#).is_err());
        assert!(parse_command("[not json").is_err());
    }

    #[test]
    fn empty_values_count_as_unset() {
        let c = parse(&[(ENV_MODE, "exec"), (ENV_COMMAND, "cat"), (ENV_PORT, "")]).unwrap();
        assert_eq!(c.port, 8080);
        let e = parse(&[(ENV_MODE, "exec"), (ENV_COMMAND, "  ")]).unwrap_err();
        assert_eq!(e.0[0].name, ENV_COMMAND);
    }

    fn timeout(v: &str) -> Result<Duration, ConfigErrors> {
        parse(&[(ENV_MODE, "exec"), (ENV_COMMAND, "x"), (ENV_TIMEOUT, v)]).map(|c| c.timeout)
    }

    #[test]
    fn timeout_units() {
        assert_eq!(timeout("30").unwrap(), Duration::from_secs(30));
        assert_eq!(timeout("0.25").unwrap(), Duration::from_millis(250));
        assert_eq!(timeout("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(timeout("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(timeout("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(timeout("5 m").unwrap(), Duration::from_secs(300));
        // Valid: RUNR_TIMEOUT takes the common grammar of durations.
        assert_eq!(timeout("5h").unwrap(), Duration::from_secs(5 * 3600));
        assert_eq!(timeout("24h").unwrap(), MAX_TIMEOUT);
        // Empty is unset everywhere: the default.
        assert_eq!(timeout("").unwrap(), DEFAULT_TIMEOUT);
        for bad in [
            "0",
            "-1",
            "abc",
            "ms",
            "NaN",
            "inf",
            "1e9",
            "0.0000001",
            "25h",
        ] {
            let e = timeout(bad).unwrap_err();
            assert_eq!(e.names(), [ENV_TIMEOUT], "{bad}");
        }
        assert_eq!(
            timeout("0").unwrap_err().to_string(),
            r#"RUNR_TIMEOUT="0": must be at least 1ms"#
        );
    }

    #[test]
    fn every_variable_read_is_in_the_table() {
        use observe::{
            ENV_OTLP_ENDPOINT, ENV_OTLP_TRACES_ENDPOINT, ENV_OTLP_TRACES_TIMEOUT, ENV_REPLAY,
            ENV_TRACING,
        };
        // Every branch: plain exec, then tracing and replay on with the general and with the
        // traces-specific OTLP variables.
        let base = [(ENV_MODE, "exec"), (ENV_COMMAND, "cat")];
        let lambda_mode = [(ENV_MODE, "lambda"), (ENV_COMMAND, "bootstrap")];
        let observed = [(ENV_TRACING, "1"), (ENV_REPLAY, "1")];
        let general = [(ENV_OTLP_ENDPOINT, "http://c:4318")];
        let specific = [
            (ENV_OTLP_TRACES_ENDPOINT, "http://c:4318/v1/traces"),
            (ENV_OTLP_TRACES_TIMEOUT, "100"),
        ];
        let mut read = Vec::new();
        for vars in [
            base.to_vec(),
            [&base[..], &observed, &general].concat(),
            [&base[..], &observed, &specific].concat(),
            lambda_mode.to_vec(),
        ] {
            read.extend(runr_base::env::names_read(&vars, |get| {
                let _ = Config::from_lookup(get);
            }));
        }
        for name in [
            ENV_OTLP_TRACES_TIMEOUT,
            observe::ENV_SDK_DISABLED,
            ENV_LOG,
            lambda::ENV_K_SERVICE,
            handler::ENV_WORKER_MAX_AGE,
            telemetry::ENV_LOG_MAX_BYTES,
        ] {
            assert!(read.iter().any(|r| r == name), "{name} read: {read:?}");
        }
        read.sort();
        read.dedup();
        assert_eq!(
            runr_base::env::unlisted(
                &[
                    VARS,
                    handler::VARS,
                    telemetry::VARS,
                    observe::VARS,
                    lambda::VARS
                ],
                &read
            ),
            Vec::<String>::new()
        );
    }
}
