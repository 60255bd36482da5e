//! The schedule CloudEvent, in the HTTP binary content mode: attributes as `ce-*` headers, the
//! data as the body.

use std::time::SystemTime;

use runr_base::fmt::{rfc3339, uuid_v4};

pub use runr_base::cloudevent::{
    CONTENT_TYPE, QUEUE_EVENT_TYPE, SCHEDULE_EVENT_SOURCE as EVENT_SOURCE,
    SCHEDULE_EVENT_TYPE as EVENT_TYPE, SPECVERSION,
};
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_ticks_differ_in_id_only() {
        let (a, b) = (ScheduleEvent::new(), ScheduleEvent::new());
        assert_ne!(a.id, b.id);
        assert_eq!(a.id.len(), 36);
        assert_eq!(&a.id[14..15], "4", "a UUID v4: {}", a.id);
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
