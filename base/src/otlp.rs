//! OTLP/HTTP span export in the JSON encoding, off the request path.
//!
//! Hand-written rather than the `opentelemetry-otlp` exporter: a binary records one or two span
//! kinds with a handful of attributes, and the SDK stack (opentelemetry, opentelemetry_sdk,
//! opentelemetry-otlp with prost-generated types) measured +1.0 MiB on a 1.0 MiB hyper probe
//! (README, tracing section) — a third of the wrapper's 3 MiB budget for one JSON POST. Shared
//! by the wrapper (server spans) and runr-queue (delivery spans), with the `OTEL_*` variables
//! both read ([`from_env`]); each binary's variables table lists them. The
//! exporter keeps the SDK's behaviour that matters: a bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`)
//! whose overflow is dropped, batches (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`) sent every
//! `OTEL_BSP_SCHEDULE_DELAY`, a per-export timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`), and failures
//! that cost a rate-limited warning, never a request.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::env::Env;
use crate::target::Target;

// === the variables ===

/// OTLP/HTTP base endpoint; spans go to `<endpoint>/v1/traces`.
pub const ENV_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// OTLP/HTTP traces endpoint, used as it is; wins over [`ENV_OTLP_ENDPOINT`].
pub const ENV_OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// `http/json` or `http/protobuf` (both are sent as JSON, which OTLP/HTTP receivers accept);
/// `grpc` is not supported.
pub const ENV_OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
/// Traces-specific [`ENV_OTLP_PROTOCOL`].
pub const ENV_OTLP_TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
/// Extra export headers, `key=value,key2=value2`.
pub const ENV_OTLP_HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
/// Traces-specific [`ENV_OTLP_HEADERS`].
pub const ENV_OTLP_TRACES_HEADERS: &str = "OTEL_EXPORTER_OTLP_TRACES_HEADERS";
/// Per-export time limit in milliseconds (or with a unit, `10s`).
pub const ENV_OTLP_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";
/// Traces-specific [`ENV_OTLP_TIMEOUT`].
pub const ENV_OTLP_TRACES_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT";
/// Default of [`ENV_OTLP_TIMEOUT`].
pub const DEFAULT_OTLP_TIMEOUT: Duration = Duration::from_secs(10);
/// The `service.name` resource attribute.
pub const ENV_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// Knative's service name, the fallback for [`ENV_SERVICE_NAME`].
pub const ENV_K_SERVICE: &str = "K_SERVICE";
/// Longest wait of a span for its export batch, in milliseconds (or with a unit).
pub const ENV_BSP_SCHEDULE_DELAY: &str = "OTEL_BSP_SCHEDULE_DELAY";
/// Default of [`ENV_BSP_SCHEDULE_DELAY`].
pub const DEFAULT_BSP_SCHEDULE_DELAY: Duration = Duration::from_secs(5);
/// Spans queued for export at most; more are dropped.
pub const ENV_BSP_MAX_QUEUE_SIZE: &str = "OTEL_BSP_MAX_QUEUE_SIZE";
/// Default of [`ENV_BSP_MAX_QUEUE_SIZE`].
pub const DEFAULT_BSP_MAX_QUEUE_SIZE: usize = 2048;
/// Spans per export request at most.
pub const ENV_BSP_MAX_EXPORT_BATCH_SIZE: &str = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE";
/// Default of [`ENV_BSP_MAX_EXPORT_BATCH_SIZE`].
pub const DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE: usize = 512;
/// `true` turns the export off (OpenTelemetry's standard switch; any other value is false, as
/// the OpenTelemetry specification has it, so this one is not a flag of the common grammar).
pub const ENV_SDK_DISABLED: &str = "OTEL_SDK_DISABLED";

/// Where spans go, and how they are batched.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpConfig {
    /// The traces endpoint (`.../v1/traces`).
    pub endpoint: Target,
    /// `OTEL_EXPORTER_OTLP_HEADERS` / `OTEL_EXPORTER_OTLP_TRACES_HEADERS`.
    pub headers: Vec<(String, String)>,
    /// `OTEL_SERVICE_NAME`.
    pub service_name: String,
    /// Per-export time limit.
    pub timeout: Duration,
    /// Longest time a span waits for its batch.
    pub schedule_delay: Duration,
    /// Spans held at most; more are dropped.
    pub max_queue: usize,
    /// Spans per export request at most.
    pub max_batch: usize,
    /// The exporting binary: the instrumentation scope and `telemetry.sdk.name`.
    pub scope: &'static str,
}

/// The first of two variables that is set: the traces-specific one wins.
fn either(
    env: &Env,
    specific: &'static str,
    general: &'static str,
) -> Option<(&'static str, String)> {
    env.value(specific)
        .map(|v| (specific, v))
        .or_else(|| env.value(general).map(|v| (general, v)))
}

/// A queue or batch size: a whole number above zero.
fn positive(env: &mut Env, name: &'static str, default: usize) -> usize {
    env.parse(name, default, |v| {
        crate::env::parse_count(v, &(1..=usize::MAX))
            .map_err(|_| "expected a positive whole number".to_string())
    })
}

/// The span export of the binary `scope` (`runr-wrapper`, `runr-queue`: the instrumentation
/// scope, and the service name when none is set), when an endpoint is set and the SDK is not
/// disabled. Every variable is checked either way, so a mistake is named even when the export
/// ends up off.
pub fn from_env(env: &mut Env, scope: &'static str) -> Option<OtlpConfig> {
    let (name, v) = either(env, ENV_OTLP_TRACES_ENDPOINT, ENV_OTLP_ENDPOINT)?;
    let url = if name == ENV_OTLP_ENDPOINT {
        format!("{}/v1/traces", v.trim_end_matches('/'))
    } else {
        v.clone()
    };
    let endpoint = match Target::parse_url(&url) {
        Ok(t) => Some(t),
        Err(reason) => {
            env.reject(
                name,
                Some(&crate::target::redact(&v)),
                format!(
                    "{reason} (the exporter speaks plain OTLP/HTTP to an in-cluster collector)"
                ),
            );
            None
        }
    };
    if let Some((name, v)) = either(env, ENV_OTLP_TRACES_PROTOCOL, ENV_OTLP_PROTOCOL) {
        if !matches!(v.as_str(), "http/json" | "http/protobuf") {
            env.reject(
                name,
                Some(&v),
                "expected http/json or http/protobuf (grpc is not supported)",
            );
        }
    }
    let headers = match either(env, ENV_OTLP_TRACES_HEADERS, ENV_OTLP_HEADERS) {
        None => Vec::new(),
        Some((name, v)) => parse_headers(&v).unwrap_or_else(|reason| {
            env.reject(name, Some(&v), reason);
            Vec::new()
        }),
    };
    let timeout = match env.value(ENV_OTLP_TRACES_TIMEOUT) {
        Some(_) => env.duration_ms(ENV_OTLP_TRACES_TIMEOUT, DEFAULT_OTLP_TIMEOUT),
        None => env.duration_ms(ENV_OTLP_TIMEOUT, DEFAULT_OTLP_TIMEOUT),
    };
    let schedule_delay = env.duration_ms(ENV_BSP_SCHEDULE_DELAY, DEFAULT_BSP_SCHEDULE_DELAY);
    let max_queue = positive(env, ENV_BSP_MAX_QUEUE_SIZE, DEFAULT_BSP_MAX_QUEUE_SIZE);
    let max_batch = positive(
        env,
        ENV_BSP_MAX_EXPORT_BATCH_SIZE,
        DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE,
    );
    let disabled = env
        .value(ENV_SDK_DISABLED)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let service_name = env
        .value(ENV_SERVICE_NAME)
        .or_else(|| env.value(ENV_K_SERVICE))
        .unwrap_or_else(|| format!("unknown_service:{scope}"));
    Some(OtlpConfig {
        endpoint: endpoint?,
        headers,
        service_name,
        timeout,
        schedule_delay,
        max_queue,
        max_batch: max_batch.min(max_queue),
        scope,
    })
    .filter(|_| !disabled)
}

/// `key=value,key2=value2` (W3C baggage-like, as the OTLP exporter spec defines).
fn parse_headers(v: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for pair in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, val) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not key=value"))?;
        let (k, val) = (k.trim(), percent_decode(val.trim()));
        if http::HeaderName::from_bytes(k.as_bytes()).is_err()
            || http::HeaderValue::from_str(&val).is_err()
        {
            return Err(format!("{pair:?} is not a valid header"));
        }
        out.push((k.to_string(), val));
    }
    Ok(out)
}

/// `%XX` escapes decoded (the exporter spec has header values URL-encoded, e.g.
/// `Authorization=Basic%20...`); anything that is not a valid escape stays as it is.
fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

// === the export ===

/// A finished span, ready to export.
#[derive(Debug, Clone)]
pub struct SpanData {
    /// The trace.
    pub trace_id: [u8; 16],
    /// This span.
    pub span_id: [u8; 8],
    /// The caller's span, when the trace was continued.
    pub parent_span_id: Option<[u8; 8]>,
    /// The W3C sampled flag (only sampled spans are exported; the flag goes along).
    pub sampled: bool,
    /// What the span stands for.
    pub kind: SpanKind,
    /// Start time.
    pub start: SystemTime,
    /// Span name (the wrapper's: the HTTP method, as semantic conventions ask without a route).
    pub name: String,
    /// End time.
    pub end: SystemTime,
    /// Attributes: string or integer values.
    pub attributes: Vec<(&'static str, Attr)>,
    /// Whether the span's status is ERROR (a 5xx answer, a timeout, a crash).
    pub error: bool,
}

/// OTLP's `SpanKind`, the kinds RunR records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// The wrapper serving a request.
    Server,
    /// An outgoing request.
    Client,
    /// The processing of a message taken from a queue (runr-queue's delivery).
    Consumer,
}

impl SpanKind {
    fn code(self) -> u8 {
        match self {
            SpanKind::Server => 2,
            SpanKind::Client => 3,
            SpanKind::Consumer => 5,
        }
    }
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
}

enum Msg {
    Span(Box<SpanData>),
    Flush(oneshot::Sender<()>),
}

// The export's functions are `#[inline]`: code generated in the binary's own crate instantiates
// hyper's client, tokio's task and serde_json's writer for types the binary instantiates already
// (one copy each); generated here, they were second copies that made the wrapper 80 KiB bigger.

/// Handle of the export task; cheap to share.
#[derive(Debug, Clone)]
pub struct Exporter {
    tx: mpsc::Sender<Msg>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Msg")
    }
}

impl Exporter {
    /// Starts the export task on the current tokio runtime.
    #[inline]
    pub fn start(config: OtlpConfig) -> Exporter {
        let (tx, rx) = mpsc::channel(config.max_queue.max(1));
        tokio::spawn(export_loop(config, rx));
        Exporter { tx }
    }

    /// Queues `span`; drops it when the queue is full (a collector that is down must not grow
    /// our memory or slow requests).
    #[inline]
    pub fn export(&self, span: SpanData) {
        if self.tx.try_send(Msg::Span(Box::new(span))).is_err() {
            warn_limited(
                &DROPPED,
                "span queue full: dropping spans (is the collector down?)",
                None,
            );
        }
    }

    /// Exports everything queued so far, waiting at most `limit` (at shutdown).
    #[inline]
    pub async fn flush(&self, limit: Duration) {
        let (done, wait) = oneshot::channel();
        let _ = tokio::time::timeout(limit, async {
            if self.tx.send(Msg::Flush(done)).await.is_ok() {
                let _ = wait.await;
            }
        })
        .await;
    }
}

#[inline]
async fn export_loop(config: OtlpConfig, mut rx: mpsc::Receiver<Msg>) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(config.max_batch);
    let mut next = Instant::now() + config.schedule_delay;
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(Msg::Span(span)) => {
                    batch.push(*span);
                    if batch.len() >= config.max_batch {
                        send_batch(&config, &mut batch).await;
                        next = Instant::now() + config.schedule_delay;
                    }
                }
                Some(Msg::Flush(done)) => {
                    send_batch(&config, &mut batch).await;
                    let _ = done.send(());
                }
                None => {
                    send_batch(&config, &mut batch).await;
                    return;
                }
            },
            () = tokio::time::sleep_until(next) => {
                send_batch(&config, &mut batch).await;
                next = Instant::now() + config.schedule_delay;
            }
        }
    }
}

#[inline]
async fn send_batch(config: &OtlpConfig, batch: &mut Vec<SpanData>) {
    if batch.is_empty() {
        return;
    }
    let body = encode(config.scope, &config.service_name, batch);
    let count = batch.len();
    batch.clear();
    match tokio::time::timeout(config.timeout, post(config, body)).await {
        Ok(Ok(status)) if (200..300).contains(&status) => {}
        Ok(Ok(status)) => warn_limited(
            &FAILED,
            "the collector refused spans",
            Some(format!("status {status}, {count} spans lost")),
        ),
        Ok(Err(e)) => warn_limited(
            &FAILED,
            "cannot export spans",
            Some(format!("{e}, {count} spans lost")),
        ),
        Err(_) => warn_limited(
            &FAILED,
            "cannot export spans",
            Some(format!(
                "timed out after {:?}, {count} spans lost",
                config.timeout
            )),
        ),
    }
}

#[inline]
async fn post(config: &OtlpConfig, body: Vec<u8>) -> Result<u16, String> {
    let target = &config.endpoint;
    let stream = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| format!("connect to {target}: {e}"))?;
    let mut req = http::Request::post(target.path.as_str())
        .header(http::header::HOST, target.authority.as_str())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::CONTENT_LENGTH, body.len());
    for (k, v) in &config.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("bad export request: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("{target}: {e}"))?;
    let conn = tokio::spawn(conn);
    let res = sender
        .send_request(req)
        .await
        .map_err(|e| format!("{target}: {e}"));
    let status = match res {
        Ok(res) => {
            let status = res.status().as_u16();
            // Read the (small) answer so the collector sees an orderly exchange.
            let _ = res.into_body().collect().await;
            Ok(status)
        }
        Err(e) => Err(e),
    };
    conn.abort();
    status
}

/// The OTLP `ExportTraceServiceRequest` in the protobuf-JSON mapping (ids as hex, 64-bit integers
/// as decimal strings). Written straight into the buffer, strings escaped by serde_json: building
/// a `serde_json::Value` tree first (a map and a dozen small allocations per attribute) was most
/// of the export's cost per span.
#[inline]
pub fn encode(scope: &str, service_name: &str, spans: &[SpanData]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + spans.len() * 768);
    out.extend_from_slice(br#"{"resourceSpans":[{"resource":{"attributes":["#);
    kv(&mut out, "service.name", AttrRef::Str(service_name));
    out.push(b',');
    kv(&mut out, "telemetry.sdk.name", AttrRef::Str(scope));
    out.push(b',');
    kv(&mut out, "telemetry.sdk.language", AttrRef::Str("rust"));
    out.extend_from_slice(br#"]},"scopeSpans":[{"scope":{"name":"#);
    string(&mut out, scope);
    out.extend_from_slice(br#","version":"#);
    string(&mut out, env!("CARGO_PKG_VERSION"));
    out.extend_from_slice(br#"},"spans":["#);
    for (i, span) in spans.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        encode_span(&mut out, span);
    }
    out.extend_from_slice(b"]}]}]}");
    out
}

#[inline]
fn encode_span(out: &mut Vec<u8>, s: &SpanData) {
    use std::io::Write;
    out.extend_from_slice(br#"{"traceId":""#);
    out.extend_from_slice(crate::fmt::hex(&s.trace_id).as_bytes());
    out.extend_from_slice(br#"","spanId":""#);
    out.extend_from_slice(crate::fmt::hex(&s.span_id).as_bytes());
    out.push(b'"');
    if let Some(parent) = &s.parent_span_id {
        out.extend_from_slice(br#","parentSpanId":""#);
        out.extend_from_slice(crate::fmt::hex(parent).as_bytes());
        out.push(b'"');
    }
    out.extend_from_slice(br#","name":"#);
    string(out, &s.name);
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        r#","kind":{},"startTimeUnixNano":"{}","endTimeUnixNano":"{}","attributes":["#,
        s.kind.code(),
        unix_nanos(s.start),
        unix_nanos(s.end),
    );
    for (i, (key, value)) in s.attributes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        kv(out, key, value.as_ref());
    }
    // `flags`: the W3C trace flags.
    let _ = write!(
        out,
        r#"],"flags":{},"status":{{"code":{}}}}}"#,
        u32::from(s.sampled),
        if s.error { 2 } else { 0 },
    );
}

/// An attribute value, borrowed.
#[derive(Clone, Copy)]
enum AttrRef<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
}

impl Attr {
    fn as_ref(&self) -> AttrRef<'_> {
        match self {
            Attr::Str(s) => AttrRef::Str(s),
            Attr::Int(i) => AttrRef::Int(*i),
            Attr::Bool(b) => AttrRef::Bool(*b),
        }
    }
}

/// `{"key":…,"value":{"stringValue":…}}` (`intValue` as a decimal string, `boolValue`).
#[inline]
fn kv(out: &mut Vec<u8>, key: &str, value: AttrRef<'_>) {
    use std::io::Write;
    out.extend_from_slice(br#"{"key":"#);
    string(out, key);
    match value {
        AttrRef::Str(s) => {
            out.extend_from_slice(br#","value":{"stringValue":"#);
            string(out, s);
            out.extend_from_slice(b"}}");
        }
        AttrRef::Int(i) => {
            let _ = write!(out, r#","value":{{"intValue":"{i}"}}}}"#);
        }
        AttrRef::Bool(b) => {
            let _ = write!(out, r#","value":{{"boolValue":{b}}}}}"#);
        }
    }
}

/// `s` as a JSON string, escaped as serde_json escapes it.
#[inline]
fn string(out: &mut Vec<u8>, s: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn unix_nanos(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos()
}

// === rate-limited warnings ===

/// One warning per this interval at most, per kind, with the count of what was suppressed.
const WARN_EVERY: Duration = Duration::from_secs(60);

static DROPPED: WarnGate = WarnGate::new();
static FAILED: WarnGate = WarnGate::new();

/// Remembers when a kind of warning was last written and how many were held back since.
pub struct WarnGate {
    state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl WarnGate {
    /// A gate that lets the first warning through.
    pub const fn new() -> WarnGate {
        WarnGate {
            state: std::sync::Mutex::new((None, 0)),
        }
    }

    /// Whether to write a warning now; `Some(n)` with the number suppressed since the last one.
    pub fn pass(&self) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        match st.0 {
            Some(last) if now.duration_since(last) < WARN_EVERY => {
                st.1 += 1;
                None
            }
            _ => {
                let suppressed = st.1;
                *st = (Some(now), 0);
                Some(suppressed)
            }
        }
    }
}

impl Default for WarnGate {
    fn default() -> Self {
        WarnGate::new()
    }
}

fn warn_limited(gate: &WarnGate, message: &str, detail: Option<String>) {
    if let Some(suppressed) = gate.pass() {
        tracing::warn!(
            detail = detail.as_deref().unwrap_or(""),
            suppressed_since_last_warning = suppressed,
            "{message}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    /// The encoder as it was, through a `serde_json::Value` tree: the reference of the direct one.
    fn reference(scope: &str, service_name: &str, spans: &[SpanData]) -> Value {
        fn kv(key: &str, value: &Attr) -> Value {
            let value = match value {
                Attr::Str(s) => json!({"stringValue": s}),
                Attr::Int(i) => json!({"intValue": i.to_string()}),
                Attr::Bool(b) => json!({"boolValue": b}),
            };
            json!({"key": key, "value": value})
        }
        let spans: Vec<Value> = spans
            .iter()
            .map(|s| {
                let mut span = json!({
                    "traceId": crate::fmt::hex(&s.trace_id),
                    "spanId": crate::fmt::hex(&s.span_id),
                    "name": s.name,
                    "kind": s.kind.code(),
                    "startTimeUnixNano": unix_nanos(s.start).to_string(),
                    "endTimeUnixNano": unix_nanos(s.end).to_string(),
                    "attributes": s.attributes.iter().map(|(k, v)| kv(k, v)).collect::<Vec<_>>(),
                    "flags": u32::from(s.sampled),
                    "status": {"code": if s.error { 2 } else { 0 }},
                });
                if let Some(parent) = &s.parent_span_id {
                    span["parentSpanId"] = Value::String(crate::fmt::hex(parent));
                }
                span
            })
            .collect();
        json!({
            "resourceSpans": [{
                "resource": {"attributes": [
                    kv("service.name", &Attr::Str(service_name.to_string())),
                    kv("telemetry.sdk.name", &Attr::Str(scope.into())),
                    kv("telemetry.sdk.language", &Attr::Str("rust".into())),
                ]},
                "scopeSpans": [{
                    "scope": {"name": scope, "version": env!("CARGO_PKG_VERSION")},
                    "spans": spans,
                }],
            }],
        })
    }

    fn span_strategy() -> impl Strategy<Value = SpanData> {
        let attr = prop_oneof![
            "\\PC{0,12}".prop_map(Attr::Str),
            any::<i64>().prop_map(Attr::Int),
            any::<bool>().prop_map(Attr::Bool),
        ];
        let keys = prop_oneof![Just("http.route"), Just("a\"b"), Just("é\u{1}")];
        (
            any::<[u8; 16]>(),
            any::<[u8; 8]>(),
            proptest::option::of(any::<[u8; 8]>()),
            any::<bool>(),
            prop_oneof![
                Just(SpanKind::Server),
                Just(SpanKind::Client),
                Just(SpanKind::Consumer)
            ],
            any::<u64>(),
            "\\PC{0,12}",
            proptest::collection::vec((keys, attr), 0..6),
            any::<bool>(),
        )
            .prop_map(
                |(trace_id, span_id, parent_span_id, sampled, kind, t, name, attributes, error)| {
                    SpanData {
                        trace_id,
                        span_id,
                        parent_span_id,
                        sampled,
                        kind,
                        start: UNIX_EPOCH + Duration::from_nanos(t / 2),
                        name,
                        end: UNIX_EPOCH + Duration::from_nanos(t),
                        attributes,
                        error,
                    }
                },
            )
    }

    proptest! {
        /// The direct encoder writes what the `Value` one wrote, for any text in any field.
        #[test]
        fn encodes_what_the_value_tree_encoded(
            scope in "\\PC{0,10}",
            service in "\\PC{0,10}",
            spans in proptest::collection::vec(span_strategy(), 0..4),
        ) {
            let got: Value = serde_json::from_slice(&encode(&scope, &service, &spans)).unwrap();
            prop_assert_eq!(got, reference(&scope, &service, &spans));
        }
    }

    #[test]
    fn encodes_the_otlp_json_mapping() {
        let data = SpanData {
            trace_id: [0x4b; 16],
            span_id: [0x01; 8],
            parent_span_id: Some([0x02; 8]),
            sampled: true,
            kind: SpanKind::Server,
            start: UNIX_EPOCH + Duration::from_secs(1),
            name: "GET".into(),
            end: UNIX_EPOCH + Duration::from_millis(1500),
            attributes: vec![("http.response.status_code", Attr::Int(500))],
            error: true,
        };
        let v: Value = serde_json::from_slice(&encode("runr-wrapper", "orders", &[data])).unwrap();
        let rs = &v["resourceSpans"][0];
        assert_eq!(
            rs["resource"]["attributes"][0]["value"]["stringValue"],
            "orders"
        );
        let s = &rs["scopeSpans"][0]["spans"][0];
        assert_eq!(s["traceId"], "4b".repeat(16));
        assert_eq!(s["parentSpanId"], "02".repeat(8));
        assert_eq!(s["startTimeUnixNano"], "1000000000");
        assert_eq!(s["endTimeUnixNano"], "1500000000");
        assert_eq!(s["kind"], 2);
        assert_eq!(s["status"]["code"], 2);
        assert_eq!(s["attributes"][0]["value"]["intValue"], "500");
        assert_eq!(rs["scopeSpans"][0]["scope"]["name"], "runr-wrapper");
    }

    #[test]
    fn from_env_reads_the_otel_variables() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |n: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| v.to_string())
            }
        };
        let get = vars(&[
            (ENV_OTLP_ENDPOINT, "http://collector:4318/"),
            (
                ENV_OTLP_HEADERS,
                "x-tenant=a, authorization=Basic%20dTpw%3D",
            ),
        ]);
        let mut env = Env::new(&get);
        let c = from_env(&mut env, "runr-queue").unwrap();
        assert!(env.finish().is_ok());
        assert_eq!(c.endpoint.to_string(), "http://collector:4318/v1/traces");
        assert_eq!(c.service_name, "unknown_service:runr-queue");
        assert_eq!(c.scope, "runr-queue");
        assert_eq!(c.headers[1], ("authorization".into(), "Basic dTpw=".into()));
        assert_eq!(percent_decode("a%2"), "a%2");
        let get = vars(&[(ENV_K_SERVICE, "orders")]);
        let mut env = Env::new(&get);
        assert!(
            from_env(&mut env, "runr-queue").is_none(),
            "no endpoint, no export"
        );
        let get = vars(&[
            (ENV_OTLP_ENDPOINT, "http://c:4318"),
            (ENV_SDK_DISABLED, "TRUE"),
            (ENV_K_SERVICE, "orders"),
        ]);
        let mut env = Env::new(&get);
        assert!(from_env(&mut env, "runr-queue").is_none());
        let get = vars(&[
            (ENV_OTLP_ENDPOINT, "http://c:4318"),
            (ENV_K_SERVICE, "orders"),
        ]);
        let mut env = Env::new(&get);
        assert_eq!(
            from_env(&mut env, "runr-queue").unwrap().service_name,
            "orders"
        );
        let get = vars(&[
            (ENV_OTLP_ENDPOINT, "https://c:4318"),
            (ENV_OTLP_PROTOCOL, "grpc"),
        ]);
        let mut env = Env::new(&get);
        assert!(from_env(&mut env, "runr-queue").is_none());
        let names = env.finish().unwrap_err().names();
        assert_eq!(names, [ENV_OTLP_ENDPOINT, ENV_OTLP_PROTOCOL]);
        // A collector URL with credentials is refused without showing them.
        let get = vars(&[(ENV_OTLP_TRACES_ENDPOINT, "http://u:s3cr3t@c:4318/v1/traces")]);
        let mut env = Env::new(&get);
        assert!(from_env(&mut env, "runr-queue").is_none());
        let text = env.finish().unwrap_err().to_string();
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(text.contains("http://***@c:4318/v1/traces"), "{text}");
    }

    #[test]
    fn warn_gate_lets_one_through_per_interval() {
        let g = WarnGate::new();
        assert_eq!(g.pass(), Some(0));
        assert_eq!(g.pass(), None);
        assert_eq!(g.pass(), None);
    }
}
