//! The schedule CloudEvent, in the HTTP binary content mode: attributes as `ce-*` headers, the
//! data as the body.

use std::time::{SystemTime, UNIX_EPOCH};

/// CloudEvents specification version of every event we send.
pub const SPECVERSION: &str = "1.0";
/// `ce-type` of a schedule tick.
pub const EVENT_TYPE: &str = "dev.runr.schedule.tick";
/// `ce-source` of a schedule tick.
pub const EVENT_SOURCE: &str = "/runr/schedule";
/// Content type of the event data.
pub const CONTENT_TYPE: &str = "application/json";
/// The event data: the same body every runtime receives for a tick.
pub const BODY: &[u8] = br#"{"trigger":"schedule"}"#;

/// One schedule tick: what differs between two ticks is only the id and the time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleEvent {
    /// `ce-id`: a random UUID (version 4), unique per tick.
    pub id: String,
    /// `ce-time`: when the tick was created, RFC 3339 in UTC.
    pub time: String,
}

impl ScheduleEvent {
    /// A new tick with a fresh id, timed now.
    pub fn new() -> ScheduleEvent {
        ScheduleEvent {
            id: uuid_v4(),
            time: rfc3339(SystemTime::now()),
        }
    }

    /// The HTTP headers of the binary content mode, lower-case names, in a stable order.
    pub fn headers(&self) -> [(&'static str, &str); 6] {
        [
            ("ce-specversion", SPECVERSION),
            ("ce-type", EVENT_TYPE),
            ("ce-source", EVENT_SOURCE),
            ("ce-id", &self.id),
            ("ce-time", &self.time),
            ("content-type", CONTENT_TYPE),
        ]
    }
}

impl Default for ScheduleEvent {
    fn default() -> Self {
        ScheduleEvent::new()
    }
}

/// Fills `buf` from the OS random source.
///
/// getrandom(2) only fails before the kernel's pool is initialised (early boot) or under seccomp
/// policies that forbid it; a clock-derived fallback keeps ids unique enough for those cases
/// rather than failing the tick.
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

/// The `YYYY-MM-DD` date of a Unix time and the seconds into that day.
fn split_days(unix_secs: u64) -> (String, u64) {
    let (days, secs) = (unix_secs / 86_400, unix_secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    (format!("{y:04}-{m:02}-{d:02}"), secs)
}

/// Gregorian date of a day count since 1970-01-01.
///
/// Hand-written (Howard Hinnant's `civil_from_days`) because a date crate would be the only
/// reason to pull chrono or time into binaries that format one timestamp.
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
    }

    #[test]
    fn ids_are_uuid_v4_and_unique() {
        let a = uuid_v4();
        let b = uuid_v4();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }

    #[test]
    fn headers_carry_every_required_attribute() {
        let ev = ScheduleEvent::new();
        let h = ev.headers();
        let get = |n: &str| h.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        assert_eq!(get("ce-specversion"), Some("1.0"));
        assert_eq!(get("ce-type"), Some("dev.runr.schedule.tick"));
        assert_eq!(get("ce-source"), Some("/runr/schedule"));
        assert_eq!(get("ce-id"), Some(ev.id.as_str()));
        assert_eq!(get("content-type"), Some("application/json"));
        assert!(get("ce-time").unwrap().ends_with('Z'));
        assert_eq!(BODY, br#"{"trigger":"schedule"}"#);
    }
}
