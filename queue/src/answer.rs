//! What the function's answer means for the entry: acknowledge it, retry it (and how soon at
//! the earliest), or dead-letter it now. The headers read here come from the function (or the
//! wrapper in front of it): parsed strictly, bounded, never trusted to be well-formed.

use std::time::{Duration, SystemTime};

use crate::config::AtOnce;

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
    /// A 429's or 503's `Retry-After`, capped at [`RETRY_AFTER_CEILING`].
    pub retry_after: Option<Duration>,
}

/// What to do with the entry after one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx: acknowledge.
    Done,
    /// The operator listed this class or status in `RUNR_QUEUE_DEAD_LETTER_AT_ONCE`: retrying
    /// cannot help, dead-letter now.
    DeadLetter,
    /// A failed attempt; the next one no earlier than `floor` (a 429's or 503's `Retry-After`).
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
        // The two statuses whose Retry-After RFC 9110 defines as "how long to wait" (§15.5.20,
        // §15.6.4); on a 3xx it is a redirect's, which means nothing here.
        let retry_after = if status == 429 || status == 503 {
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

    /// The entry's fate: a 2xx acknowledges; every other answer is retried (the spec's rule),
    /// unless its status or class is one the operator listed in `at_once`.
    pub fn verdict(&self, at_once: &AtOnce) -> Verdict {
        match self.status {
            200..=299 => Verdict::Done,
            s if at_once.matches(s, self.error_class.as_deref()) => Verdict::DeadLetter,
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
    fn every_non_2xx_is_retried_by_default() {
        let none = AtOnce::default();
        assert_eq!(answer(200, &[]).verdict(&none), Verdict::Done);
        assert_eq!(answer(204, &[]).verdict(&none), Verdict::Done);
        // The wrapper's own 413 too: the spec retries every non-2xx answer.
        for (status, class) in [
            (413, Some("limit")),
            (413, None),
            (500, Some("crash")),
            (504, Some("timeout")),
            (400, None),
            (302, None),
        ] {
            let headers: Vec<(&'static str, &str)> =
                class.iter().map(|c| (ERROR_HEADER, *c)).collect();
            assert_eq!(
                answer(status, &headers).verdict(&none),
                Verdict::Retry { floor: None },
                "{status} {class:?}"
            );
        }
        let a = answer(504, &[(ERROR_HEADER, " timeout ")]);
        assert_eq!(a.error_class.as_deref(), Some("timeout"));
    }

    #[test]
    fn the_operators_list_dead_letters_at_once() {
        let list = AtOnce {
            classes: vec!["limit".into()],
            statuses: vec![400, 422],
        };
        assert_eq!(
            answer(413, &[(ERROR_HEADER, "LIMIT")]).verdict(&list),
            Verdict::DeadLetter
        );
        assert_eq!(
            answer(502, &[(ERROR_HEADER, "limit")]).verdict(&list),
            Verdict::DeadLetter
        );
        assert_eq!(answer(422, &[]).verdict(&list), Verdict::DeadLetter);
        assert_eq!(
            answer(400, &[(ERROR_HEADER, "crash")]).verdict(&list),
            Verdict::DeadLetter
        );
        // The handler's own 413 carries no class: not listed, retried.
        assert_eq!(
            answer(413, &[]).verdict(&list),
            Verdict::Retry { floor: None }
        );
        assert_eq!(
            answer(500, &[(ERROR_HEADER, "crash")]).verdict(&list),
            Verdict::Retry { floor: None }
        );
        // A listed 2xx cannot exist (the config refuses it), and a 2xx always acknowledges.
        let odd = AtOnce {
            classes: vec!["limit".into()],
            statuses: vec![],
        };
        assert_eq!(
            answer(200, &[(ERROR_HEADER, "limit")]).verdict(&odd),
            Verdict::Done
        );
    }

    #[test]
    fn retry_after_is_read_on_429_and_503_only() {
        let none = AtOnce::default();
        for status in [429, 503] {
            assert_eq!(
                answer(status, &[("retry-after", "7")]).verdict(&none),
                Verdict::Retry {
                    floor: Some(Duration::from_secs(7))
                },
                "{status}"
            );
            // An HTTP date, 90 s after `answer`'s clock.
            let date =
                httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_090));
            assert_eq!(
                answer(status, &[("retry-after", &date)]).retry_after,
                Some(Duration::from_secs(90))
            );
            assert_eq!(
                answer(status, &[("retry-after", "86400")]).retry_after,
                Some(RETRY_AFTER_CEILING)
            );
        }
        for status in [500, 502, 301, 413] {
            assert_eq!(
                answer(status, &[("retry-after", "7")]).verdict(&none),
                Verdict::Retry { floor: None },
                "{status}"
            );
        }
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
