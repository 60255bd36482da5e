//! OTLP/HTTP span export in the JSON encoding, off the request path.
//!
//! Hand-written rather than the `opentelemetry-otlp` exporter: the wrapper records exactly one
//! span kind with a handful of attributes, and the SDK stack (opentelemetry, opentelemetry_sdk,
//! opentelemetry-otlp with prost-generated types) measured +1.0 MiB on a 1.0 MiB hyper probe
//! (README, tracing section) — a third of the wrapper's 3 MiB budget for one JSON POST. The
//! exporter keeps the SDK's behaviour that matters: a bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`)
//! whose overflow is dropped, batches (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`) sent every
//! `OTEL_BSP_SCHEDULE_DELAY`, a per-export timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`), and failures
//! that cost a rate-limited warning, never a request.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::trace::Span;
use crate::config::observe::OtlpConfig;

/// A finished span, ready to export.
#[derive(Debug, Clone)]
pub struct SpanData {
    /// Ids, parent and start.
    pub span: Span,
    /// Span name (the HTTP method, as semantic conventions ask without a route).
    pub name: String,
    /// End time.
    pub end: SystemTime,
    /// Attributes: string or integer values.
    pub attributes: Vec<(&'static str, Attr)>,
    /// Whether the span's status is ERROR (a 5xx answer, a timeout, a crash).
    pub error: bool,
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
    pub fn start(config: OtlpConfig) -> Exporter {
        let (tx, rx) = mpsc::channel(config.max_queue.max(1));
        tokio::spawn(export_loop(config, rx));
        Exporter { tx }
    }

    /// Queues `span`; drops it when the queue is full (a collector that is down must not grow
    /// our memory or slow requests).
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

async fn send_batch(config: &OtlpConfig, batch: &mut Vec<SpanData>) {
    if batch.is_empty() {
        return;
    }
    let body = encode(&config.service_name, batch);
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
/// as decimal strings).
pub fn encode(service_name: &str, spans: &[SpanData]) -> Vec<u8> {
    let spans: Vec<Value> = spans.iter().map(encode_span).collect();
    let doc = json!({
        "resourceSpans": [{
            "resource": {"attributes": [
                kv("service.name", &Attr::Str(service_name.to_string())),
                kv("telemetry.sdk.name", &Attr::Str("runr-wrapper".into())),
                kv("telemetry.sdk.language", &Attr::Str("rust".into())),
            ]},
            "scopeSpans": [{
                "scope": {"name": "runr-wrapper", "version": env!("CARGO_PKG_VERSION")},
                "spans": spans,
            }],
        }],
    });
    serde_json::to_vec(&doc).unwrap_or_default()
}

fn encode_span(s: &SpanData) -> Value {
    let mut span = json!({
        "traceId": runr_base::fmt::hex(&s.span.trace_id),
        "spanId": runr_base::fmt::hex(&s.span.span_id),
        "name": s.name,
        "kind": 2, // SPAN_KIND_SERVER
        "startTimeUnixNano": unix_nanos(s.span.start).to_string(),
        "endTimeUnixNano": unix_nanos(s.end).to_string(),
        "attributes": s.attributes.iter().map(|(k, v)| kv(k, v)).collect::<Vec<_>>(),
        "flags": u32::from(s.span.sampled), // W3C trace flags
        "status": {"code": if s.error { 2 } else { 0 }},
    });
    if let Some(parent) = &s.span.parent_span_id {
        span["parentSpanId"] = Value::String(runr_base::fmt::hex(parent));
    }
    span
}

fn kv(key: &str, value: &Attr) -> Value {
    let value = match value {
        Attr::Str(s) => json!({"stringValue": s}),
        Attr::Int(i) => json!({"intValue": i.to_string()}),
        Attr::Bool(b) => json!({"boolValue": b}),
    };
    json!({"key": key, "value": value})
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

    #[test]
    fn encodes_the_otlp_json_mapping() {
        let span = Span {
            trace_id: [0x4b; 16],
            span_id: [0x01; 8],
            parent_span_id: Some([0x02; 8]),
            sampled: true,
            start: UNIX_EPOCH + Duration::from_secs(1),
        };
        let data = SpanData {
            span,
            name: "GET".into(),
            end: UNIX_EPOCH + Duration::from_millis(1500),
            attributes: vec![("http.response.status_code", Attr::Int(500))],
            error: true,
        };
        let v: Value = serde_json::from_slice(&encode("orders", &[data])).unwrap();
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
    }

    #[test]
    fn warn_gate_lets_one_through_per_interval() {
        let g = WarnGate::new();
        assert_eq!(g.pass(), Some(0));
        assert_eq!(g.pass(), None);
        assert_eq!(g.pass(), None);
    }
}
