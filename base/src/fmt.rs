//! Small formatters every binary needs: hex, RFC 3339 timestamps, random ids, error chains, and
//! a control-character escape for untrusted text kept inside a message (a registry's answer
//! quoted in an error). Log lines themselves are quoted by [`crate::logfmt`].

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

/// Fills `buf` from the OS random source.
///
/// getrandom(2) only fails before the kernel's pool is initialised (early boot) or under seccomp
/// policies that forbid it; a clock-derived fallback keeps ids unique enough for those cases
/// rather than failing the caller (ids here are correlation ids, not secrets).
pub fn random_bytes(buf: &mut [u8]) {
    if getrandom::fill(buf).is_err() {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let seed = nanos ^ (u128::from(std::process::id()) << 64);
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (seed >> ((i % 16) * 8)) as u8 ^ (i as u8).wrapping_mul(151);
        }
    }
}

/// `N` random bytes as `2N` lower-case hex digits (trace ids, span ids, request ids).
pub fn random_hex<const N: usize>() -> String {
    let mut b = [0u8; N];
    random_bytes(&mut b);
    hex(&b)
}

/// A random UUID, version 4, in its hyphenated lower-case form.
pub fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    random_bytes(&mut b);
    // RFC 9562: version 4 in the high nibble of byte 6, variant 10xx in byte 8.
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex(&b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// `t` as RFC 3339 in UTC with whole seconds (`2026-10-10T12:00:00Z`), the form of the spec's
/// examples.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (date, secs) = split_days(d.as_secs());
    format!(
        "{date}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// `t` as RFC 3339 in UTC with milliseconds (`2026-10-10T12:00:00.123Z`), for log-like records.
pub fn rfc3339_millis(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (date, secs) = split_days(d.as_secs());
    format!(
        "{date}T{:02}:{:02}:{:02}.{:03}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        d.subsec_millis()
    )
}

/// Milliseconds since the Unix epoch (deadlines handed to user code, `timeEpoch` fields).
pub fn unix_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The `YYYY-MM-DD` date of a Unix time and the seconds into that day.
fn split_days(unix_secs: u64) -> (String, u64) {
    let (days, secs) = (unix_secs / 86_400, unix_secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    (format!("{y:04}-{m:02}-{d:02}"), secs)
}

/// Gregorian date of a day count since 1970-01-01.
///
/// Hand-written (Howard Hinnant's `civil_from_days`) because a date crate would be the only
/// reason to pull chrono or time into binaries that format a timestamp.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `err` and its causes joined with `: `, leaving out a cause whose text the chain already
/// holds (reqwest, hyper and oci-client repeat their source in their own message, and hide the
/// interesting part, "connection refused", in the source).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let msg = cause.to_string();
        if !msg.is_empty() && !holds(&text, &msg) {
            text.push_str(": ");
            text.push_str(&msg);
        }
        source = cause.source();
    }
    text
}

/// Whether `needle` (not empty) occurs in `haystack`: a plain scan, as `str::contains` would
/// answer. Chains are a few hundred bytes; the two-way searcher `contains` inlines here cost
/// the smallest binary (runr-tick) 3.5 KiB.
fn holds(haystack: &str, needle: &str) -> bool {
    haystack
        .as_bytes()
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Appends `text` to `out` with every control character escaped (`\n`, `\r`, `\t`, `\u{1b}`),
/// so text a client or a user program chose can never start a new log line or move the
/// terminal's cursor. Everything else, non-ASCII included, is kept as it is.
pub fn push_escaped(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// [`push_escaped`] into a new string; borrows when nothing needs escaping.
pub fn escape_control(text: &str) -> std::borrow::Cow<'_, str> {
    if text.chars().any(char::is_control) {
        let mut out = String::with_capacity(text.len() + 8);
        push_escaped(&mut out, text);
        std::borrow::Cow::Owned(out)
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn rfc3339_matches_known_dates() {
        assert_eq!(rfc3339(at(0)), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(at(1_728_561_600)), "2024-10-10T12:00:00Z");
        assert_eq!(rfc3339(at(951_782_400)), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(at(4_102_444_799)), "2099-12-31T23:59:59Z");
        assert_eq!(
            rfc3339_millis(at(1_728_561_600) + Duration::from_millis(7)),
            "2024-10-10T12:00:00.007Z"
        );
        assert_eq!(
            unix_millis(at(1_728_561_600) + Duration::from_millis(7)),
            1_728_561_600_007
        );
    }

    #[test]
    fn ids_are_uuid_v4_and_unique() {
        let a = uuid_v4();
        let b = uuid_v4();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
        let t = random_hex::<16>();
        assert_eq!(t.len(), 32);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(t, random_hex::<16>());
    }

    #[test]
    fn hex_is_lower_case() {
        assert_eq!(hex(&[0x00, 0xab, 0xff, 0x10]), "00abff10");
        assert_eq!(hex(&[]), "");
    }

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn error_chain_skips_repeated_causes() {
        let inner = E("connection refused", None);
        let mid = E(
            "error sending request: connection refused",
            Some(Box::new(inner)),
        );
        let top = E("cannot reach the registry", Some(Box::new(mid)));
        assert_eq!(
            error_chain(&top),
            "cannot reach the registry: error sending request: connection refused"
        );
        assert_eq!(error_chain(&E("alone", None)), "alone");
        assert_eq!(
            error_chain(&E("", Some(Box::new(E("cause", None))))),
            ": cause",
            "an empty top message still gets its cause"
        );
    }

    #[test]
    fn holds_answers_as_contains() {
        for (h, n) in [
            ("abc", "abc"),
            ("abc", "b"),
            ("abc", "abcd"),
            ("", "a"),
            ("ünïcode", "ï"),
            ("aab", "ab"),
            ("x: y", ": y"),
        ] {
            assert_eq!(holds(h, n), h.contains(n), "{h:?} {n:?}");
        }
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            escape_control("a\r\nINFO forged\tx\u{1b}[31m"),
            "a\\r\\nINFO forged\\tx\\u{1b}[31m"
        );
        assert!(matches!(
            escape_control("plain ünïcode"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(escape_control("\u{7f}\u{85}"), "\\u{7f}\\u{85}");
    }
}
