//! Which trigger an invocation comes from, decided in one place for every mode: the envelope's
//! `trigger` and `event`, exec mode's `RUNR_TRIGGER`/`RUNR_EVENT_*`, lambda mode's event shape,
//! the metrics' `trigger` label, spans, replay captures and the invocation line all follow it.
//!
//! - `RUNR_TRIGGER` set: it decides for the whole pod. An http-triggered pod never takes a
//!   client's `ce-type` header for a queue event, whatever the client sends.
//! - Unset, `RUNR_MODE=schedule` (what the platform sets in a CronJob's container): the schedule
//!   trigger, so the wrapper runs the one-shot instead of serving.
//! - Otherwise each request's own binary-mode CloudEvent decides: `ce-type:
//!   dev.runr.queue.message` (runr-queue) is a queue invocation, `dev.runr.schedule.tick`
//!   (runr-tick, `runr-wrapper tick`) a schedule one, anything else http.

use http::HeaderMap;

use crate::config::{Config, Trigger};

/// The value of `RUNR_MODE` that makes a pod without `RUNR_TRIGGER` a schedule one.
pub const SCHEDULE_MODE: &str = "schedule";

/// How the pod decides each invocation's trigger; fixed when the wrapper starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerRule {
    /// Every invocation has this trigger (`RUNR_TRIGGER`, or `RUNR_MODE=schedule`).
    Fixed(Trigger),
    /// Each request's CloudEvent says (http when it carries none of RunR's).
    PerRequest,
}

impl TriggerRule {
    /// The rule for `RUNR_TRIGGER` (`fixed`, when set) and `RUNR_MODE` (`run_mode`).
    pub fn new(fixed: Option<Trigger>, run_mode: Option<&str>) -> TriggerRule {
        match fixed {
            Some(trigger) => TriggerRule::Fixed(trigger),
            None if run_mode == Some(SCHEDULE_MODE) => TriggerRule::Fixed(Trigger::Schedule),
            None => TriggerRule::PerRequest,
        }
    }

    /// The rule of `config` (its `RUNR_TRIGGER` and `RUNR_MODE`).
    pub fn of_config(config: &Config) -> TriggerRule {
        TriggerRule::new(config.trigger, config.run_mode.as_deref())
    }

    /// True when the pod runs the schedule one-shot (one tick, then exit) instead of serving.
    pub fn runs_once(self) -> bool {
        self == TriggerRule::Fixed(Trigger::Schedule)
    }

    /// The trigger of a request with `headers`.
    pub fn of(self, headers: &HeaderMap) -> Trigger {
        match self {
            TriggerRule::Fixed(trigger) => trigger,
            TriggerRule::PerRequest => of_cloud_event(headers).unwrap_or(Trigger::Http),
        }
    }

    /// The trigger the pod serves when no request says otherwise: the metrics show its series
    /// from the start.
    pub fn usual(self) -> Trigger {
        match self {
            TriggerRule::Fixed(trigger) => trigger,
            TriggerRule::PerRequest => Trigger::Http,
        }
    }

    /// How the `listening` line names the rule.
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerRule::Fixed(trigger) => trigger.as_str(),
            TriggerRule::PerRequest => "per-request",
        }
    }
}

/// The trigger a binary-mode CloudEvent names by its `ce-type`, when it is one of RunR's and
/// the request really is a CloudEvent (`ce-specversion` present).
fn of_cloud_event(headers: &HeaderMap) -> Option<Trigger> {
    let event_type = headers.get("ce-type")?.as_bytes();
    if !headers.contains_key("ce-specversion") {
        return None;
    }
    if event_type == runr_base::cloudevent::QUEUE_EVENT_TYPE.as_bytes() {
        Some(Trigger::Queue)
    } else if event_type == runr_tick::event::EVENT_TYPE.as_bytes() {
        Some(Trigger::Schedule)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::test_headers as headers;

    const QUEUE: &[(&str, &str)] = &[
        ("ce-specversion", "1.0"),
        ("ce-type", "dev.runr.queue.message"),
        ("ce-source", "/redisstream/orders/orders-api"),
        ("ce-id", "1-0"),
    ];
    const TICK: &[(&str, &str)] = &[
        ("ce-specversion", "1.0"),
        ("ce-type", "dev.runr.schedule.tick"),
        ("ce-source", "/runr/schedule"),
        ("ce-id", "x"),
    ];

    #[test]
    fn runr_trigger_decides_for_the_pod() {
        for t in [Trigger::Http, Trigger::Queue, Trigger::Schedule] {
            // RUNR_MODE cannot override it either.
            let rule = TriggerRule::new(Some(t), Some("schedule"));
            assert_eq!(rule, TriggerRule::Fixed(t));
            for h in [QUEUE, TICK, &[][..], &[("ce-type", "other")][..]] {
                assert_eq!(rule.of(&headers(h)), t, "{t:?} {h:?}");
            }
        }
        assert!(TriggerRule::new(Some(Trigger::Schedule), None).runs_once());
        assert!(!TriggerRule::new(Some(Trigger::Http), Some("schedule")).runs_once());
    }

    #[test]
    fn runr_mode_schedule_means_the_one_shot() {
        let rule = TriggerRule::new(None, Some("schedule"));
        assert_eq!(rule, TriggerRule::Fixed(Trigger::Schedule));
        assert!(rule.runs_once());
        // Other values are other images' business.
        for other in ["http", "queue", "Schedule", "native"] {
            assert_eq!(TriggerRule::new(None, Some(other)), TriggerRule::PerRequest);
        }
        assert_eq!(TriggerRule::new(None, None), TriggerRule::PerRequest);
    }

    #[test]
    fn without_either_each_request_decides() {
        let rule = TriggerRule::new(None, None);
        assert!(!rule.runs_once());
        assert_eq!(rule.usual(), Trigger::Http);
        assert_eq!(rule.of(&headers(QUEUE)), Trigger::Queue);
        assert_eq!(rule.of(&headers(TICK)), Trigger::Schedule);
        for h in [
            &[][..],
            &[("ce-specversion", "1.0"), ("ce-type", "com.example.other")][..],
            // Not a CloudEvent without its spec version.
            &[("ce-type", "dev.runr.queue.message")][..],
            &[
                ("ce-specversion", "1.0"),
                ("ce-type", "dev.runr.queue.message.x"),
            ][..],
            &[("content-type", "application/json")][..],
        ] {
            assert_eq!(rule.of(&headers(h)), Trigger::Http, "{h:?}");
        }
    }
}
