//! W3C Trace Context for deliveries: every attempt carries a `traceparent`. When the producer
//! wrote one into the entry (a field named `traceparent`, W3C level 1), the delivery continues
//! its trace as a child span (and passes the entry's `tracestate` along); otherwise it starts a
//! new trace. One trace per entry in hand, a new span id per attempt, so the wrapper (which
//! continues the `traceparent` it receives) and the function join the producer's trace.
//!
//! The trace id is in the delivery's log lines; with an OTLP endpoint set, each attempt's span
//! is exported (`consumer`, through runr-base's exporter, the wrapper's).

use std::time::SystemTime;

/// The field of an entry (and the HTTP header) that carries the trace context.
pub(crate) use runr_base::traceparent::TRACEPARENT;
/// The vendor part of the trace context, passed along with a continued trace.
pub(crate) const TRACESTATE: &str = "tracestate";
/// The longest `tracestate` passed along (W3C: 32 members of at most 256 bytes; 512 is what
/// implementations must at least propagate).
const MAX_TRACESTATE: usize = 512;

/// The trace of one entry's delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trace {
    pub trace_id: [u8; 16],
    /// The producer's span, when the trace was continued.
    pub parent: Option<[u8; 8]>,
    /// Trace flags (bit 0: sampled): the producer's, or sampled for a new trace (the wrapper's
    /// sampler decides for its own spans).
    pub flags: u8,
    /// The entry's `tracestate`, with a continued trace only.
    pub tracestate: Option<String>,
}

/// Parses a `traceparent` field (W3C Trace Context level 1, bytes as Redis holds them); `None`
/// when it is invalid (a new trace then starts, as the specification asks).
pub(crate) fn parse_traceparent(value: &[u8]) -> Option<runr_base::traceparent::Parent> {
    runr_base::traceparent::parse_traceparent(std::str::from_utf8(value).ok()?)
}

/// One attempt's span: its id (the function's parent) and the `traceparent` that says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attempt {
    pub span_id: [u8; 8],
    pub traceparent: String,
    pub start: SystemTime,
}

/// The value of the last field named `name`.
fn field<'a>(fields: &'a [(Vec<u8>, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .rev()
        .find(|(n, _)| n == name.as_bytes())
        .map(|(_, v)| v.as_slice())
}

/// A `tracestate` worth passing along: visible ASCII, spaces and tabs, within the bound.
fn tracestate(v: &[u8]) -> Option<String> {
    let v = v.trim_ascii();
    let ok = !v.is_empty()
        && v.len() <= MAX_TRACESTATE
        && v.iter()
            .all(|b| b.is_ascii_graphic() || *b == b' ' || *b == b'\t');
    ok.then(|| String::from_utf8_lossy(v).into_owned())
}

impl Trace {
    /// The trace of an entry with `fields`: the producer's continued, or a new one.
    pub(crate) fn of_entry(fields: &[(Vec<u8>, Vec<u8>)]) -> Trace {
        match field(fields, TRACEPARENT).and_then(parse_traceparent) {
            Some(p) => Trace {
                trace_id: p.trace_id,
                parent: Some(p.span_id),
                flags: p.flags,
                tracestate: field(fields, TRACESTATE).and_then(tracestate),
            },
            None => Trace {
                trace_id: runr_base::traceparent::new_trace_id(),
                parent: None,
                flags: 1,
                tracestate: None,
            },
        }
    }

    /// The trace id as 32 lower-case hex digits, for log lines.
    pub(crate) fn trace_id_hex(&self) -> String {
        runr_base::fmt::hex(&self.trace_id)
    }

    /// Whether the trace is sampled (the producer's flag; a new trace is): only sampled spans
    /// are exported.
    pub(crate) fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// One attempt: this trace, a new span id (the attempt's span), starting now.
    pub(crate) fn attempt(&self) -> Attempt {
        let span_id = runr_base::traceparent::new_span_id();
        Attempt {
            span_id,
            // Version 00 defines the sampled bit only; the others are passed as they came.
            traceparent: runr_base::traceparent::format_traceparent(
                &self.trace_id,
                &span_id,
                self.flags,
            ),
            start: SystemTime::now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn f(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn traceparents() {
        let p = parse_traceparent(TP.as_bytes()).unwrap();
        assert_eq!(
            runr_base::fmt::hex(&p.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(runr_base::fmt::hex(&p.span_id), "00f067aa0ba902b7");
        assert_eq!(p.flags, 1);
        assert!(parse_traceparent(format!("01{}-extra", &TP[2..]).as_bytes()).is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(bad.as_bytes()).is_none(), "{bad:?}");
        }
        assert!(parse_traceparent(b"\xff").is_none());
    }

    #[test]
    fn an_entry_continues_its_producers_trace_or_starts_one() {
        let t = Trace::of_entry(&f(&[
            ("k", "v"),
            ("traceparent", TP),
            ("tracestate", "ro=1"),
        ]));
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.tracestate.as_deref(), Some("ro=1"));
        let attempt = t.attempt();
        let a = attempt.traceparent.clone();
        let next = parse_traceparent(a.as_bytes()).unwrap();
        assert_eq!(next.trace_id, t.trace_id);
        assert_eq!(next.span_id, attempt.span_id);
        assert_ne!(runr_base::fmt::hex(&next.span_id), "00f067aa0ba902b7");
        assert_ne!(t.attempt().traceparent, a, "a new span per attempt");
        assert!(a.ends_with("-01"));
        assert!(t.sampled());
        // Not sampled by the producer: passed on as it is.
        let unsampled = Trace::of_entry(&f(&[("traceparent", &TP.replace("-01", "-00"))]));
        assert!(unsampled.attempt().traceparent.ends_with("-00"));
        assert!(!unsampled.sampled());
        // None, or an invalid one: a new trace each time, sampled, no tracestate.
        for fields in [
            f(&[("k", "v")]),
            f(&[("traceparent", "nope"), ("tracestate", "x=1")]),
        ] {
            let (a, b) = (Trace::of_entry(&fields), Trace::of_entry(&fields));
            assert_ne!(a.trace_id, b.trace_id);
            assert_eq!(
                (a.parent, a.flags, a.tracestate.as_deref()),
                (None, 1, None)
            );
            assert!(parse_traceparent(a.attempt().traceparent.as_bytes()).is_some());
        }
        assert_eq!(tracestate(b"a=1\n"), Some("a=1".into()));
        assert_eq!(tracestate(b"a=\x01"), None);
        assert_eq!(tracestate(&[b'a'; 513]), None);
    }

    proptest! {
        /// Whatever the producer wrote: the header sent is a valid traceparent.
        #[test]
        fn any_field_gives_a_valid_traceparent(v in proptest::collection::vec(any::<u8>(), 0..80)) {
            let fields = vec![(b"traceparent".to_vec(), v)];
            let t = Trace::of_entry(&fields);
            prop_assert!(parse_traceparent(t.attempt().traceparent.as_bytes()).is_some());
        }
    }
}
