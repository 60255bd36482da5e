//! W3C trace context and the wrapper's server span: continue the incoming `traceparent` (or
//! start a trace), decide sampling the way `OTEL_TRACES_SAMPLER` asks, hand the upstream a
//! `traceparent` whose parent is our span, and write the access line.

use std::fmt::Write as _;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use http::HeaderMap;

use crate::config::observe::{Root, Sampler};

pub use runr_base::traceparent::{parse_traceparent, Parent, TRACEPARENT};

/// Whether `sampler` samples a span of trace `trace_id` with caller `parent`.
pub fn sampled(sampler: &Sampler, trace_id: &[u8; 16], parent: Option<&Parent>) -> bool {
    match *sampler {
        Sampler::AlwaysOn => true,
        Sampler::AlwaysOff => false,
        Sampler::TraceIdRatio(r) => ratio_hit(trace_id, r),
        Sampler::ParentBased(root) => match parent {
            Some(p) => p.sampled,
            None => match root {
                Root::AlwaysOn => true,
                Root::AlwaysOff => false,
                Root::Ratio(r) => ratio_hit(trace_id, r),
            },
        },
    }
}

/// Deterministic in the trace id: its last 8 bytes (random in W3C version 00 ids) read as a
/// number below `ratio` × 2⁶⁴.
fn ratio_hit(trace_id: &[u8; 16], ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    (u64::from_be_bytes(low) as f64) < ratio * (u64::MAX as f64)
}

/// The wrapper's server span for one request.
#[derive(Debug, Clone)]
pub struct Span {
    /// The trace (the caller's, or new).
    pub trace_id: [u8; 16],
    /// Our span id.
    pub span_id: [u8; 8],
    /// The caller's span id, when the trace was continued.
    pub parent_span_id: Option<[u8; 8]>,
    /// Recorded and exported.
    pub sampled: bool,
    /// When the request arrived.
    pub start: SystemTime,
}

impl Span {
    /// Starts the span of a request with `headers`: continues a valid `traceparent`, or starts a
    /// new trace; the sampling decision is `sampler`'s.
    pub fn start(headers: &HeaderMap, sampler: &Sampler, start: SystemTime) -> Span {
        let parent = headers
            .get(TRACEPARENT)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_traceparent);
        let span_id = runr_base::traceparent::new_span_id();
        let trace_id = match &parent {
            Some(p) => p.trace_id,
            None => runr_base::traceparent::new_trace_id(),
        };
        Span {
            trace_id,
            span_id,
            parent_span_id: parent.map(|p| p.span_id),
            sampled: sampled(sampler, &trace_id, parent.as_ref()),
            start,
        }
    }

    /// The `traceparent` for the next hop: same trace, our span as the parent.
    pub fn traceparent(&self) -> String {
        runr_base::traceparent::format_traceparent(
            &self.trace_id,
            &self.span_id,
            u8::from(self.sampled),
        )
    }

    /// The trace id as 32 lower-case hex digits.
    pub fn trace_id_hex(&self) -> String {
        runr_base::fmt::hex(&self.trace_id)
    }
}

/// True for the first request this process serves, false for every later one.
pub fn take_cold_start() -> bool {
    static SERVED: AtomicBool = AtomicBool::new(false);
    !SERVED.swap(true, Ordering::Relaxed)
}

/// The access line, in the spec's shape:
/// `[runr-wrapper] trace_id=<32 hex> span_id=<16 hex> sampled=<bool> <METHOD> <path> <status> <ms>ms cold_start=<bool>`,
/// and, when the wrapper replaced the client's `X-Request-Id`, ` request_id=<the id given>
/// replaced_request_id=<what the client sent, cut>` after it.
///
/// Written without the log formatter, in its logfmt quoting all the same: the method and the
/// path, which a client chose, are bare tokens there, so every character that would split or
/// quote a token (a space, `=`, `"`, `\\`, U+0085 which the URI parser lets through, ...) is
/// percent-encoded; the ids are values.
pub fn access_line(
    span: &Span,
    method: &str,
    path: &str,
    status: u16,
    took: Duration,
    cold: bool,
    replaced_id: Option<(&str, &str)>,
) -> String {
    use runr_base::logfmt::{push_percent_encoded, push_value};
    let mut line = String::with_capacity(160 + path.len());
    let _ = write!(
        line,
        "{} trace_id={} span_id={} sampled={} ",
        super::PREFIX,
        runr_base::fmt::hex(&span.trace_id),
        runr_base::fmt::hex(&span.span_id),
        span.sampled,
    );
    push_percent_encoded(&mut line, method);
    line.push(' ');
    push_percent_encoded(&mut line, path);
    let _ = write!(
        line,
        " {status} {:.1}ms cold_start={cold}",
        took.as_secs_f64() * 1000.0
    );
    if let Some((id, original)) = replaced_id {
        line.push_str(" request_id=");
        push_value(&mut line, id);
        line.push_str(" replaced_request_id=");
        push_value(&mut line, original);
    }
    line.push('\n');
    line
}

/// The access line as a JSON object (`RUNR_LOG_FORMAT=json`) with the text line's fields:
/// `{"time","level":"info","source":"runr-wrapper","msg":"access","trace_id","span_id",
/// "sampled","method","path","status","duration_ms","cold_start"}` (`"request_id",
/// "replaced_request_id"` after them when the client's `X-Request-Id` was replaced), newline
/// included.
pub fn access_line_json(
    span: &Span,
    method: &str,
    path: &str,
    status: u16,
    took: Duration,
    cold: bool,
    replaced_id: Option<(&str, &str)>,
) -> Vec<u8> {
    let mut line = runr_base::log::JsonLine::new(tracing::Level::INFO, "runr-wrapper");
    line.str("msg", "access")
        .str("trace_id", &runr_base::fmt::hex(&span.trace_id))
        .str("span_id", &runr_base::fmt::hex(&span.span_id))
        .bool("sampled", span.sampled)
        .str("method", method)
        .str("path", path)
        .int("status", i64::from(status))
        // One decimal, as the text line.
        .num(
            "duration_ms",
            (took.as_secs_f64() * 10_000.0).round() / 10.0,
        )
        .bool("cold_start", cold);
    if let Some((id, original)) = replaced_id {
        line.str("request_id", id)
            .str("replaced_request_id", original);
    }
    line.finish()
}

/// Writes `line` to stderr in one write. Not through `tracing`: the line's shape is fixed by the
/// spec and must not depend on the log formatter's level or field rendering.
pub fn write_access_line(line: &[u8]) {
    let _ = std::io::stderr().lock().write_all(line);
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn span_continues_the_trace_with_a_new_span() {
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, TP.parse().unwrap());
        let s = Span::start(
            &h,
            &Sampler::ParentBased(Root::AlwaysOff),
            SystemTime::now(),
        );
        assert_eq!(s.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(
            s.parent_span_id.map(|p| runr_base::fmt::hex(&p)).as_deref(),
            Some("00f067aa0ba902b7")
        );
        assert!(s.sampled, "parent-based follows the caller's flag");
        let next = s.traceparent();
        assert!(next.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(!next.contains("00f067aa0ba902b7"));
        assert!(next.ends_with("-01"));

        let fresh = Span::start(
            &HeaderMap::new(),
            &Sampler::ParentBased(Root::AlwaysOff),
            SystemTime::now(),
        );
        assert!(fresh.parent_span_id.is_none());
        assert!(!fresh.sampled);
        assert_ne!(fresh.trace_id, s.trace_id);
    }

    #[test]
    fn samplers() {
        let never = Sampler::TraceIdRatio(0.0);
        let always = Sampler::TraceIdRatio(1.0);
        let half = Sampler::TraceIdRatio(0.5);
        let low = [0u8; 16];
        let mut high = [0xffu8; 16];
        assert!(!sampled(&never, &high, None));
        assert!(sampled(&always, &low, None));
        assert!(sampled(&half, &low, None));
        assert!(!sampled(&half, &high, None));
        high[8] = 0x70;
        assert!(sampled(&half, &high, None));
        let parent = Parent {
            trace_id: high,
            span_id: [1; 8],
            sampled: false,
            flags: 0,
        };
        let follow = Sampler::ParentBased(Root::AlwaysOn);
        assert!(
            !sampled(&follow, &high, Some(&parent)),
            "the caller decides"
        );
        assert!(sampled(&follow, &high, None));
    }

    fn span() -> Span {
        Span {
            trace_id: [0x4b; 16],
            span_id: [0x0f; 8],
            parent_span_id: None,
            sampled: true,
            start: SystemTime::now(),
        }
    }

    #[test]
    fn access_line_has_the_spec_shape() {
        let s = span();
        let line = access_line(
            &s,
            "GET",
            "/orders",
            500,
            Duration::from_micros(41_349),
            false,
            None,
        );
        assert_eq!(
            line,
            "[runr-wrapper] trace_id=4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b span_id=0f0f0f0f0f0f0f0f \
             sampled=true GET /orders 500 41.3ms cold_start=false\n"
        );
        let json = access_line_json(
            &s,
            "GET",
            "/orders",
            500,
            Duration::from_micros(41_349),
            false,
            None,
        );
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["msg"], "access");
        assert_eq!(v["source"], "runr-wrapper");
        assert_eq!(v["level"], "info");
        assert_eq!(v["trace_id"], "4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b");
        assert_eq!(v["span_id"], "0f0f0f0f0f0f0f0f");
        assert_eq!(v["sampled"], true);
        assert_eq!(
            (v["method"].as_str(), v["path"].as_str()),
            (Some("GET"), Some("/orders"))
        );
        assert_eq!(v["status"], 500);
        assert_eq!(v["duration_ms"], 41.3);
        assert_eq!(v["cold_start"], false);
        assert!(v.get("request_id").is_none());
        assert!(json.ends_with(b"}\n"));
    }

    #[test]
    fn a_replaced_request_id_is_said_after_the_spec_fields() {
        let s = span();
        let original = "x status=200 error=none";
        let line = access_line(
            &s,
            "GET",
            "/",
            500,
            Duration::ZERO,
            true,
            Some(("g-1", original)),
        );
        assert!(
            line.ends_with(
                " GET / 500 0.0ms cold_start=true request_id=g-1 \
                 replaced_request_id=\"x status=200 error=none\"\n"
            ),
            "{line}"
        );
        let json = access_line_json(
            &s,
            "GET",
            "/",
            500,
            Duration::ZERO,
            true,
            Some(("g-1", original)),
        );
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(
            (v["request_id"].as_str(), v["replaced_request_id"].as_str()),
            (Some("g-1"), Some(original))
        );
    }

    use proptest::prelude::*;

    proptest! {
        /// Whatever method, path and replaced id a client chose, the line parses (by the
        /// reference reader) into the spec's tokens, one status among them, the path a single
        /// token that percent-decodes back to the path, the replaced id exactly.
        #[test]
        fn a_client_cannot_forge_a_field_of_the_access_line(
            method in "[A-Z]{1,7}|[^%]{0,8}",
            path in "/([^%]|[ =\"\\\\\u{85}\u{2028}\u{202e}\u{a0}\t\r\n]){0,24}",
            original in proptest::option::of("\\PC{0,12}|( |=|\"|\\\\|\u{85}|\r|\n|status=200|é){0,8}"),
            status in 100u16..1000,
        ) {
            prop_assume!(method != "-", "the empty method's token");
            let s = span();
            let replaced = original.as_deref().map(|o| ("f-1", o));
            let line = access_line(&s, &method, &path, status, Duration::from_micros(1234), false, replaced);
            prop_assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
            let pairs = runr_testkit::logfmt::parse(&line[..line.len() - 1])
                .map_err(TestCaseError::fail)?;
            let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
            prop_assert_eq!(&keys[..4], &["[runr-wrapper]", "trace_id", "span_id", "sampled"][..]);
            prop_assert!(pairs[4].1.is_none() && pairs[5].1.is_none() && pairs[6].1.is_none());
            prop_assert_eq!(percent_decode(&pairs[4].0), method.clone());
            prop_assert_eq!(percent_decode(&pairs[5].0), path.clone());
            prop_assert_eq!(pairs[6].0.clone(), status.to_string());
            prop_assert_eq!(pairs[7].0.as_str(), "1.2ms");
            prop_assert_eq!(pairs[8].clone(), ("cold_start".to_string(), Some("false".to_string())));
            match &original {
                None => prop_assert_eq!(pairs.len(), 9),
                Some(o) => {
                    prop_assert_eq!(pairs.len(), 11);
                    prop_assert_eq!(pairs[9].clone(), ("request_id".to_string(), Some("f-1".to_string())));
                    prop_assert_eq!(pairs[10].clone(), ("replaced_request_id".to_string(), Some(o.clone())));
                }
            }
        }
    }

    /// `%XX` decoded (the strategies make no `%` of their own: one the client sent stays as it
    /// is, and a reader decodes it alike).
    fn percent_decode(token: &str) -> String {
        if token == "-" {
            return String::new();
        }
        let b = token.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                out.push(u8::from_str_radix(&token[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    }
}
