//! W3C Trace Context for deliveries: every attempt carries a `traceparent`. When the producer
//! wrote one into the entry (a field named `traceparent`, W3C level 1), the delivery continues
//! its trace as a child span (and passes the entry's `tracestate` along); otherwise it starts a
//! new trace. One trace per entry in hand, a new span id per attempt, so the wrapper (which
//! continues the `traceparent` it receives) and the function join the producer's trace.
//!
//! The spans are not exported (no OTLP here): the trace id is in the delivery's log lines.

/// The field of an entry (and the HTTP header) that carries the trace context.
pub(crate) const TRACEPARENT: &str = "traceparent";
/// The vendor part of the trace context, passed along with a continued trace.
pub(crate) const TRACESTATE: &str = "tracestate";
/// The longest `tracestate` passed along (W3C: 32 members of at most 256 bytes; 512 is what
/// implementations must at least propagate).
const MAX_TRACESTATE: usize = 512;

/// The producer's span, from a valid `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Parent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

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

/// Parses a `traceparent` value (W3C Trace Context level 1); `None` when it is invalid (a new
/// trace then starts, as the specification asks).
pub(crate) fn parse_traceparent(value: &[u8]) -> Option<Parent> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let mut parts = value.splitn(5, '-');
    let version = parts.next()?;
    let trace = parts.next()?;
    let span = parts.next()?;
    let flags = parts.next()?;
    let rest = parts.next();
    let [version]: [u8; 1] = unhex(version)?;
    // ff is forbidden; version 00 has exactly four fields, later versions may append more.
    if version == 0xff || (version == 0 && rest.is_some()) {
        return None;
    }
    let trace_id: [u8; 16] = unhex(trace)?;
    let span_id: [u8; 8] = unhex(span)?;
    let [flags]: [u8; 1] = unhex(flags)?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id,
        span_id,
        flags,
    })
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    // Upper-case hex is invalid in traceparent.
    if s.len() != N * 2
        || !s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[i * 2..i * 2 + 2], 16).ok()?;
    }
    Some(out)
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
            None => {
                let mut trace_id = [0u8; 16];
                runr_base::fmt::random_bytes(&mut trace_id);
                if trace_id == [0; 16] {
                    trace_id[15] = 1;
                }
                Trace {
                    trace_id,
                    parent: None,
                    flags: 1,
                    tracestate: None,
                }
            }
        }
    }

    /// The trace id as 32 lower-case hex digits, for log lines.
    pub(crate) fn trace_id_hex(&self) -> String {
        runr_base::fmt::hex(&self.trace_id)
    }

    /// The `traceparent` of one attempt: this trace, a new span id (the attempt's span).
    pub(crate) fn attempt(&self) -> String {
        let mut span_id = [0u8; 8];
        runr_base::fmt::random_bytes(&mut span_id);
        if span_id == [0; 8] {
            span_id[7] = 1;
        }
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id_hex(),
            runr_base::fmt::hex(&span_id),
            // Version 00 defines the sampled bit only; the others are passed as they came.
            self.flags
        )
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
        let a = t.attempt();
        let next = parse_traceparent(a.as_bytes()).unwrap();
        assert_eq!(next.trace_id, t.trace_id);
        assert_ne!(runr_base::fmt::hex(&next.span_id), "00f067aa0ba902b7");
        assert_ne!(t.attempt(), a, "a new span per attempt");
        assert!(a.ends_with("-01"));
        // Not sampled by the producer: passed on as it is.
        let unsampled = Trace::of_entry(&f(&[("traceparent", &TP.replace("-01", "-00"))]));
        assert!(unsampled.attempt().ends_with("-00"));
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
            assert!(parse_traceparent(a.attempt().as_bytes()).is_some());
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
            prop_assert!(parse_traceparent(t.attempt().as_bytes()).is_some());
        }
    }
}
