//! Every variable of runr-queue, its default, and the one pass that reads them all
//! ([`Config::from_lookup`]): each bad variable is one [`ConfigError`] naming it.

use std::time::Duration;

use runr_base::env::{display_duration, ConfigError, ConfigErrors, Env, VarDoc};
use runr_base::otlp::{self, OtlpConfig};

/// Where Redis is: `redis://[user:password@]host:port[/db]`, or `rediss://…` for TLS with the
/// built-in roots. Required.
pub const ENV_REDIS_URL: &str = "RUNR_QUEUE_REDIS_URL";
/// Optional PEM file with extra CA certificates for `rediss://`, for a Redis behind a private CA.
/// The built-in (Mozilla) roots stay trusted too.
pub const ENV_REDIS_CA_FILE: &str = "RUNR_QUEUE_REDIS_CA_FILE";
/// A client certificate (PEM, the leaf first, intermediates after it) for `rediss://` to a Redis
/// that requires one (`tls-auth-clients yes`: mutual TLS); with [`ENV_REDIS_KEY_FILE`].
pub const ENV_REDIS_CERT_FILE: &str = "RUNR_QUEUE_REDIS_CERT_FILE";
/// The private key of [`ENV_REDIS_CERT_FILE`] (PEM: PKCS#8, SEC1 or PKCS#1, unencrypted).
pub const ENV_REDIS_KEY_FILE: &str = "RUNR_QUEUE_REDIS_KEY_FILE";
/// The stream to consume. Required.
pub const ENV_STREAM: &str = "RUNR_QUEUE_STREAM";
/// The consumer group; created at [`ENV_START`] with `MKSTREAM` when missing. Required.
pub const ENV_GROUP: &str = "RUNR_QUEUE_GROUP";
/// Where a group the consumer (or `runr-queue create-group`) creates starts: `$` new entries
/// only, `0` the whole stream, or an entry id (entries after it). A group lost later (Redis lost
/// its data, someone destroyed it) is created again where this consumer left off, never at `$`.
pub const ENV_START: &str = "RUNR_QUEUE_START";
const DEFAULT_START: &str = "$";
/// This consumer's name within the group. Defaults to `$HOSTNAME` (the pod's name).
pub const ENV_CONSUMER: &str = "RUNR_QUEUE_CONSUMER";
/// Read only as the default of [`ENV_CONSUMER`]; the kubelet sets it to the pod's name.
pub const ENV_HOSTNAME: &str = "HOSTNAME";
/// The function's URL, `http://host[:port][/path]`. Required.
pub const ENV_TARGET: &str = "RUNR_QUEUE_TARGET";
/// Entries in hand at once: being delivered, or waiting for their next retry.
pub const ENV_CONCURRENCY: &str = "RUNR_QUEUE_CONCURRENCY";
const DEFAULT_CONCURRENCY: usize = 8;
const MAX_CONCURRENCY: usize = 1024;
/// Deliveries of one entry before it goes to the dead-letter stream.
pub const ENV_MAX_ATTEMPTS: &str = "RUNR_QUEUE_MAX_ATTEMPTS";
const DEFAULT_MAX_ATTEMPTS: u32 = 5;
const MAX_MAX_ATTEMPTS: u32 = 1000;
/// The first retry's delay; it doubles per retry, with equal jitter, up to [`ENV_BACKOFF_MAX`].
pub const ENV_BACKOFF: &str = "RUNR_QUEUE_BACKOFF";
const DEFAULT_BACKOFF: Duration = Duration::from_secs(1);
/// The longest retry delay (a 429's or 503's `Retry-After` may ask for more, and gets it).
pub const ENV_BACKOFF_MAX: &str = "RUNR_QUEUE_BACKOFF_MAX";
const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Time limit of one delivery: connecting, sending and the answer's status line and headers.
pub const ENV_TIMEOUT: &str = "RUNR_QUEUE_TIMEOUT";
/// Knative's default request timeout: a function's own timeout (`RUNR_TIMEOUT`, below it)
/// answers first, with its error class.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Entries pending this long on another consumer (one that is gone) are claimed and delivered
/// again.
pub const ENV_CLAIM_IDLE: &str = "RUNR_QUEUE_CLAIM_IDLE";
const DEFAULT_CLAIM_IDLE: Duration = Duration::from_secs(60);
/// Largest CloudEvent body (the entry's fields as JSON); a larger entry is dead-lettered at once
/// with `runr-error: limit`.
pub const ENV_MAX_BODY: &str = "RUNR_QUEUE_MAX_BODY";
/// The wrapper's own request limit (its `MAX_BODY`, 10 MiB): every entry the function accepts is
/// delivered, and one it would refuse with 413 never leaves the queue.
const DEFAULT_MAX_BODY: u64 = 10 << 20;
const MAX_BODY_RANGE: std::ops::RangeInclusive<u64> = 1024..=(64 << 20);
/// Answers dead-lettered after their first attempt instead of being retried: a comma-separated
/// list of the wrapper's error classes (`X-RunR-Error`) and HTTP statuses, e.g. `limit,400,422`.
/// Empty by default: every non-2xx answer is retried up to [`ENV_MAX_ATTEMPTS`], as the spec
/// says.
pub const ENV_DEAD_LETTER_AT_ONCE: &str = "RUNR_QUEUE_DEAD_LETTER_AT_ONCE";
/// The classes the wrapper sets in `X-RunR-Error` (its `ErrorClass`): a list naming anything
/// else holds a typo that would never match.
pub const WRAPPER_ERROR_CLASSES: &[&str] = &[
    "timeout",
    "crash",
    "start",
    "limit",
    "overload",
    "unavailable",
];
/// The dead-letter stream; `<stream>-dlq` when unset.
pub const ENV_DEAD_LETTER_STREAM: &str = "RUNR_QUEUE_DEAD_LETTER_STREAM";
/// Approximate length bound of the dead-letter stream (`XADD … MAXLEN ~ n`): Redis trims the
/// oldest dead letters once there are about this many. Unset: unbounded.
pub const ENV_DEAD_LETTER_MAXLEN: &str = "RUNR_QUEUE_DEAD_LETTER_MAXLEN";
const MAX_DEAD_LETTER_MAXLEN: u64 = 1 << 40;
/// Port of `/metrics` (Prometheus text format) and `/healthz` (whether Redis answers); unset:
/// no endpoint. 0 lets the kernel pick one (the log line names it).
pub const ENV_METRICS_PORT: &str = "RUNR_QUEUE_METRICS_PORT";
/// How long deliveries in flight may finish after SIGTERM.
pub const ENV_DRAIN: &str = "RUNR_QUEUE_DRAIN_TIMEOUT";
/// Below the kubelet's default grace period of 30 s, so we exit before SIGKILL.
const DEFAULT_DRAIN: Duration = Duration::from_secs(25);
/// Log level of the consumer's own lines.
pub const ENV_LOG: &str = "RUNR_QUEUE_LOG";
const DEFAULT_LOG: tracing::Level = tracing::Level::INFO;

const DAY: Duration = Duration::from_secs(24 * 60 * 60);
const MS: Duration = Duration::from_millis(1);

/// The variables table that `help` and `version` print.
pub const VARS: &[VarDoc] = &[
    VarDoc::required(
        ENV_REDIS_URL,
        "redis://[user:password@]host:port[/db], rediss:// (TLS, built-in roots), redis+sentinel://sentinel[,sentinel…]/service[/db] or redis+cluster://node[,node…] (rediss+cluster:// with TLS)",
    ),
    VarDoc::optional(
        ENV_REDIS_CA_FILE,
        "extra CA certificates for rediss://, PEM (the built-in roots stay trusted)",
    ),
    VarDoc::optional(
        ENV_REDIS_CERT_FILE,
        "client certificate for rediss:// (mutual TLS), PEM; with RUNR_QUEUE_REDIS_KEY_FILE",
    ),
    VarDoc::optional(
        ENV_REDIS_KEY_FILE,
        "the client certificate's private key, PEM (unencrypted)",
    ),
    VarDoc::required(ENV_STREAM, "the stream to consume"),
    VarDoc::required(
        ENV_GROUP,
        "the consumer group (created at RUNR_QUEUE_START with MKSTREAM when missing)",
    ),
    VarDoc::new(
        ENV_START,
        "$",
        "where a group created here starts: $ (new entries), 0 (the whole stream) or an entry id",
    ),
    VarDoc::new(
        ENV_CONSUMER,
        "$HOSTNAME",
        "this consumer's name in the group",
    ),
    VarDoc::optional(ENV_HOSTNAME, "the default consumer name (the pod's name)"),
    VarDoc::required(ENV_TARGET, "the function's URL, http://host[:port][/path]"),
    VarDoc::new(
        ENV_CONCURRENCY,
        "8",
        "entries in hand at once (delivering or waiting to retry), 1-1024",
    ),
    VarDoc::new(
        ENV_MAX_ATTEMPTS,
        "5",
        "deliveries per entry before the dead-letter stream <stream>-dlq, 1-1000",
    ),
    VarDoc::new(
        ENV_BACKOFF,
        "1s",
        "first retry delay; doubles per retry with equal jitter",
    ),
    VarDoc::new(
        ENV_BACKOFF_MAX,
        "60s",
        "longest retry delay (a 429's or 503's Retry-After may ask for more)",
    ),
    VarDoc::new(ENV_TIMEOUT, "5m", "time limit of one delivery"),
    VarDoc::new(
        ENV_CLAIM_IDLE,
        "60s",
        "claim entries pending this long on a consumer that is gone",
    ),
    VarDoc::new(
        ENV_MAX_BODY,
        "10MiB",
        "largest event body (fields as JSON), the wrapper's request limit; larger entries are dead-lettered",
    ),
    VarDoc::optional(
        ENV_DEAD_LETTER_AT_ONCE,
        "error classes and statuses dead-lettered without a retry, e.g. limit,400,422",
    ),
    VarDoc::new(
        ENV_DEAD_LETTER_STREAM,
        "<stream>-dlq",
        "the dead-letter stream",
    ),
    VarDoc::optional(
        ENV_DEAD_LETTER_MAXLEN,
        "approximate length bound of the dead-letter stream (XADD MAXLEN ~); unbounded when unset",
    ),
    VarDoc::optional(
        ENV_METRICS_PORT,
        "port of /metrics (Prometheus) and /healthz (whether Redis answers); off when unset",
    ),
    VarDoc::new(
        ENV_DRAIN,
        "25s",
        "how long in-flight deliveries may finish after SIGTERM",
    ),
    VarDoc::new(ENV_LOG, "info", "error | warn | info | debug"),
    // The span export: runr-base's exporter (the wrapper's), which reads these.
    VarDoc::optional(
        otlp::ENV_OTLP_ENDPOINT,
        "OTLP/HTTP collector: one span per delivery attempt to <endpoint>/v1/traces (default: no export)",
    ),
    VarDoc::optional(
        otlp::ENV_OTLP_TRACES_ENDPOINT,
        "OTLP/HTTP traces endpoint, used as it is",
    ),
    VarDoc::new(otlp::ENV_OTLP_PROTOCOL, "http/json", "http/json | http/protobuf"),
    VarDoc::optional(otlp::ENV_OTLP_TRACES_PROTOCOL, "traces-specific protocol"),
    VarDoc::optional(otlp::ENV_OTLP_HEADERS, "export headers: key=value,key2=value2"),
    VarDoc::optional(otlp::ENV_OTLP_TRACES_HEADERS, "traces-specific export headers"),
    VarDoc::new(
        otlp::ENV_OTLP_TIMEOUT,
        "10000",
        "per-export time limit, milliseconds",
    ),
    VarDoc::optional(otlp::ENV_OTLP_TRACES_TIMEOUT, "traces-specific export time limit"),
    VarDoc::new(
        otlp::ENV_SERVICE_NAME,
        "$K_SERVICE, else unknown_service:runr-queue",
        "service.name of the spans",
    ),
    VarDoc::optional(otlp::ENV_K_SERVICE, "Knative's service name"),
    VarDoc::new(
        otlp::ENV_BSP_SCHEDULE_DELAY,
        "5000",
        "longest wait of a span for its export batch, milliseconds",
    ),
    VarDoc::new(
        otlp::ENV_BSP_MAX_QUEUE_SIZE,
        "2048",
        "spans queued for export at most; more are dropped",
    ),
    VarDoc::new(
        otlp::ENV_BSP_MAX_EXPORT_BATCH_SIZE,
        "512",
        "spans per export request at most",
    ),
    VarDoc::optional(otlp::ENV_SDK_DISABLED, "true: no span export"),
];

/// Answers that retrying cannot fix, by the operator's word ([`ENV_DEAD_LETTER_AT_ONCE`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AtOnce {
    /// Error classes, lower case, from [`WRAPPER_ERROR_CLASSES`].
    pub classes: Vec<String>,
    /// Statuses, 300 to 599.
    pub statuses: Vec<u16>,
}

impl AtOnce {
    /// Whether an answer with `status` and the wrapper's `class` is dead-lettered at once.
    pub fn matches(&self, status: u16, class: Option<&str>) -> bool {
        self.statuses.contains(&status)
            || class.is_some_and(|c| self.classes.iter().any(|k| k == c))
    }
}

/// `limit,400,422`: classes and statuses, blanks around items ignored.
fn parse_at_once(v: &str) -> Result<AtOnce, String> {
    let mut out = AtOnce::default();
    for item in v.split(',').map(str::trim) {
        if item.is_empty() {
            return Err("an empty item: expected error classes and statuses separated by commas, e.g. limit,400,422".to_string());
        }
        if item.bytes().all(|b| b.is_ascii_digit()) {
            match item.parse::<u16>() {
                Ok(s @ 300..=599) if item.len() == 3 => out.statuses.push(s),
                _ => {
                    return Err(format!(
                        "{item:?} is not a status from 300 to 599 (a 2xx acknowledges the entry)"
                    ))
                }
            }
            continue;
        }
        let class = item.to_ascii_lowercase();
        if !WRAPPER_ERROR_CLASSES.contains(&class.as_str()) {
            return Err(format!(
                "{item:?} is neither a status nor one of the wrapper's error classes ({})",
                WRAPPER_ERROR_CLASSES.join(", ")
            ));
        }
        out.classes.push(class);
    }
    Ok(out)
}

/// Where the consumer finds Redis.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    url: String,
    /// The URL without its credentials, for logs.
    pub display: String,
    /// `rediss://`: TLS with the built-in roots.
    pub tls: bool,
    /// `redis+sentinel://…`: the master of a service, as the sentinels name it.
    pub sentinel: Option<SentinelUrl>,
    /// `redis+cluster://…` or `rediss+cluster://…`: the master of the stream's hash slot, as
    /// the cluster names it.
    pub cluster: Option<ClusterUrl>,
}

/// The cluster form: the nodes to ask first, and how to log in to any node.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterUrl {
    /// The nodes of the URL, `host` without brackets, port 6379 when not given.
    pub nodes: Vec<(String, u16)>,
    /// `user:password` as written in the URL (percent-encoded; never log it).
    userinfo: Option<String>,
    tls: bool,
}

impl ClusterUrl {
    /// A URL redis-rs reads for the node at `host:port`, with the credentials (never log it).
    pub fn node_url(&self, host: &str, port: u16) -> String {
        format!(
            "{}://{}{}/0",
            if self.tls { "rediss" } else { "redis" },
            self.userinfo
                .as_deref()
                .map(|u| format!("{u}@"))
                .unwrap_or_default(),
            host_port(host, port),
        )
    }
}

impl std::fmt::Debug for ClusterUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterUrl")
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

/// `host:port`, with brackets around an IPv6 host.
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The sentinel form: whom to ask, for which service, and how to log in to the master.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    /// The sentinels, `host` without brackets, port 26379 when not given.
    pub nodes: Vec<(String, u16)>,
    /// The service (`sentinel monitor <name> …`).
    pub service: String,
    /// `redis://[userinfo@]first-sentinel/db`: the credentials and database for the master, in
    /// a URL redis-rs decodes (never log it).
    master_login: String,
}

impl SentinelUrl {
    /// The credentials and database the master is logged in to with, as a URL redis-rs reads
    /// (its host is the first sentinel's and not used); never log it.
    pub fn master_login(&self) -> &str {
        &self.master_login
    }
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelUrl")
            .field("nodes", &self.nodes)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl RedisUrl {
    /// The URL as configured, credentials included (never log it).
    pub fn secret(&self) -> &str {
        &self.url
    }
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display)
    }
}

/// The function's address: the workspace's one plain-HTTP endpoint type and parser.
pub use runr_base::target::{redact, Target};

/// Everything runr-queue is configured with.
#[derive(Debug, Clone)]
pub struct Config {
    /// [`ENV_REDIS_URL`].
    pub redis: RedisUrl,
    /// [`ENV_REDIS_CA_FILE`]: its certificates, PEM, read at start.
    pub redis_ca: Option<Vec<u8>>,
    /// [`ENV_REDIS_CERT_FILE`] and [`ENV_REDIS_KEY_FILE`]: the client certificate and its key,
    /// PEM, read at start.
    pub redis_client: Option<(Vec<u8>, Vec<u8>)>,
    /// [`ENV_STREAM`].
    pub stream: String,
    /// [`ENV_GROUP`].
    pub group: String,
    /// [`ENV_START`]: `$`, `0` or an entry id, as Redis reads it in `XGROUP CREATE`.
    pub start: String,
    /// [`ENV_CONSUMER`].
    pub consumer: String,
    /// [`ENV_TARGET`].
    pub target: Target,
    /// [`ENV_CONCURRENCY`].
    pub concurrency: usize,
    /// [`ENV_MAX_ATTEMPTS`].
    pub max_attempts: u32,
    /// [`ENV_BACKOFF`].
    pub backoff: Duration,
    /// [`ENV_BACKOFF_MAX`].
    pub backoff_max: Duration,
    /// [`ENV_TIMEOUT`].
    pub timeout: Duration,
    /// [`ENV_CLAIM_IDLE`].
    pub claim_idle: Duration,
    /// [`ENV_MAX_BODY`], in bytes.
    pub max_body: usize,
    /// [`ENV_DEAD_LETTER_AT_ONCE`].
    pub at_once: AtOnce,
    /// [`ENV_DEAD_LETTER_STREAM`], `<stream>-dlq` when unset.
    pub dead_letters: String,
    /// [`ENV_DEAD_LETTER_MAXLEN`].
    pub dead_letter_maxlen: Option<u64>,
    /// [`ENV_METRICS_PORT`].
    pub metrics_port: Option<u16>,
    /// [`ENV_DRAIN`].
    pub drain: Duration,
    /// [`ENV_LOG`].
    pub log_level: tracing::Level,
    /// The delivery spans' export (`OTEL_EXPORTER_OTLP_ENDPOINT` and the other `OTEL_*`).
    pub otlp: Option<OtlpConfig>,
}

/// What a command needs of the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `run`: every required variable.
    Consumer,
    /// `create-group`, `redrive`: Redis, the stream and the group; no target, no consumer name
    /// (read and checked when set, placeholders when not).
    Admin,
}

/// The consumer name of the admin commands when none is set (they read no entries).
const ADMIN_CONSUMER: &str = "runr-queue-admin";

impl Config {
    /// Reads every variable through `get`; every bad one is an error in the result.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
        Self::for_role(get, Role::Consumer)
    }

    /// [`Config::from_lookup`] for `role`.
    pub fn for_role(
        get: &dyn Fn(&str) -> Option<String>,
        role: Role,
    ) -> Result<Config, ConfigErrors> {
        let mut env = Env::new(get);
        let redis = redis_url(&mut env);
        let redis_ca = env.optional(ENV_REDIS_CA_FILE, read_ca_file);
        if redis_ca.is_some() && redis.as_ref().is_some_and(|r| !r.tls) {
            let value = env.value(ENV_REDIS_CA_FILE);
            env.reject(
                ENV_REDIS_CA_FILE,
                value.as_deref(),
                format!("only used with rediss://, and {ENV_REDIS_URL} is redis://"),
            );
        }
        let cert = env.optional(ENV_REDIS_CERT_FILE, read_cert_file);
        let key = env.optional(ENV_REDIS_KEY_FILE, read_key_file);
        let redis_client = client_pair(&mut env, redis.as_ref(), cert, key);
        let stream = env.required(ENV_STREAM, parse_name);
        let group = env.required(ENV_GROUP, parse_name);
        let start = env.parse(ENV_START, DEFAULT_START.to_string(), parse_start);
        let consumer = match env.value(ENV_CONSUMER) {
            Some(v) => check_name(&mut env, ENV_CONSUMER, &v),
            None if role == Role::Admin => Some(ADMIN_CONSUMER.to_string()),
            None => match env.value(ENV_HOSTNAME) {
                Some(v) => check_name(&mut env, ENV_HOSTNAME, &v),
                None => {
                    env.reject(ENV_CONSUMER, None, "required when HOSTNAME is not set");
                    None
                }
            },
        };
        let target = match role {
            Role::Consumer => Target::required(&mut env, ENV_TARGET),
            Role::Admin => Target::optional(&mut env, ENV_TARGET)
                .or_else(|| Target::parse_url("http://localhost/").ok()),
        };
        let concurrency = env.count(ENV_CONCURRENCY, DEFAULT_CONCURRENCY, 1..=MAX_CONCURRENCY);
        let max_attempts = env.count(ENV_MAX_ATTEMPTS, DEFAULT_MAX_ATTEMPTS, 1..=MAX_MAX_ATTEMPTS);
        let backoff = env.duration_in(ENV_BACKOFF, DEFAULT_BACKOFF, MS..=Duration::from_secs(3600));
        let backoff_max = env.duration_in(ENV_BACKOFF_MAX, DEFAULT_BACKOFF_MAX, MS..=DAY);
        if backoff_max < backoff {
            let value = env.value(ENV_BACKOFF_MAX);
            env.reject(
                ENV_BACKOFF_MAX,
                Some(value.as_deref().unwrap_or(&display_duration(backoff_max))),
                format!(
                    "must be at least {ENV_BACKOFF} ({})",
                    display_duration(backoff)
                ),
            );
        }
        let timeout = env.duration_in(ENV_TIMEOUT, DEFAULT_TIMEOUT, MS..=DAY);
        let claim_idle = env.duration_in(
            ENV_CLAIM_IDLE,
            DEFAULT_CLAIM_IDLE,
            Duration::from_millis(100)..=DAY,
        );
        let max_body = env.size_in(ENV_MAX_BODY, DEFAULT_MAX_BODY, MAX_BODY_RANGE) as usize;
        let at_once = env.parse(ENV_DEAD_LETTER_AT_ONCE, AtOnce::default(), parse_at_once);
        let dead_letters = env.optional(ENV_DEAD_LETTER_STREAM, parse_name);
        let dead_letter_maxlen = env.optional(ENV_DEAD_LETTER_MAXLEN, |v| {
            runr_base::env::parse_count(v, &(1..=MAX_DEAD_LETTER_MAXLEN))
        });
        if let (Some(d), Some(s)) = (&dead_letters, &stream) {
            if d == s {
                env.reject(
                    ENV_DEAD_LETTER_STREAM,
                    Some(d),
                    format!("must not be the stream itself ({ENV_STREAM})"),
                );
            }
        }
        let dead_letters = dead_letters.or_else(|| stream.as_ref().map(|s| format!("{s}-dlq")));
        if redis.as_ref().is_some_and(|r| r.cluster.is_some()) {
            if let (Some(s), Some(d)) = (&stream, &dead_letters) {
                check_one_slot(&mut env, s, d);
            }
        }
        let metrics_port = env.optional(ENV_METRICS_PORT, |v| {
            v.trim()
                .parse::<u16>()
                .map_err(|_| "expected a port number from 0 to 65535".to_string())
        });
        let drain = env.duration_in(
            ENV_DRAIN,
            DEFAULT_DRAIN,
            Duration::ZERO..=Duration::from_secs(3600),
        );
        let log_level = env.level(ENV_LOG, DEFAULT_LOG);
        let otlp = otlp::from_env(&mut env, "runr-queue");

        let value = (|| {
            Some(Config {
                redis: redis?,
                redis_ca,
                redis_client,
                stream: stream?,
                group: group?,
                start,
                consumer: consumer?,
                target: target?,
                concurrency,
                max_attempts,
                backoff,
                backoff_max,
                timeout,
                claim_idle,
                max_body,
                at_once,
                dead_letters: dead_letters?,
                dead_letter_maxlen,
                metrics_port,
                drain,
                log_level,
                otlp,
            })
        })();
        env.finish_with(value)
    }

    /// The dead-letter stream, [`ENV_DEAD_LETTER_STREAM`] or `<stream>-dlq`.
    pub fn dead_letter_stream(&self) -> String {
        self.dead_letters.clone()
    }
}

/// In a Redis Cluster, a dead letter moves (and a redrive moves it back) in one `MULTI`, which
/// Redis runs only on keys of one hash slot: the stream and its dead-letter stream must share one.
fn check_one_slot(env: &mut Env<'_>, stream: &str, dead_letters: &str) {
    let (a, b) = (key_slot(stream), key_slot(dead_letters));
    if a == b {
        return;
    }
    // A name that works: the stream's own hash tag, or the stream's whole name as the tag.
    let tag = match stream.find('{').and_then(|o| {
        let len = stream[o + 1..].find('}')?;
        (len > 0).then(|| &stream[o..o + len + 2])
    }) {
        Some(tag) => tag.to_string(),
        None => format!("{{{stream}}}"),
    };
    let suggestion = format!("{tag}-dlq");
    let example = if key_slot(&suggestion) == a {
        format!(", e.g. {ENV_DEAD_LETTER_STREAM}={suggestion}")
    } else {
        String::new()
    };
    let value = env.value(ENV_DEAD_LETTER_STREAM);
    env.reject(
        ENV_DEAD_LETTER_STREAM,
        Some(value.as_deref().unwrap_or(dead_letters)),
        format!(
            "in a Redis Cluster it must be in the hash slot of {ENV_STREAM}={stream} \
             (slot {b}, the stream's is {a}; a dead letter moves in one MULTI): give both names \
             one {{…}} hash tag{example}"
        ),
    );
}

/// [`ENV_START`]: `$`, `0`, or an entry id `<ms>[-<seq>]`.
pub fn parse_start(v: &str) -> Result<String, String> {
    if v == "$" || v == "0" {
        return Ok(v.to_string());
    }
    let number = |s: &str| {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && s.parse::<u64>().is_ok()
    };
    let ok = match v.split_once('-') {
        Some((ms, seq)) => number(ms) && number(seq),
        None => number(v),
    };
    if ok {
        Ok(v.to_string())
    } else {
        Err("expected $ (new entries only), 0 (the whole stream) or an entry id such as 1700000000000-0".to_string())
    }
}

/// Reads [`ENV_REDIS_URL`] by hand: a bad value is reported without its password.
fn redis_url(env: &mut Env<'_>) -> Option<RedisUrl> {
    let Some(url) = env.value(ENV_REDIS_URL) else {
        env.reject(ENV_REDIS_URL, None, "required");
        return None;
    };
    match parse_redis_url(&url) {
        Ok(r) => Some(r),
        Err(reason) => {
            let shown = redact(&url);
            env.reject(ENV_REDIS_URL, Some(&shown), reason);
            None
        }
    }
}

const REDIS_FORMS: &str =
    "expected redis://[user:password@]host:port[/db], rediss://[user:password@]host:port[/db], redis+sentinel://[user:password@]host:port[,host:port…]/service[/db] or redis+cluster://[user:password@]host:port[,host:port…] (rediss+cluster:// with TLS)";

/// The port of a sentinel when the URL names none.
const SENTINEL_PORT: u16 = 26379;
/// The port of a cluster node when the URL names none.
const CLUSTER_PORT: u16 = 6379;

/// `redis://[user:password@]host[:port][/db]` or `rediss://…`; redis-rs parses it once more when
/// connecting, and must accept what this accepts. No reason quotes a part of the URL: in a URL
/// that is not what the operator meant, any part may be a piece of the password.
pub fn parse_redis_url(url: &str) -> Result<RedisUrl, String> {
    if let Some(rest) = url.strip_prefix("redis+sentinel://") {
        return parse_sentinel_url(url, rest);
    }
    if let Some(rest) = url.strip_prefix("redis+cluster://") {
        return parse_cluster_url(url, rest, false);
    }
    if let Some(rest) = url.strip_prefix("rediss+cluster://") {
        return parse_cluster_url(url, rest, true);
    }
    let (tls, rest) = if let Some(rest) = url.strip_prefix("redis://") {
        (false, rest)
    } else if let Some(rest) = url.strip_prefix("rediss://") {
        (true, rest)
    } else {
        return Err(REDIS_FORMS.to_string());
    };
    let (_, location) = split_userinfo(rest)?;
    if location.contains('#') {
        // redis-rs reads `#insecure` as "do not verify the certificate": never from here.
        return Err(format!("a fragment (#…) is not allowed: {REDIS_FORMS}"));
    }
    let (host_port, path) = match location.find(['/', '?']) {
        Some(i) => location.split_at(i),
        None => (location, ""),
    };
    let (host, port) = split_host_port(host_port)?;
    if host.is_empty() {
        return Err(format!("no host: {REDIS_FORMS}"));
    }
    if let Some(p) = port {
        runr_base::env::parse_port(p)
            .map_err(|_| format!("the port is not a number from 1 to 65535: {REDIS_FORMS}"))?;
    }
    let db = path.split('?').next().unwrap_or("").trim_start_matches('/');
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Err(format!("the database is not a number: {REDIS_FORMS}"));
    }
    if let Err(e) = redis::IntoConnectionInfo::into_connection_info(url) {
        // Only the category: redis-rs's detail may quote the URL, password and all.
        return Err(format!("not a Redis URL ({}): {REDIS_FORMS}", e.category()));
    }
    Ok(RedisUrl {
        url: url.to_string(),
        display: redact(url),
        tls,
        sentinel: None,
        cluster: None,
    })
}

/// `redis+sentinel://[user:password@]host[:port][,host[:port]…]/service[/db]` (the form of the
/// Python `Redis-Sentinel-Url` package and of Prefect; redis-rs documents none and takes the
/// sentinels' addresses as a list): the credentials and the database are the master's, the
/// sentinels are asked without them.
fn parse_sentinel_url(url: &str, rest: &str) -> Result<RedisUrl, String> {
    let (userinfo, location) = split_userinfo(rest)?;
    if location.contains(['?', '#']) {
        return Err(format!(
            "no query (?…) or fragment (#…) in a sentinel URL: {REDIS_FORMS}"
        ));
    }
    let (hosts, path) = location.split_once('/').unwrap_or((location, ""));
    let nodes = parse_nodes(hosts, SENTINEL_PORT, "a sentinel")?;
    let (service, db) = path.split_once('/').unwrap_or((path, ""));
    if service.is_empty() || !service.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "no service name after the sentinels (visible ASCII): {REDIS_FORMS}"
        ));
    }
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Err(format!("the database is not a number: {REDIS_FORMS}"));
    }
    let (first_host, first_port) = &nodes[0];
    let first = host_port(first_host, *first_port);
    let master_login = format!(
        "redis://{}{first}/{}",
        userinfo.map(|u| format!("{u}@")).unwrap_or_default(),
        if db.is_empty() { "0" } else { db },
    );
    if let Err(e) = redis::IntoConnectionInfo::into_connection_info(master_login.as_str()) {
        // Only the category: redis-rs's detail may quote the URL, password and all.
        return Err(format!("not a Redis URL ({}): {REDIS_FORMS}", e.category()));
    }
    Ok(RedisUrl {
        url: url.to_string(),
        display: redact(url),
        tls: false,
        sentinel: Some(SentinelUrl {
            nodes,
            service: service.to_string(),
            master_login,
        }),
        cluster: None,
    })
}

/// What follows `scheme://`, split into the credentials and the rest. The credentials end at the
/// last `@` (as the URL parser redis-rs uses reads them, and as [`redact`] cuts them off); a
/// `/ ? #` before it would end the authority early and leave the rest of the password in the
/// host or the path, so it is refused.
fn split_userinfo(rest: &str) -> Result<(Option<&str>, &str), String> {
    let (userinfo, location) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    if userinfo.is_some_and(|u| u.contains(['/', '?', '#'])) {
        return Err(format!(
            "the user name or password holds a raw / ? or #: percent-encode them (%2F %3F %23): {REDIS_FORMS}"
        ));
    }
    Ok((userinfo, location))
}

/// `host[:port][,host[:port]…]`: `what` (a sentinel, a node) names the part in the error.
fn parse_nodes(hosts: &str, default_port: u16, what: &str) -> Result<Vec<(String, u16)>, String> {
    let mut nodes = Vec::new();
    for node in hosts.split(',') {
        let (host, port) = split_host_port(node)?;
        if host.is_empty() {
            return Err(format!("{what} without a host: {REDIS_FORMS}"));
        }
        let port = match port {
            Some(p) => runr_base::env::parse_port(p)
                .map_err(|_| format!("the port is not a number from 1 to 65535: {REDIS_FORMS}"))?,
            None => default_port,
        };
        nodes.push((host.to_string(), port));
    }
    Ok(nodes)
}

/// `redis+cluster://[user:password@]host[:port][,host[:port]…][/0]` (the node list of
/// redis-rs's cluster client, KEDA's `addresses` and Dapr's `redisHost`, in one URL);
/// `rediss+cluster://` with TLS. Any node will do: the consumer asks it which master serves
/// the stream's hash slot. A cluster has only database 0.
fn parse_cluster_url(url: &str, rest: &str, tls: bool) -> Result<RedisUrl, String> {
    let (userinfo, location) = split_userinfo(rest)?;
    if location.contains(['?', '#']) {
        return Err(format!(
            "no query (?…) or fragment (#…) in a cluster URL: {REDIS_FORMS}"
        ));
    }
    let (hosts, path) = location.split_once('/').unwrap_or((location, ""));
    let nodes = parse_nodes(hosts, CLUSTER_PORT, "a node")?;
    if !matches!(path, "" | "0") {
        return Err(format!(
            "a Redis Cluster has only database 0: no database in a cluster URL: {REDIS_FORMS}"
        ));
    }
    let cluster = ClusterUrl {
        nodes,
        userinfo: userinfo.map(str::to_string),
        tls,
    };
    let (host, port) = &cluster.nodes[0];
    if let Err(e) = redis::IntoConnectionInfo::into_connection_info(cluster.node_url(host, *port)) {
        // Only the category: redis-rs's detail may quote the URL, password and all.
        return Err(format!("not a Redis URL ({}): {REDIS_FORMS}", e.category()));
    }
    Ok(RedisUrl {
        url: url.to_string(),
        display: redact(url),
        tls,
        sentinel: None,
        cluster: Some(cluster),
    })
}

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of the key, or of what its first
/// `{…}` holds when that is not empty, modulo 16384 (the cluster specification's rule).
pub fn key_slot(key: &str) -> u16 {
    let key = key.as_bytes();
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let tag = &key[open + 1..];
            let len = tag.iter().position(|&b| b == b'}')?;
            (len > 0).then(|| &tag[..len])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % 16384
}

/// The CA file's contents: readable, and at least one PEM certificate in it.
fn read_ca_file(path: &str) -> Result<Vec<u8>, String> {
    use rustls::pki_types::pem::PemObject;
    let data = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(&data)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM certificates: {e:?}"))?;
    if certs.is_empty() {
        return Err("no PEM certificate in it".to_string());
    }
    Ok(data)
}

/// A client certificate file: readable, and at least one PEM certificate in it.
fn read_cert_file(path: &str) -> Result<Vec<u8>, String> {
    read_ca_file(path)
}

/// A private key file: readable, and one PEM private key in it.
fn read_key_file(path: &str) -> Result<Vec<u8>, String> {
    use rustls::pki_types::pem::PemObject;
    let data = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
    rustls::pki_types::PrivateKeyDer::from_pem_slice(&data)
        .map_err(|_| "no unencrypted PEM private key (PKCS#8, SEC1 or PKCS#1) in it".to_string())?;
    Ok(data)
}

/// Both files or neither, and only with `rediss://`.
fn client_pair(
    env: &mut Env<'_>,
    redis: Option<&RedisUrl>,
    cert: Option<Vec<u8>>,
    key: Option<Vec<u8>>,
) -> Option<(Vec<u8>, Vec<u8>)> {
    let (cert_set, key_set) = (
        env.value(ENV_REDIS_CERT_FILE).is_some(),
        env.value(ENV_REDIS_KEY_FILE).is_some(),
    );
    if cert_set != key_set {
        let (name, other) = if cert_set {
            (ENV_REDIS_KEY_FILE, ENV_REDIS_CERT_FILE)
        } else {
            (ENV_REDIS_CERT_FILE, ENV_REDIS_KEY_FILE)
        };
        env.reject(name, None, format!("required when {other} is set"));
        return None;
    }
    if cert_set && redis.is_some_and(|r| !r.tls) {
        let value = env.value(ENV_REDIS_CERT_FILE);
        env.reject(
            ENV_REDIS_CERT_FILE,
            value.as_deref(),
            format!("only used with rediss://, and {ENV_REDIS_URL} is redis://"),
        );
        return None;
    }
    Some((cert?, key?))
}

/// `host:port`, `[v6]:port`, `host`: the host and the port text, if any.
fn split_host_port(s: &str) -> Result<(&str, Option<&str>), String> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, tail) = rest
            .split_once(']')
            .ok_or_else(|| format!("unclosed [ in the host: {REDIS_FORMS}"))?;
        return match tail.strip_prefix(':') {
            Some(p) => Ok((host, Some(p))),
            None if tail.is_empty() => Ok((host, None)),
            None => Err(REDIS_FORMS.to_string()),
        };
    }
    Ok(match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    })
}

/// Stream, group and consumer names go into header values (`ce-source`) and log lines: visible
/// ASCII, no spaces, at most 200 bytes.
fn parse_name(v: &str) -> Result<String, String> {
    if v.len() > 200 {
        return Err("at most 200 characters".to_string());
    }
    if !v.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("only visible ASCII characters (no spaces or control characters)".to_string());
    }
    Ok(v.to_string())
}

fn check_name(env: &mut Env<'_>, name: &'static str, value: &str) -> Option<String> {
    match parse_name(value) {
        Ok(v) => Some(v),
        Err(reason) => {
            env.reject(name, Some(value), reason);
            None
        }
    }
}

/// `ConfigError`s as the lines `main` prints: one per bad variable.
pub fn error_lines(errors: &ConfigErrors) -> Vec<String> {
    errors.0.iter().map(ConfigError::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use runr_base::env::{names_read, unlisted};
    use std::collections::HashMap;

    const GOOD: &[(&str, &str)] = &[
        (ENV_REDIS_URL, "redis://127.0.0.1:6379"),
        (ENV_STREAM, "orders"),
        (ENV_GROUP, "orders-api"),
        (ENV_TARGET, "http://orders.fn.svc.cluster.local"),
        (ENV_HOSTNAME, "runr-queue-7d9f-abcde"),
    ];

    fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
        Config::from_lookup(&runr_base::env::pairs_lookup(vars))
    }

    fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut v: Vec<_> = GOOD
            .iter()
            .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
            .copied()
            .collect();
        v.extend_from_slice(extra);
        v
    }

    #[test]
    fn defaults() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.redis.display, "redis://127.0.0.1:6379");
        assert!(!c.redis.tls);
        assert_eq!(c.stream, "orders");
        assert_eq!(c.group, "orders-api");
        assert_eq!(c.consumer, "runr-queue-7d9f-abcde");
        assert_eq!(c.target.host, "orders.fn.svc.cluster.local");
        assert_eq!(c.target.port, 80);
        assert_eq!(c.target.path, "/");
        assert_eq!(c.target.authority, "orders.fn.svc.cluster.local");
        assert_eq!(c.concurrency, 8);
        assert_eq!(c.max_attempts, 5);
        assert_eq!(c.backoff, Duration::from_secs(1));
        assert_eq!(c.backoff_max, Duration::from_secs(60));
        assert_eq!(c.timeout, Duration::from_secs(300));
        assert_eq!(c.claim_idle, Duration::from_secs(60));
        // The wrapper's request limit: what the function accepts, the queue delivers.
        assert_eq!(c.max_body, 10 << 20);
        assert_eq!(c.at_once, AtOnce::default());
        assert_eq!(c.drain, Duration::from_secs(25));
        assert_eq!(c.log_level, tracing::Level::INFO);
        assert_eq!(c.dead_letter_stream(), "orders-dlq");
        assert_eq!(c.dead_letter_maxlen, None);
        assert_eq!(c.metrics_port, None);
        assert_eq!(
            parse(&with(&[(ENV_METRICS_PORT, "9090")]))
                .unwrap()
                .metrics_port,
            Some(9090)
        );
        assert_eq!(
            parse(&with(&[(ENV_METRICS_PORT, "http")]))
                .unwrap_err()
                .names(),
            [ENV_METRICS_PORT]
        );
    }

    #[test]
    fn everything_set() {
        let c = parse(&with(&[
            (ENV_REDIS_URL, "rediss://app:s3cret@redis.example:6380/2"),
            (ENV_CONSUMER, "c1"),
            (ENV_TARGET, "http://127.0.0.1:8080/queue?x=1"),
            (ENV_CONCURRENCY, "32"),
            (ENV_MAX_ATTEMPTS, "3"),
            (ENV_BACKOFF, "200ms"),
            (ENV_BACKOFF_MAX, "2s"),
            (ENV_TIMEOUT, "10s"),
            (ENV_CLAIM_IDLE, "1s"),
            (ENV_MAX_BODY, "64KiB"),
            (ENV_DEAD_LETTER_AT_ONCE, " limit, 400 ,422,Crash"),
            (ENV_DRAIN, "0"),
            (ENV_LOG, "debug"),
        ]))
        .unwrap();
        assert!(c.redis.tls);
        assert_eq!(c.redis.display, "rediss://***@redis.example:6380/2");
        assert_eq!(c.redis.secret(), "rediss://app:s3cret@redis.example:6380/2");
        assert_eq!(
            format!("{:?}", c.redis),
            "rediss://***@redis.example:6380/2"
        );
        assert_eq!(c.consumer, "c1");
        assert_eq!(c.target.port, 8080);
        assert_eq!(c.target.path, "/queue?x=1");
        assert_eq!(c.target.authority, "127.0.0.1:8080");
        assert_eq!(c.target.to_string(), "http://127.0.0.1:8080/queue?x=1");
        assert_eq!(c.concurrency, 32);
        assert_eq!(c.max_attempts, 3);
        assert_eq!(c.backoff, Duration::from_millis(200));
        assert_eq!(c.backoff_max, Duration::from_secs(2));
        assert_eq!(c.timeout, Duration::from_secs(10));
        assert_eq!(c.claim_idle, Duration::from_secs(1));
        assert_eq!(c.max_body, 64 << 10);
        assert_eq!(
            c.at_once,
            AtOnce {
                classes: vec!["limit".into(), "crash".into()],
                statuses: vec![400, 422],
            }
        );
        assert_eq!(c.drain, Duration::ZERO);
        assert_eq!(c.log_level, tracing::Level::DEBUG);
    }

    #[test]
    fn every_bad_variable_is_named_once() {
        let errors = parse(&[
            (ENV_REDIS_URL, "http://u:hunter2@host:6379"),
            (ENV_STREAM, "has space"),
            (ENV_TARGET, "https://fn.example"),
            (ENV_CONCURRENCY, "0"),
            (ENV_MAX_ATTEMPTS, "many"),
            (ENV_BACKOFF, "5m"),
            (ENV_BACKOFF_MAX, "1m"),
            (ENV_TIMEOUT, "soon"),
            (ENV_CLAIM_IDLE, "10ms"),
            (ENV_MAX_BODY, "100"),
            (ENV_DEAD_LETTER_AT_ONCE, "limit,limt"),
            (ENV_DRAIN, "2h"),
            (ENV_LOG, "loud"),
        ])
        .unwrap_err();
        assert_eq!(
            errors.names(),
            [
                ENV_REDIS_URL,
                ENV_STREAM,
                ENV_GROUP,
                ENV_CONSUMER,
                ENV_TARGET,
                ENV_CONCURRENCY,
                ENV_MAX_ATTEMPTS,
                ENV_BACKOFF_MAX,
                ENV_TIMEOUT,
                ENV_CLAIM_IDLE,
                ENV_MAX_BODY,
                ENV_DEAD_LETTER_AT_ONCE,
                ENV_DRAIN,
                ENV_LOG,
            ]
        );
        let lines = error_lines(&errors);
        assert_eq!(lines.len(), 14);
        // The password never shows, not even in the error about the URL it is in.
        assert!(lines.iter().all(|l| !l.contains("hunter2")), "{lines:?}");
        assert!(
            lines[0]
                .starts_with(r#"RUNR_QUEUE_REDIS_URL="http://***@host:6379": expected redis://"#),
            "{}",
            lines[0]
        );
        assert_eq!(
            lines[3],
            "RUNR_QUEUE_CONSUMER=<unset>: required when HOSTNAME is not set"
        );
        assert!(lines[4].contains("https is not supported"), "{}", lines[4]);
        assert_eq!(
            lines[7],
            r#"RUNR_QUEUE_BACKOFF_MAX="1m": must be at least RUNR_QUEUE_BACKOFF (5m)"#
        );
    }

    #[test]
    fn dead_letter_streams() {
        let c = parse(&with(&[
            (ENV_DEAD_LETTER_STREAM, "{orders}-parked"),
            (ENV_DEAD_LETTER_MAXLEN, "10000"),
        ]))
        .unwrap();
        assert_eq!(c.dead_letter_stream(), "{orders}-parked");
        assert_eq!(c.dead_letter_maxlen, Some(10000));
        for (name, bad, reason) in [
            (
                ENV_DEAD_LETTER_STREAM,
                "orders",
                "must not be the stream itself",
            ),
            (ENV_DEAD_LETTER_STREAM, "a b", "only visible ASCII"),
            (
                ENV_DEAD_LETTER_MAXLEN,
                "0",
                "expected a whole number from 1",
            ),
            (
                ENV_DEAD_LETTER_MAXLEN,
                "many",
                "expected a whole number from 1",
            ),
        ] {
            let errors = parse(&with(&[(name, bad)])).unwrap_err();
            assert_eq!(errors.names(), [name], "{bad:?}");
            assert!(errors.to_string().contains(reason), "{errors}");
        }
    }

    #[test]
    fn cluster_urls() {
        let u =
            parse_redis_url("redis+cluster://app:s%2F3cret@10.0.0.1:7000,[::1],n3.example:7002")
                .unwrap();
        assert_eq!(
            u.display,
            "redis+cluster://***@10.0.0.1:7000,[::1],n3.example:7002"
        );
        assert!(!u.tls && u.sentinel.is_none());
        let c = u.cluster.as_ref().unwrap();
        assert_eq!(
            c.nodes,
            [
                ("10.0.0.1".to_string(), 7000),
                ("::1".to_string(), 6379),
                ("n3.example".to_string(), 7002)
            ]
        );
        let debug = format!("{c:?} {u:?}");
        assert!(!debug.contains("3cret"), "{debug}");
        let node =
            redis::IntoConnectionInfo::into_connection_info(c.node_url("::1", 7001)).unwrap();
        assert_eq!(node.redis_settings().password(), Some("s/3cret"));
        assert_eq!(node.redis_settings().username(), Some("app"));
        assert_eq!(node.redis_settings().db(), 0);
        assert_eq!(
            c.node_url("::1", 7001),
            "redis://app:s%2F3cret@[::1]:7001/0"
        );
        let tls = parse_redis_url("rediss+cluster://h/0").unwrap();
        assert!(tls.tls);
        assert_eq!(
            tls.cluster.as_ref().unwrap().node_url("h", 1),
            "rediss://h:1/0"
        );
        assert!(parse_redis_url("redis://h:1").unwrap().cluster.is_none());
        for (bad, why) in [
            ("redis+cluster://h:1,,h:2", "a node without a host"),
            ("redis+cluster://h:0", "the port is not a number"),
            ("redis+cluster://h:1/2", "only database 0"),
            ("redis+cluster://h:1/?x=1", "no query"),
            ("redis+cluster://u:p/w@h:1", "percent-encode"),
            ("redis+cluster://", "a node without a host"),
        ] {
            let e = parse_redis_url(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn hash_slots_match_the_cluster_specification() {
        // The specification's own examples, and the hash tag rules (first `{`, non-empty).
        assert_eq!(key_slot("123456789"), 12739);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        assert_eq!(key_slot("foo{}{bar}"), key_slot("foo{}{bar}"));
        assert_ne!(key_slot("foo{}{bar}"), key_slot("bar"));
        assert_eq!(key_slot("foo{{bar}}zap"), key_slot("{bar"));
        assert_eq!(key_slot("foo{bar}{zap}"), key_slot("bar"));
        for key in ["orders", "{orders}", "a{b}c", "{}x", "x{", "é{ü}"] {
            assert_eq!(
                key_slot(key),
                runr_testkit::redis::key_slot(key.as_bytes()),
                "{key}"
            );
        }
    }

    #[test]
    fn a_cluster_needs_the_dead_letters_in_the_streams_slot() {
        let cluster = [(ENV_REDIS_URL, "redis+cluster://10.0.0.1:7000,10.0.0.2:7000")];
        // The default `<stream>-dlq` of a stream with a hash tag shares its slot.
        let c = parse(&with(&[cluster[0], (ENV_STREAM, "{orders}")])).unwrap();
        assert_eq!(c.dead_letter_stream(), "{orders}-dlq");
        let c = parse(&with(&[
            cluster[0],
            (ENV_DEAD_LETTER_STREAM, "{orders}-parked"),
        ]))
        .unwrap();
        assert_eq!(c.dead_letter_stream(), "{orders}-parked");
        // Standalone Redis does not care.
        assert!(parse(&with(&[(ENV_DEAD_LETTER_STREAM, "parked")])).is_ok());
        for (stream, dead_letters, example) in [
            ("orders", None, Some("{orders}-dlq")),
            ("orders", Some("parked"), Some("{orders}-dlq")),
            ("jobs{eu}", Some("{us}-dlq"), Some("{eu}-dlq")),
            ("{}x", None, None),
        ] {
            let mut vars = with(&[cluster[0], (ENV_STREAM, stream)]);
            if let Some(d) = dead_letters {
                vars.push((ENV_DEAD_LETTER_STREAM, d));
            }
            let errors = parse(&vars).unwrap_err();
            assert_eq!(errors.names(), [ENV_DEAD_LETTER_STREAM], "{stream}");
            let text = errors.to_string();
            assert!(
                text.contains("RUNR_QUEUE_STREAM=") && text.contains("hash slot"),
                "{text}"
            );
            match example {
                Some(e) => {
                    assert!(
                        text.contains(&format!("e.g. RUNR_QUEUE_DEAD_LETTER_STREAM={e}")),
                        "{text}"
                    );
                    assert_eq!(key_slot(e), key_slot(stream), "{e}");
                }
                None => assert!(!text.contains("e.g."), "{text}"),
            }
        }
    }

    #[test]
    fn starts() {
        assert_eq!(parse(GOOD).unwrap().start, "$");
        for good in ["$", "0", "1700000000000", "1700000000000-0", "0-1"] {
            let c = parse(&with(&[(ENV_START, good)])).unwrap();
            assert_eq!(c.start, good);
        }
        for bad in [
            "now",
            "-1",
            "1-",
            "-0",
            "1-2-3",
            "$0",
            "99999999999999999999999",
        ] {
            let errors = parse(&with(&[(ENV_START, bad)])).unwrap_err();
            assert_eq!(errors.names(), [ENV_START], "{bad:?}");
            assert!(
                errors.to_string().contains("expected $ (new entries only)"),
                "{errors}"
            );
        }
    }

    #[test]
    fn the_admin_commands_need_no_target_or_consumer() {
        let vars = [
            (ENV_REDIS_URL, "redis://127.0.0.1:6379"),
            (ENV_STREAM, "orders"),
            (ENV_GROUP, "orders-api"),
        ];
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = move |n: &str| map.get(n).cloned();
        let c = Config::for_role(&get, Role::Admin).unwrap();
        assert_eq!(c.consumer, ADMIN_CONSUMER);
        assert_eq!(
            Config::for_role(&get, Role::Consumer).unwrap_err().names(),
            [ENV_CONSUMER, ENV_TARGET]
        );
        // Set, they are still checked.
        let bad = |n: &str| {
            (n == ENV_TARGET)
                .then(|| "ftp://x".to_string())
                .or_else(|| get(n))
        };
        let errors = Config::for_role(&bad, Role::Admin).unwrap_err();
        assert_eq!(errors.names(), [ENV_TARGET]);
    }

    #[test]
    fn ca_files() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("ca.pem");
        let bundle = crate::roots::pem_bundle();
        let first = bundle
            .split_inclusive("-----END CERTIFICATE-----\n")
            .next()
            .unwrap();
        std::fs::write(&good, first).unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let (good, junk) = (good.to_str().unwrap(), junk.to_str().unwrap());
        let parse_with = |url: &str, file: &str| {
            let mut vars: HashMap<String, String> = GOOD
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            vars.insert(ENV_REDIS_URL.into(), url.into());
            vars.insert(ENV_REDIS_CA_FILE.into(), file.into());
            Config::from_lookup(&move |n: &str| vars.get(n).cloned())
        };
        let c = parse_with("rediss://redis.example:6380", good).unwrap();
        assert_eq!(c.redis_ca.as_deref(), Some(first.as_bytes()));
        assert_eq!(parse(GOOD).unwrap().redis_ca, None);
        for (url, file, reason) in [
            ("rediss://h:1", "/nonexistent/ca.pem", "cannot read it"),
            ("rediss://h:1", junk, "no PEM certificate in it"),
            ("redis://h:1", good, "only used with rediss://"),
        ] {
            let errors = parse_with(url, file).unwrap_err();
            assert_eq!(errors.names(), [ENV_REDIS_CA_FILE]);
            assert!(errors.to_string().contains(reason), "{errors}");
        }
    }

    #[test]
    fn client_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = crate::roots::pem_bundle();
        let cert = bundle
            .split_inclusive("-----END CERTIFICATE-----\n")
            .next()
            .unwrap();
        let cert_path = dir.path().join("client.pem");
        std::fs::write(&cert_path, cert).unwrap();
        // A throwaway PKCS#8 P-256 key (`openssl genpkey`); that it matches the certificate is
        // the TLS handshake's business.
        let key = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgeKWY/n4QYUzwon4z\nrZ/nOHXA/g6t2wAAssjw/vTu+OihRANCAASQgFX3Flv1TbUb3whnjWho4Q0LJJwi\nGiO1ejHQukPs3nDvN4NDZ1xcP1ccm/jEcp+XplS0HRzgWEvGosxrj/TG\n-----END PRIVATE KEY-----\n";
        let key_path = dir.path().join("client.key");
        std::fs::write(&key_path, key).unwrap();
        let junk = dir.path().join("junk");
        std::fs::write(&junk, "nothing\n").unwrap();
        let (c, k, j) = (
            cert_path.to_str().unwrap(),
            key_path.to_str().unwrap(),
            junk.to_str().unwrap(),
        );
        let parse_with = |url: &str, files: &[(&'static str, &str)]| {
            let mut vars: HashMap<String, String> = GOOD
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            vars.insert(ENV_REDIS_URL.into(), url.into());
            for (n, v) in files {
                vars.insert(n.to_string(), v.to_string());
            }
            Config::from_lookup(&move |n: &str| vars.get(n).cloned())
        };
        let ok = parse_with(
            "rediss://h:1",
            &[(ENV_REDIS_CERT_FILE, c), (ENV_REDIS_KEY_FILE, k)],
        )
        .unwrap();
        assert_eq!(
            ok.redis_client,
            Some((cert.as_bytes().to_vec(), key.as_bytes().to_vec()))
        );
        assert_eq!(parse(GOOD).unwrap().redis_client, None);
        for (url, files, name, reason) in [
            (
                "rediss://h:1",
                vec![(ENV_REDIS_CERT_FILE, c)],
                ENV_REDIS_KEY_FILE,
                "required when RUNR_QUEUE_REDIS_CERT_FILE is set",
            ),
            (
                "rediss://h:1",
                vec![(ENV_REDIS_KEY_FILE, k)],
                ENV_REDIS_CERT_FILE,
                "required when RUNR_QUEUE_REDIS_KEY_FILE is set",
            ),
            (
                "redis://h:1",
                vec![(ENV_REDIS_CERT_FILE, c), (ENV_REDIS_KEY_FILE, k)],
                ENV_REDIS_CERT_FILE,
                "only used with rediss://",
            ),
            (
                "rediss://h:1",
                vec![(ENV_REDIS_CERT_FILE, c), (ENV_REDIS_KEY_FILE, j)],
                ENV_REDIS_KEY_FILE,
                "no unencrypted PEM private key",
            ),
            (
                "rediss://h:1",
                vec![(ENV_REDIS_CERT_FILE, j), (ENV_REDIS_KEY_FILE, k)],
                ENV_REDIS_CERT_FILE,
                "no PEM certificate",
            ),
        ] {
            let errors = parse_with(url, &files).unwrap_err();
            assert_eq!(errors.names(), [name], "{files:?}");
            assert!(errors.to_string().contains(reason), "{errors}");
        }
    }

    #[test]
    fn redis_urls() {
        for good in [
            "redis://localhost",
            "redis://localhost:6379",
            "redis://:pw@localhost:6379/0",
            "redis://user:pw@10.0.0.1:6379/15",
            "rediss://redis.example:6380",
            "redis://[::1]:6379",
        ] {
            assert!(parse_redis_url(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "localhost:6379",
            "redis://",
            "redis://:6379",
            "redis://host:0",
            "redis://host:99999",
            "redis://host:6379/db1",
            "rediss://host:6380#insecure",
            "unix:///tmp/redis.sock",
            "redis+unix:///tmp/redis.sock",
            "redis://[::1",
        ] {
            assert!(parse_redis_url(bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(redact("redis://a:b@h:1/2"), "redis://***@h:1/2");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        // An `@` anywhere: everything before it may be a credential.
        assert_eq!(redact("redis://h:1/x@y"), "redis://***@y");
        assert_eq!(
            redact("redis://user:se/Zq9@host:6379"),
            "redis://***@host:6379"
        );
        assert_eq!(redact("u:pw@redis://host"), "<not a URL>");
    }

    #[test]
    fn dead_letter_at_once_lists() {
        let p = |v: &str| parse_at_once(v);
        assert_eq!(
            p("limit").unwrap(),
            AtOnce {
                classes: vec!["limit".into()],
                statuses: vec![]
            }
        );
        assert_eq!(p("599,300").unwrap().statuses, [599, 300]);
        for class in WRAPPER_ERROR_CLASSES {
            assert_eq!(p(class).unwrap().classes, [class.to_string()]);
        }
        for (bad, reason) in [
            ("limit,", "an empty item"),
            (",limit", "an empty item"),
            ("200", "not a status from 300 to 599"),
            ("204", "a 2xx acknowledges"),
            ("99", "not a status"),
            ("600", "not a status"),
            ("0400", "not a status"),
            ("99999", "not a status"),
            (
                "limt",
                "neither a status nor one of the wrapper's error classes (timeout, crash",
            ),
            // The consumer's own words for no answer are not the wrapper's classes.
            ("unreachable", "neither a status"),
            ("limit 400", "neither a status"),
        ] {
            let e = p(bad).unwrap_err();
            assert!(e.contains(reason), "{bad:?}: {e}");
        }
        let errors = parse(&with(&[(ENV_DEAD_LETTER_AT_ONCE, "413,nope")])).unwrap_err();
        assert_eq!(errors.names(), [ENV_DEAD_LETTER_AT_ONCE]);
        assert!(
            errors
                .to_string()
                .starts_with(r#"RUNR_QUEUE_DEAD_LETTER_AT_ONCE="413,nope": "nope" is neither"#),
            "{errors}"
        );
    }

    /// A password or user name: the characters that end a URL's parts early, percent escapes
    /// (valid, broken, not UTF-8), and words of letters that appear in no host, scheme or
    /// message, so a leak of any part of it can be found.
    fn credential() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("/".to_string()),
            Just("#".to_string()),
            Just("?".to_string()),
            Just("@".to_string()),
            Just(":".to_string()),
            Just("%2F".to_string()),
            Just("%40".to_string()),
            Just("%3A".to_string()),
            Just("%23".to_string()),
            Just("%3F".to_string()),
            Just("%25".to_string()),
            Just("%".to_string()),
            Just("%ZZ".to_string()),
            Just("%FF".to_string()),
            Just(" ".to_string()),
            Just("é".to_string()),
            "[XZJVW][XZJVW0-9]{3,6}",
        ];
        proptest::collection::vec(piece, 1..8).prop_map(|p| p.concat())
    }

    /// The secret words of a credential from [`credential`].
    fn words(s: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut word = String::new();
        for c in s.chars().chain(std::iter::once(' ')) {
            if "XZJVW0123456789".contains(c) && !(word.is_empty() && c.is_ascii_digit()) {
                word.push(c);
            } else {
                if word.len() >= 4 {
                    out.push(std::mem::take(&mut word));
                }
                word.clear();
            }
        }
        out
    }

    /// Every byte but the unreserved ones as `%XX`: what an operator should write.
    fn encode(s: &str) -> String {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    /// Everything the binary could print about a URL: the configuration errors, or the
    /// configuration itself (its `Debug`, which logs use, and the display of the URL).
    fn printed(url: &str) -> String {
        let mut vars: HashMap<String, String> = GOOD
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        vars.insert(ENV_REDIS_URL.into(), url.into());
        match Config::from_lookup(&move |n: &str| vars.get(n).cloned()) {
            Ok(c) => format!("{c:?}\n{}", c.redis.display),
            Err(e) => error_lines(&e).join("\n"),
        }
    }

    proptest! {
        /// A password never shows, whatever it holds and however the URL around it is
        /// written; written as it should be (percent-encoded), the URL is accepted and its
        /// display keeps host, port and database.
        #[test]
        fn no_password_is_ever_printed(
            user in proptest::option::of(credential()),
            password in credential(),
            tls in any::<bool>(),
            host in prop_oneof![Just("localhost"), Just("10.0.0.1"), Just("[::1]"), Just("redis.example")],
            port in proptest::option::of(1u16..=65535),
            db in proptest::option::of(0u32..16),
            form in 0..3u8,
        ) {
            let (sentinel, cluster) = (form == 1, form == 2);
            let scheme = match (sentinel, cluster, tls) {
                (true, _, _) => "redis+sentinel",
                (_, true, true) => "rediss+cluster",
                (_, true, false) => "redis+cluster",
                (_, _, true) => "rediss",
                _ => "redis",
            };
            // The sentinel form: two sentinels, then the service; the cluster form: two nodes,
            // database 0 only.
            let service = match (sentinel, cluster) {
                (true, _) => ",sentinel-2.example:26380/mymaster",
                (_, true) => ",node-2.example:7001",
                _ => "",
            };
            let db = if cluster { db.map(|_| 0) } else { db };
            let location = format!(
                "{host}{}{service}{}",
                port.map(|p| format!(":{p}")).unwrap_or_default(),
                db.map(|d| format!("/{d}")).unwrap_or_default(),
            );
            let secret_words: Vec<String> = words(&password)
                .into_iter()
                .chain(user.as_deref().map(words).unwrap_or_default())
                .collect();
            let user_raw = user.clone().unwrap_or_default();
            let raw = format!("{scheme}://{user_raw}:{password}@{location}");
            let encoded = format!(
                "{scheme}://{}:{}@{location}",
                encode(&user_raw),
                encode(&password)
            );
            for url in [&raw, &encoded] {
                let out = printed(url);
                for w in &secret_words {
                    prop_assert!(!out.contains(w.as_str()), "{w:?} of {url:?} printed: {out}");
                }
            }
            let good = parse_redis_url(&encoded);
            prop_assert!(good.is_ok(), "{encoded:?}: {:?}", good.err());
            prop_assert_eq!(good.unwrap().display, format!("{scheme}://***@{location}"));
        }

        /// Any text at all: the display is the URL without anything before its last `@`.
        #[test]
        fn redact_keeps_only_what_follows_the_last_at(url in "\\PC{0,40}") {
            let shown = redact(&url);
            if shown != "<not a URL>" {
                match url.rfind('@') {
                    Some(at) => {
                        let tail = format!("://***@{}", &url[at + 1..]);
                        prop_assert!(shown.ends_with(&tail), "{:?} shown as {:?}", url, shown);
                    }
                    None => prop_assert_eq!(&shown, &url),
                }
            }
        }
    }

    #[test]
    fn sentinel_urls() {
        let u = parse_redis_url(
            "redis+sentinel://app:s%2F3cret@10.0.0.1:26379,[::1],s3.example:5000/mymaster/2",
        )
        .unwrap();
        assert_eq!(
            u.display,
            "redis+sentinel://***@10.0.0.1:26379,[::1],s3.example:5000/mymaster/2"
        );
        let s = u.sentinel.as_ref().unwrap();
        assert_eq!(
            s.nodes,
            [
                ("10.0.0.1".to_string(), 26379),
                ("::1".to_string(), 26379),
                ("s3.example".to_string(), 5000)
            ]
        );
        assert_eq!(s.service, "mymaster");
        assert!(!u.tls);
        let debug = format!("{s:?} {u:?}");
        assert!(
            !debug.contains("s%2F3cret") && !debug.contains("3cret"),
            "{debug}"
        );
        let login = redis::IntoConnectionInfo::into_connection_info(s.master_login()).unwrap();
        assert_eq!(login.redis_settings().password(), Some("s/3cret"));
        assert_eq!(login.redis_settings().username(), Some("app"));
        assert_eq!(login.redis_settings().db(), 2);
        let plain = parse_redis_url("redis+sentinel://h/svc").unwrap();
        assert_eq!(plain.sentinel.unwrap().nodes, [("h".to_string(), 26379)]);
        assert!(parse_redis_url("redis://h:1").unwrap().sentinel.is_none());
        for (bad, why) in [
            ("redis+sentinel://h:26379", "no service name"),
            ("redis+sentinel://h:26379/", "no service name"),
            ("redis+sentinel://h:1,,h:2/svc", "a sentinel without a host"),
            ("redis+sentinel://h:0/svc", "the port is not a number"),
            ("redis+sentinel://h:1/svc/x", "the database is not a number"),
            ("redis+sentinel://h:1/svc?db=1", "no query"),
            ("redis+sentinel://u:p/w@h:1/svc", "percent-encode"),
        ] {
            let e = parse_redis_url(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_issues_password_with_a_slash() {
        let out = printed("redis://user:se/Zq9@host:6379");
        assert!(!out.contains("se/Zq9") && !out.contains("Zq9"), "{out}");
        assert!(out.contains(r#"="redis://***@host:6379": the user name or password holds a raw / ? or #: percent-encode them"#), "{out}");
        let ok = parse_redis_url("redis://user:se%2FZq9@host:6379/3").unwrap();
        assert_eq!(ok.display, "redis://***@host:6379/3");
    }

    #[test]
    fn names_are_visible_ascii() {
        let long = "x".repeat(201);
        for bad in ["a b", "a\tb", "é", long.as_str()] {
            assert!(parse_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_name("orders.v2-{eu}").unwrap(), "orders.v2-{eu}");
    }

    #[test]
    fn every_variable_read_is_in_the_table() {
        // Both branches of the consumer's default, and every optional variable set.
        for vars in [GOOD.to_vec(), with(&[(ENV_CONSUMER, "c")])] {
            let read = names_read(&vars, |get| {
                let _ = Config::from_lookup(get);
            });
            assert_eq!(unlisted(&[VARS], &read), Vec::<String>::new());
            assert!(read.iter().any(|n| n == ENV_DRAIN));
        }
        // And the table lists nothing that is never read (the export's variables are read
        // once an endpoint is set, the general or the traces-specific one).
        let mut read = Vec::new();
        for vars in [
            GOOD.to_vec(),
            with(&[(otlp::ENV_OTLP_ENDPOINT, "http://c:4318")]),
            with(&[
                (otlp::ENV_OTLP_TRACES_ENDPOINT, "http://c:4318/v1/traces"),
                (otlp::ENV_OTLP_TRACES_TIMEOUT, "100"),
            ]),
        ] {
            let r = names_read(&vars, |get| {
                let _ = Config::from_lookup(get);
            });
            assert_eq!(unlisted(&[VARS], &r), Vec::<String>::new());
            read.extend(r);
        }
        for v in VARS {
            assert!(read.iter().any(|n| n == v.name), "{} is never read", v.name);
        }
    }
}
