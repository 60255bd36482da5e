//! W3C Trace Context level 1: the `traceparent` value every hop reads and writes. Each binary
//! keeps what is its own around it (the wrapper's sampler, the queue's entry fields and
//! `tracestate`).

/// The header (and, in a queue entry, the field) carrying the trace context.
pub const TRACEPARENT: &str = "traceparent";

/// The caller's span, from a valid `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    /// The trace to continue.
    pub trace_id: [u8; 16],
    /// The caller's span id: the parent of the next span.
    pub span_id: [u8; 8],
    /// The caller's sampled flag (bit 0 of `flags`).
    pub sampled: bool,
    /// The trace flags as they came (version 00 defines the sampled bit only; a hop passes the
    /// others along).
    pub flags: u8,
}

/// Parses a `traceparent` value; `None` when it is invalid, in which case a new trace starts,
/// as the specification asks.
pub fn parse_traceparent(value: &str) -> Option<Parent> {
    let value = value.trim();
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
        sampled: flags & 1 == 1,
        flags,
    })
}

/// `00-<trace>-<span>-<flags>`: the value for the next hop, whose parent is `span_id`.
pub fn format_traceparent(trace_id: &[u8; 16], span_id: &[u8; 8], flags: u8) -> String {
    format!(
        "00-{}-{}-{flags:02x}",
        crate::fmt::hex(trace_id),
        crate::fmt::hex(span_id)
    )
}

/// A new span id: random, never all zeros (which W3C reserves for "invalid").
pub fn new_span_id() -> [u8; 8] {
    let mut id = [0u8; 8];
    crate::fmt::random_bytes(&mut id);
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

/// A new trace id: random, never all zeros.
pub fn new_trace_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    crate::fmt::random_bytes(&mut id);
    if id == [0; 16] {
        id[15] = 1;
    }
    id
}

/// Exactly `2 × N` lower-case hex digits (upper case is invalid in `traceparent`).
pub fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
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

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_parses_and_rejects() {
        let p = parse_traceparent(TP).unwrap();
        assert_eq!(
            crate::fmt::hex(&p.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(crate::fmt::hex(&p.span_id), "00f067aa0ba902b7");
        assert!(p.sampled);
        assert_eq!(p.flags, 1);
        assert!(
            !parse_traceparent(&TP.replace("-01", "-00"))
                .unwrap()
                .sampled
        );
        // A later version may carry more fields.
        assert!(parse_traceparent(&format!("01{}-extra", &TP[2..])).is_some());
        assert!(parse_traceparent(&format!(" {TP}\n")).is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn formats_what_it_parses() {
        let p = parse_traceparent(TP).unwrap();
        assert_eq!(format_traceparent(&p.trace_id, &p.span_id, p.flags), TP);
        let s = new_span_id();
        assert_ne!(s, [0; 8]);
        assert_ne!(new_trace_id(), new_trace_id());
        assert_eq!(unhex::<2>("0aff"), Some([0x0a, 0xff]));
        assert_eq!(unhex::<2>("0aF0"), None);
    }
}
