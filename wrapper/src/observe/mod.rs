//! What the wrapper observes about each invocation when tracing (`RUNR_TRACING=1`) or replay
//! capture (`RUNR_REPLAY=1`) is on: one record per finished invocation ([`record`]), read by
//! the server span and access line ([`trace`]), their OTLP export (runr-base's exporter) and the capture of
//! failed invocations ([`replay`]); what it always keeps: the Prometheus metrics ([`metrics`])
//! and the handler's log lines with the per-invocation line ([`logs`]); and the wrapper's own
//! log format.
//!
//! One process-wide [`Observer`] (like OpenTelemetry's global tracer provider) so that every
//! mode reaches it from the point where an invocation completes without threading it through
//! each server's state; metrics and log switches are process-wide for the same reason.

pub(crate) mod logs;
pub(crate) mod metrics;
pub(crate) mod record;
pub(crate) mod replay;
pub(crate) mod trace;

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use http::HeaderMap;
use runr_base::log::LogFormat;

use crate::config::observe::{ObserveConfig, Sampler};
pub(crate) use record::{Failure, Finished};
use replay::ReplayWriter;
use runr_base::otlp::{Attr, Exporter, SpanData, SpanKind};
use trace::Span;

/// The wrapper's own lines: `[runr-wrapper] [LEVEL ]message key=value` on stderr; the level is
/// left out for INFO, which keeps access lines in the spec's shape (or, `RUNR_LOG_FORMAT=json`,
/// one JSON object per line). The user program's lines are forwarded as they are, or as JSON
/// ([`logs::handler_line`]).
pub(crate) const LOG_FORMAT: LogFormat = LogFormat {
    prefix: "runr-wrapper",
    info_level: false,
    timestamps: false,
};

/// The prefix of every line the wrapper writes itself, for lines written without `tracing`.
pub(crate) const PREFIX: &str = "[runr-wrapper]";

/// The process-wide observer: present only when tracing or replay is on.
pub struct Observer {
    sampler: Option<Sampler>,
    exporter: Option<Exporter>,
    replay: Option<ReplayWriter>,
}

static OBSERVER: OnceLock<Observer> = OnceLock::new();

/// Sets up the observer for `config` (inside the tokio runtime: the exporter is a task). A no-op
/// when nothing is observed, or when it is set up already.
pub fn install(config: &ObserveConfig) {
    if !config.observed() || OBSERVER.get().is_some() {
        return;
    }
    let exporter = config.otlp.clone().map(|otlp| {
        tracing::info!(endpoint = %otlp.endpoint, service = %otlp.service_name, "exporting spans over OTLP/HTTP");
        Exporter::start(otlp)
    });
    let replay = config.replay.as_ref().map(|r| {
        tracing::info!(file = %r.file.display(), max_body = r.max_body, max_bytes = r.max_bytes, "capturing failed invocations");
        ReplayWriter::start(r)
    });
    let _ = OBSERVER.set(Observer {
        sampler: config.tracing.then_some(config.sampler),
        exporter,
        replay,
    });
}

/// The observer, when tracing or replay is on.
pub fn global() -> Option<&'static Observer> {
    OBSERVER.get()
}

/// Exports the spans and writes the captures still queued, waiting at most `limit` (at exit).
pub async fn flush(limit: Duration) {
    let Some(observer) = global() else {
        return;
    };
    let spans = async {
        if let Some(exporter) = &observer.exporter {
            exporter.flush(limit).await;
        }
    };
    let captures = async {
        if let Some(replay) = &observer.replay {
            replay.flush(limit).await;
        }
    };
    tokio::join!(spans, captures);
}

impl Observer {
    /// Starts the server span of a request with `headers` when tracing is on.
    pub fn start_span(&self, headers: &HeaderMap, start: SystemTime) -> Option<Span> {
        self.sampler
            .as_ref()
            .map(|s| Span::start(headers, s, start))
    }

    /// Request body bytes a capture keeps, when replay is on.
    pub fn replay_max_body(&self) -> Option<usize> {
        self.replay.as_ref().map(ReplayWriter::max_body)
    }

    /// Writes the access line, exports the span and captures a failure, as configured.
    pub fn finish(&self, done: Finished<'_>) {
        if let Some(span) = &done.span {
            let line = if logs::json() {
                trace::access_line_json(
                    span,
                    done.method,
                    done.path,
                    done.status,
                    done.took,
                    done.cold_start,
                    done.replaced_id,
                )
            } else {
                trace::access_line(
                    span,
                    done.method,
                    done.path,
                    done.status,
                    done.took,
                    done.cold_start,
                    done.replaced_id,
                )
                .into_bytes()
            };
            trace::write_access_line(&line);
            if let (Some(exporter), true) = (&self.exporter, span.sampled) {
                exporter.export(span_data(span, &done));
            }
        }
        if let (Some(replay), Some(failure)) = (&self.replay, done.failure) {
            replay.capture(&done, failure);
        }
    }
}

fn span_data(span: &Span, done: &Finished<'_>) -> SpanData {
    let mut attributes = vec![
        ("http.request.method", Attr::Str(done.method.to_string())),
        ("url.path", Attr::Str(done.path.to_string())),
        (
            "http.response.status_code",
            Attr::Int(i64::from(done.status)),
        ),
        (
            "faas.trigger",
            Attr::Str(faas_trigger(done.trigger).to_string()),
        ),
        ("faas.coldstart", Attr::Bool(done.cold_start)),
    ];
    if let Some(ua) = done
        .headers
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
    {
        attributes.push(("user_agent.original", Attr::Str(ua.to_string())));
    }
    if let Some(f) = done.failure {
        attributes.push(("error.type", Attr::Str(f.as_str().to_string())));
    }
    SpanData {
        trace_id: span.trace_id,
        span_id: span.span_id,
        parent_span_id: span.parent_span_id,
        sampled: span.sampled,
        kind: SpanKind::Server,
        start: span.start,
        name: done.method.to_string(),
        end: span.start + done.took,
        attributes,
        error: done.failure.is_some(),
    }
}

/// The `faas.trigger` semantic-convention value of a RunR trigger.
fn faas_trigger(trigger: &str) -> &'static str {
    match trigger {
        "queue" => "pubsub",
        "schedule" => "timer",
        _ => "http",
    }
}
