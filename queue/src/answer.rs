//! What the function's answer means for the entry: acknowledge it, retry it (and how soon at
//! the earliest), or dead-letter it now. The headers read here come from the function (or the
//! wrapper in front of it): parsed strictly, bounded, never trusted to be well-formed.

use std::time::{Duration, SystemTime};

/// The error-class header the wrapper sets on answers it makes itself (timeout, crash, limit…).
pub const ERROR_HEADER: &str = "x-runr-error";

/// The longest `Retry-After` honoured; a larger one (or a date further ahead) waits this long.
pub const RETRY_AFTER_CEILING: Duration = Duration::from_secs(3600);

/// The parts of an answer that decide an entry's fate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status code.
    pub status: u16,
    /// The `X-RunR-Error` class, when the wrapper sent a well-formed one.
    pub error_class: Option<String>,
    /// A 503's `Retry-After`, capped at [`RETRY_AFTER_CEILING`].
    pub retry_after: Option<Duration>,
}

/// What to do with the entry after one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx: acknowledge.
    Done,
    /// Retrying cannot help (413 with `X-RunR-Error: limit`): dead-letter now.
    DeadLetter,
    /// A failed attempt; the next one no earlier than `floor` (a 503's `Retry-After`).
    Retry {
        /// The least wait before the next attempt.
        floor: Option<Duration>,
    },
}

impl Answer {
    /// Reads status and headers; `now` is the clock `Retry-After` dates are measured from.
    pub fn from_head(status: u16, headers: &http::HeaderMap, now: SystemTime) -> Answer {
        let error_class = headers
            .get(ERROR_HEADER)
            .and_then(|v| parse_error_class(v.as_bytes()));
        let retry_after = if status == 503 {
            headers
                .get(http::header::RETRY_AFTER)
                .and_then(|v| parse_retry_after(v.as_bytes(), now))
        } else {
            None
        };
        Answer {
            status,
            error_class,
            retry_after,
        }
    }

    /// The entry's fate.
    pub fn verdict(&self) -> Verdict {
        match self.status {
            200..=299 => Verdict::Done,
            413 if self.error_class.as_deref() == Some("limit") => Verdict::DeadLetter,
            _ => Verdict::Retry {
                floor: self.retry_after,
            },
        }
    }
}

/// An error class: 1 to 64 characters of `A-Z a-z 0-9 . _ -` (surrounding blanks ignored),
/// lower-cased; anything else is not a class we can act on or store.
pub fn parse_error_class(value: &[u8]) -> Option<String> {
    let v = value.trim_ascii();
    let ok = !v.is_empty()
        && v.len() <= 64
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    ok.then(|| String::from_utf8_lossy(v).to_ascii_lowercase())
}

/// `Retry-After` (RFC 9110 §10.2.3): delay-seconds (digits only) or an HTTP-date, as a wait from
/// `now` (zero for a date in the past), capped at [`RETRY_AFTER_CEILING`].
pub fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let v = std::str::from_utf8(value).ok()?.trim();
    if v.is_empty() {
        return None;
    }
    if v.bytes().all(|b| b.is_ascii_digit()) {
        // Any number of digits: past the ceiling it no longer matters how many.
        let secs = v.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs).min(RETRY_AFTER_CEILING));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(RETRY_AFTER_CEILING),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn answer(status: u16, headers: &[(&'static str, &str)]) -> Answer {
        let mut map = http::HeaderMap::new();
        for (k, v) in headers {
            map.append(*k, HeaderValue::from_str(v).unwrap());
        }
        Answer::from_head(
            status,
            &map,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000),
        )
    }

    #[test]
    fn verdicts() {
        assert_eq!(answer(200, &[]).verdict(), Verdict::Done);
        assert_eq!(answer(204, &[]).verdict(), Verdict::Done);
        assert_eq!(
            answer(413, &[(ERROR_HEADER, "limit")]).verdict(),
            Verdict::DeadLetter
        );
        assert_eq!(
            answer(413, &[(ERROR_HEADER, "LIMIT")]).verdict(),
            Verdict::DeadLetter
        );
        // The handler's own 413 (no class) and other classes are retried.
        assert_eq!(answer(413, &[]).verdict(), Verdict::Retry { floor: None });
        assert_eq!(
            answer(500, &[(ERROR_HEADER, "crash")]).verdict(),
            Verdict::Retry { floor: None }
        );
        assert_eq!(answer(302, &[]).verdict(), Verdict::Retry { floor: None });
        assert_eq!(
            answer(503, &[("retry-after", "7")]).verdict(),
            Verdict::Retry {
                floor: Some(Duration::from_secs(7))
            }
        );
        // Only a 503's Retry-After counts.
        assert_eq!(
            answer(500, &[("retry-after", "7")]).verdict(),
            Verdict::Retry { floor: None }
        );
        let a = answer(504, &[(ERROR_HEADER, " timeout ")]);
        assert_eq!(a.error_class.as_deref(), Some("timeout"));
    }

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        let p = |v: &str| parse_retry_after(v.as_bytes(), now);
        assert_eq!(p("0"), Some(Duration::ZERO));
        assert_eq!(p(" 120 "), Some(Duration::from_secs(120)));
        assert_eq!(p("3600"), Some(RETRY_AFTER_CEILING));
        assert_eq!(p("3601"), Some(RETRY_AFTER_CEILING));
        assert_eq!(p("99999999999999999999999"), Some(RETRY_AFTER_CEILING));
        // Sun, 06 Nov 1994 08:49:37 GMT is 784111777: 60 s later, and in the past.
        assert_eq!(
            p("Sun, 06 Nov 1994 08:50:37 GMT"),
            Some(Duration::from_secs(60))
        );
        assert_eq!(p("Sun, 06 Nov 1994 08:48:37 GMT"), Some(Duration::ZERO));
        let far = httpdate::fmt_http_date(now + Duration::from_secs(10 * 86_400));
        assert_eq!(p(&far), Some(RETRY_AFTER_CEILING));
        for bad in ["", "-1", "1.5", "+5", "soon", "5s", "0x10"] {
            assert_eq!(p(bad), None, "{bad:?}");
        }
        assert_eq!(parse_retry_after(b"\xff", now), None);
    }

    #[test]
    fn error_classes() {
        assert_eq!(parse_error_class(b"limit").as_deref(), Some("limit"));
        assert_eq!(
            parse_error_class(b"Over_Load-2.x").as_deref(),
            Some("over_load-2.x")
        );
        let long = "a".repeat(65);
        for bad in [
            &b""[..],
            b"  ",
            b"a b",
            b"a\"b",
            b"\xff",
            b"a,b",
            long.as_bytes(),
        ] {
            assert_eq!(parse_error_class(bad), None, "{bad:?}");
        }
    }

    /// The reference: the rule written the slow, obvious way.
    fn class_reference(v: &[u8]) -> Option<String> {
        let s = std::str::from_utf8(v).ok()?;
        let t = s.trim_matches(|c: char| c.is_ascii_whitespace());
        let ok = (1..=64).contains(&t.chars().count())
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        ok.then(|| t.to_lowercase())
    }

    proptest! {
        #[test]
        fn error_class_matches_reference(v in proptest::collection::vec(any::<u8>(), 0..80)) {
            prop_assert_eq!(parse_error_class(&v), class_reference(&v));
        }

        #[test]
        fn error_class_of_tokens(v in "[ ]{0,2}[A-Za-z0-9._-]{1,70}[ ]{0,2}") {
            prop_assert_eq!(parse_error_class(v.as_bytes()), class_reference(v.as_bytes()));
        }

        /// Seconds give that many seconds, capped; dates give the distance from now, capped;
        /// nothing panics on any bytes.
        #[test]
        fn retry_after_reference(secs in 0u64..10_000, ahead in 0u64..10_000, junk in proptest::collection::vec(any::<u8>(), 0..40)) {
            let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
            let cap = |s: u64| Duration::from_secs(s).min(RETRY_AFTER_CEILING);
            prop_assert_eq!(parse_retry_after(secs.to_string().as_bytes(), now), Some(cap(secs)));
            let date = httpdate::fmt_http_date(now + Duration::from_secs(ahead));
            prop_assert_eq!(parse_retry_after(date.as_bytes(), now), Some(cap(ahead)));
            let _ = parse_retry_after(&junk, now);
        }
    }
}
