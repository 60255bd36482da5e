//! The observation part of the configuration: tracing, its OTLP export and sampler, replay
//! capture, and the observed proxy's upstream port. Plain values here; what they turn on lives
//! in [`crate::observe`].

use std::path::PathBuf;
use std::time::Duration;

use runr_base::env::{Env, VarDoc};
use runr_tick::config::{DEFAULT_TICK_WAIT, ENV_TICK_WAIT};

/// `1`/`true`: a server span and access line per invocation; in http mode the observed proxy.
pub const ENV_TRACING: &str = "RUNR_TRACING";
/// `1`/`true`: failed invocations are written to [`ENV_REPLAY_FILE`]; in http mode the observed proxy.
pub const ENV_REPLAY: &str = "RUNR_REPLAY";
/// The capture file.
pub const ENV_REPLAY_FILE: &str = "RUNR_REPLAY_FILE";
const DEFAULT_REPLAY_FILE: &str = "/tmp/runr-replay.jsonl";
/// Request body bytes kept per capture (`1048576`, `512KiB`, `1MiB`).
pub const ENV_REPLAY_MAX_BODY: &str = "RUNR_REPLAY_MAX_BODY";
const DEFAULT_REPLAY_MAX_BODY: u64 = 1 << 20;
/// Size at which the capture file is rotated (one previous file, `<file>.1`, is kept).
pub const ENV_REPLAY_MAX_BYTES: &str = "RUNR_REPLAY_MAX_BYTES";
const DEFAULT_REPLAY_MAX_BYTES: u64 = 64 << 20;
/// Port the program listens on behind the observed proxy (http mode).
pub const ENV_UPSTREAM_PORT: &str = "RUNR_UPSTREAM_PORT";
const DEFAULT_UPSTREAM_PORT: u16 = 8081;

// The OTLP export's variables: read (and their defaults kept) by runr-base's exporter, which
// runr-queue shares; listed in this binary's table below.
pub use runr_base::otlp::{
    OtlpConfig, ENV_BSP_MAX_EXPORT_BATCH_SIZE, ENV_BSP_MAX_QUEUE_SIZE, ENV_BSP_SCHEDULE_DELAY,
    ENV_K_SERVICE, ENV_OTLP_ENDPOINT, ENV_OTLP_HEADERS, ENV_OTLP_PROTOCOL, ENV_OTLP_TIMEOUT,
    ENV_OTLP_TRACES_ENDPOINT, ENV_OTLP_TRACES_HEADERS, ENV_OTLP_TRACES_PROTOCOL,
    ENV_OTLP_TRACES_TIMEOUT, ENV_SDK_DISABLED, ENV_SERVICE_NAME,
};
#[cfg(test)]
use runr_base::otlp::{DEFAULT_BSP_SCHEDULE_DELAY, DEFAULT_OTLP_TIMEOUT};

/// The sampler (`parentbased_always_on` by default).
pub const ENV_SAMPLER: &str = "OTEL_TRACES_SAMPLER";
/// The sampler's ratio.
pub const ENV_SAMPLER_ARG: &str = "OTEL_TRACES_SAMPLER_ARG";
/// The observation variables, for `version`/`help`.
pub const VARS: &[VarDoc] = &[
    VarDoc::new(
        ENV_TRACING,
        "0",
        "1 | 0: server span + access line per invocation; http mode runs the observed proxy",
    ),
    VarDoc::new(
        ENV_REPLAY,
        "0",
        "1 | 0: capture failed invocations as JSON lines; http mode runs the observed proxy",
    ),
    VarDoc::new(ENV_REPLAY_FILE, DEFAULT_REPLAY_FILE, "capture file"),
    VarDoc::new(
        ENV_REPLAY_MAX_BODY,
        "1MiB",
        "request body bytes kept per capture",
    ),
    VarDoc::new(
        ENV_REPLAY_MAX_BYTES,
        "64MiB",
        "rotate the capture file at this size, keeping <file>.1",
    ),
    VarDoc::new(
        ENV_UPSTREAM_PORT,
        "8081",
        "port of the program behind the observed proxy",
    ),
    VarDoc::new(
        ENV_TICK_WAIT,
        "60s",
        "how long to wait for the program to listen (http mode) or say it is ready (RUNR_WORKER_READY)",
    ),
    VarDoc::optional(
        ENV_OTLP_ENDPOINT,
        "OTLP/HTTP collector; spans go to <endpoint>/v1/traces (default: no export)",
    ),
    VarDoc::optional(
        ENV_OTLP_TRACES_ENDPOINT,
        "OTLP/HTTP traces endpoint, used as it is",
    ),
    VarDoc::new(ENV_OTLP_PROTOCOL, "http/json", "http/json | http/protobuf"),
    VarDoc::optional(ENV_OTLP_TRACES_PROTOCOL, "traces-specific protocol"),
    VarDoc::optional(ENV_OTLP_HEADERS, "export headers: key=value,key2=value2"),
    VarDoc::optional(ENV_OTLP_TRACES_HEADERS, "traces-specific export headers"),
    VarDoc::new(
        ENV_OTLP_TIMEOUT,
        "10000",
        "per-export time limit, milliseconds",
    ),
    VarDoc::optional(ENV_OTLP_TRACES_TIMEOUT, "traces-specific export time limit"),
    VarDoc::new(
        ENV_SERVICE_NAME,
        "$K_SERVICE, else unknown_service:runr-wrapper",
        "service.name of the spans",
    ),
    VarDoc::optional(ENV_K_SERVICE, "Knative's service name"),
    VarDoc::new(ENV_SAMPLER, "parentbased_always_on", "the sampler"),
    VarDoc::new(ENV_SAMPLER_ARG, "1.0", "the sampler's ratio"),
    VarDoc::new(
        ENV_BSP_SCHEDULE_DELAY,
        "5000",
        "longest wait of a span for its export batch, milliseconds",
    ),
    VarDoc::new(
        ENV_BSP_MAX_QUEUE_SIZE,
        "2048",
        "spans queued for export at most; more are dropped",
    ),
    VarDoc::new(
        ENV_BSP_MAX_EXPORT_BATCH_SIZE,
        "512",
        "spans per export request at most",
    ),
    VarDoc::optional(ENV_SDK_DISABLED, "true: no export"),
];

/// The observation part of the wrapper's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ObserveConfig {
    /// `RUNR_TRACING`.
    pub tracing: bool,
    /// The sampler, from `OTEL_TRACES_SAMPLER`/`_ARG`.
    pub sampler: Sampler,
    /// Span export, when an endpoint is set and tracing is on.
    pub otlp: Option<OtlpConfig>,
    /// Replay capture, when `RUNR_REPLAY` is on.
    pub replay: Option<ReplayConfig>,
    /// `RUNR_UPSTREAM_PORT`.
    pub upstream_port: u16,
    /// `RUNR_TICK_WAIT`: how long http mode waits for the program to listen (the invoke
    /// sequence, and the observed proxy before it answers 503), and how long a persistent
    /// worker gets to say it is ready (`RUNR_WORKER_READY=1`).
    pub listen_wait: Duration,
}

impl Default for ObserveConfig {
    fn default() -> Self {
        ObserveConfig {
            tracing: false,
            sampler: Sampler::ParentBased(Root::AlwaysOn),
            otlp: None,
            replay: None,
            upstream_port: DEFAULT_UPSTREAM_PORT,
            listen_wait: DEFAULT_TICK_WAIT,
        }
    }
}

impl ObserveConfig {
    /// True when http mode must run the observed proxy instead of exec'ing the program.
    pub fn observed(&self) -> bool {
        self.tracing || self.replay.is_some()
    }

    /// Reads the observation variables from `env` (which collects the errors). `port` is the
    /// wrapper's own port, which the upstream must not share.
    pub fn parse(env: &mut Env, port: u16) -> ObserveConfig {
        let tracing = env.flag(ENV_TRACING, false);
        let replay_on = env.flag(ENV_REPLAY, false);
        let upstream_port = env.port(ENV_UPSTREAM_PORT, DEFAULT_UPSTREAM_PORT);
        if (replay_on || tracing) && upstream_port == port {
            env.reject(
                ENV_UPSTREAM_PORT,
                Some(&upstream_port.to_string()),
                "must differ from PORT",
            );
        }
        let sampler = {
            let name = env.value(ENV_SAMPLER);
            let arg = env.value(ENV_SAMPLER_ARG);
            match Sampler::parse(name.as_deref(), arg.as_deref()) {
                Ok(s) => s,
                Err((var, reason)) => {
                    let value = if var == ENV_SAMPLER { name } else { arg };
                    env.reject(var, value.as_deref(), reason);
                    ObserveConfig::default().sampler
                }
            }
        };
        let replay = replay_on.then(|| ReplayConfig {
            file: env
                .value(ENV_REPLAY_FILE)
                .unwrap_or_else(|| DEFAULT_REPLAY_FILE.into())
                .into(),
            max_body: usize::try_from(env.size(ENV_REPLAY_MAX_BODY, DEFAULT_REPLAY_MAX_BODY))
                .unwrap_or(usize::MAX),
            max_bytes: env.size_in(ENV_REPLAY_MAX_BYTES, DEFAULT_REPLAY_MAX_BYTES, 1..=u64::MAX),
        });
        // No export without tracing: the spans are the tracing's.
        let otlp = runr_base::otlp::from_env(env, "runr-wrapper").filter(|_| tracing);
        let listen_wait = env.duration(ENV_TICK_WAIT, DEFAULT_TICK_WAIT);
        ObserveConfig {
            tracing,
            sampler,
            otlp,
            replay,
            upstream_port,
            listen_wait,
        }
    }
}

// === the values ===

/// Where and how much to capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayConfig {
    /// `RUNR_REPLAY_FILE`.
    pub file: PathBuf,
    /// `RUNR_REPLAY_MAX_BODY`: request body bytes kept per capture.
    pub max_body: usize,
    /// `RUNR_REPLAY_MAX_BYTES`: the file is rotated (to `<file>.1`) before it grows past this.
    pub max_bytes: u64,
}

/// `OTEL_TRACES_SAMPLER`: which spans are recorded (exported, and `sampled=true` downstream).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampler {
    /// Every span.
    AlwaysOn,
    /// No span.
    AlwaysOff,
    /// A fixed ratio of traces, decided on the trace id so every hop agrees.
    TraceIdRatio(f64),
    /// Follow the caller's decision; new traces use the inner sampler.
    ParentBased(Root),
}

/// The sampler of a parent-based sampler for traces that start here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Root {
    /// Sample every new trace.
    AlwaysOn,
    /// Sample no new trace.
    AlwaysOff,
    /// Sample this ratio of new traces.
    Ratio(f64),
}

impl Sampler {
    /// Parses `OTEL_TRACES_SAMPLER` with its `OTEL_TRACES_SAMPLER_ARG` (the ratio, default 1.0).
    pub fn parse(name: Option<&str>, arg: Option<&str>) -> Result<Sampler, (&'static str, String)> {
        let ratio = || -> Result<f64, (&'static str, String)> {
            match arg {
                None => Ok(1.0),
                Some(a) => match a.trim().parse::<f64>() {
                    Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                    _ => Err((
                        "OTEL_TRACES_SAMPLER_ARG",
                        "expected a ratio between 0 and 1".to_string(),
                    )),
                },
            }
        };
        Ok(
            match name.map(str::trim).unwrap_or("parentbased_always_on") {
                "always_on" => Sampler::AlwaysOn,
                "always_off" => Sampler::AlwaysOff,
                "traceidratio" => Sampler::TraceIdRatio(ratio()?),
                "parentbased_always_on" => Sampler::ParentBased(Root::AlwaysOn),
                "parentbased_always_off" => Sampler::ParentBased(Root::AlwaysOff),
                "parentbased_traceidratio" => Sampler::ParentBased(Root::Ratio(ratio()?)),
                _ => {
                    return Err((
                        "OTEL_TRACES_SAMPLER",
                        "expected always_on, always_off, traceidratio, parentbased_always_on, \
                     parentbased_always_off or parentbased_traceidratio"
                            .to_string(),
                    ))
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> (ObserveConfig, Vec<runr_base::env::ConfigError>) {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |n: &str| map.get(n).cloned();
        let mut env = Env::new(&get);
        let c = ObserveConfig::parse(&mut env, 8080);
        (c, env.finish().err().unwrap_or_default().0)
    }

    #[test]
    fn off_by_default() {
        let (c, e) = parse(&[]);
        assert!(e.is_empty());
        assert!(!c.observed());
        assert_eq!(c.upstream_port, 8081);
        assert!(c.otlp.is_none() && c.replay.is_none());
    }

    #[test]
    fn tracing_with_export() {
        let (c, e) = parse(&[
            (ENV_TRACING, "1"),
            (ENV_OTLP_ENDPOINT, "http://collector:4318/"),
            (ENV_SERVICE_NAME, "orders"),
            (ENV_SAMPLER, "traceidratio"),
            (ENV_SAMPLER_ARG, "0.5"),
            (
                ENV_OTLP_HEADERS,
                "x-tenant=a, authorization=Basic%20dTpw%3D",
            ),
        ]);
        assert!(e.is_empty(), "{e:?}");
        let otlp = c.otlp.unwrap();
        assert_eq!(otlp.endpoint.to_string(), "http://collector:4318/v1/traces");
        assert_eq!(otlp.service_name, "orders");
        assert_eq!(
            otlp.headers[1],
            ("authorization".into(), "Basic dTpw=".into())
        );
        assert_eq!(c.sampler, Sampler::TraceIdRatio(0.5));
        let (c, _) = parse(&[
            (ENV_TRACING, "1"),
            (ENV_OTLP_TRACES_ENDPOINT, "http://c:4318/custom"),
            (ENV_OTLP_ENDPOINT, "http://x:1"),
        ]);
        assert_eq!(c.otlp.unwrap().endpoint.to_string(), "http://c:4318/custom");
        // No export without tracing, nor when the SDK is disabled.
        assert!(parse(&[(ENV_OTLP_ENDPOINT, "http://c:4318")])
            .0
            .otlp
            .is_none());
        assert!(parse(&[
            (ENV_TRACING, "1"),
            (ENV_OTLP_ENDPOINT, "http://c:4318"),
            (ENV_SDK_DISABLED, "true")
        ])
        .0
        .otlp
        .is_none());
    }

    #[test]
    fn replay_defaults_and_sizes() {
        let (c, e) = parse(&[(ENV_REPLAY, "true"), (ENV_REPLAY_MAX_BODY, "4KiB")]);
        assert!(e.is_empty());
        let r = c.replay.unwrap();
        assert_eq!(r.file.to_str(), Some("/tmp/runr-replay.jsonl"));
        assert_eq!(r.max_body, 4096);
        assert_eq!(r.max_bytes, 64 << 20);
        // The spellings the replay sizes took before keep their meaning (powers of 1024).
        let size = |v: &str| {
            let (c, e) = parse(&[(ENV_REPLAY, "1"), (ENV_REPLAY_MAX_BODY, v)]);
            assert!(e.is_empty(), "{v}: {e:?}");
            c.replay.unwrap().max_body
        };
        assert_eq!(size("1048576"), 1 << 20);
        assert_eq!(size("512k"), 512 << 10);
        assert_eq!(size("1MiB"), 1 << 20);
        assert_eq!(size("2G"), 2 << 30);
        assert_eq!(size("10mb"), 10 << 20);
        // Valid in the common grammar.
        assert_eq!(size("1.5MiB"), 3 << 19);
    }

    #[test]
    fn otel_durations_are_milliseconds_when_bare() {
        let otlp = |extra: &[(&str, &str)]| {
            let vars = [
                &[(ENV_TRACING, "1"), (ENV_OTLP_ENDPOINT, "http://c:4318")][..],
                extra,
            ]
            .concat();
            let (c, e) = parse(&vars);
            assert!(e.is_empty(), "{e:?}");
            c.otlp.unwrap()
        };
        let o = otlp(&[]);
        assert_eq!(
            (o.timeout, o.schedule_delay),
            (DEFAULT_OTLP_TIMEOUT, DEFAULT_BSP_SCHEDULE_DELAY)
        );
        let o = otlp(&[(ENV_OTLP_TIMEOUT, "2500"), (ENV_BSP_SCHEDULE_DELAY, "100")]);
        assert_eq!(o.timeout, Duration::from_millis(2500));
        assert_eq!(o.schedule_delay, Duration::from_millis(100));
        let o = otlp(&[(ENV_OTLP_TIMEOUT, "1"), (ENV_OTLP_TRACES_TIMEOUT, "3s")]);
        assert_eq!(
            o.timeout,
            Duration::from_secs(3),
            "the traces-specific one wins"
        );
        let (_, e) = parse(&[
            (ENV_TRACING, "1"),
            (ENV_OTLP_ENDPOINT, "http://c:4318"),
            (ENV_OTLP_TIMEOUT, "soon"),
        ]);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].name, ENV_OTLP_TIMEOUT);
    }

    #[test]
    fn sampler_names_and_ratios() {
        assert_eq!(
            Sampler::parse(None, None),
            Ok(Sampler::ParentBased(Root::AlwaysOn))
        );
        assert_eq!(
            Sampler::parse(Some("traceidratio"), Some("0.25")),
            Ok(Sampler::TraceIdRatio(0.25))
        );
        assert!(Sampler::parse(Some("traceidratio"), Some("2")).is_err());
        assert!(Sampler::parse(Some("jaeger_remote"), None).is_err());
    }

    #[test]
    fn every_bad_variable_is_named() {
        let (_, e) = parse(&[
            (ENV_TRACING, "maybe"),
            (ENV_REPLAY, "1"),
            (ENV_UPSTREAM_PORT, "8080"),
            (ENV_REPLAY_MAX_BYTES, "0"),
            (ENV_SAMPLER, "sometimes"),
            (ENV_OTLP_ENDPOINT, "https://collector:4318"),
            (ENV_OTLP_PROTOCOL, "grpc"),
            (ENV_BSP_MAX_QUEUE_SIZE, "0"),
        ]);
        let names: Vec<_> = e.iter().map(|e| e.name).collect();
        assert_eq!(
            names,
            [
                ENV_TRACING,
                ENV_UPSTREAM_PORT,
                ENV_SAMPLER,
                ENV_REPLAY_MAX_BYTES,
                ENV_OTLP_ENDPOINT,
                ENV_OTLP_PROTOCOL,
                ENV_BSP_MAX_QUEUE_SIZE
            ]
        );
        assert!(
            e[0].to_string().contains("RUNR_TRACING=\"maybe\""),
            "{}",
            e[0]
        );
    }
}
