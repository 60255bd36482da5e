//! Prometheus metrics: counters and gauges kept in process-wide atomics (always counted, a few
//! relaxed atomic adds per invocation) and the text exposition format written by hand for
//! `GET /metrics` on `RUNR_METRICS_PORT`.
//!
//! Names follow the OpenTelemetry FaaS metric conventions mapped to Prometheus. What counts as
//! an invocation: a request that reached the invoker (probes, CORS preflights and requests
//! refused before a handler runs are not; the refusals count in `runr_rejected_total` only).
//!
//! Why not the `prometheus-client` crate: measured on the release musl build it added 108 KiB
//! (1,997,376 → 2,107,968 bytes for the registry, families and its text encoder alone), while
//! this module's encoder is a few dozen lines; the fixed label sets (three triggers, four
//! status classes, six error classes, three refusal reasons) need no registry.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use crate::config::Trigger;
use crate::response::ErrorClass;

/// Upper bounds of the duration histogram's buckets, seconds: 5 ms to 60 s.
pub const BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The same bounds in nanoseconds, for comparing without floating point.
const BUCKET_NANOS: [u64; 13] = [
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
    60_000_000_000,
];

/// Why a request was refused before any handler ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Admission control: the queue is full (503).
    Overload,
    /// The request body is above the limit (413).
    BodyTooLarge,
    /// The request headers cannot be passed to the handler (431).
    HeadersTooLarge,
    /// The request needs more than the whole `RUNR_MAX_INFLIGHT_BYTES` (413).
    OverBudget,
}

impl Rejected {
    const ALL: [Rejected; 4] = [
        Rejected::Overload,
        Rejected::BodyTooLarge,
        Rejected::HeadersTooLarge,
        Rejected::OverBudget,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Rejected::Overload => "overload",
            Rejected::BodyTooLarge => "body_too_large",
            Rejected::HeadersTooLarge => "headers_too_large",
            Rejected::OverBudget => "over_budget",
        }
    }
}

/// Every counter and gauge of the wrapper.
#[derive(Debug)]
pub struct Metrics {
    /// The pod's usual trigger (an index into [`TRIGGERS`]): its series are shown from the
    /// start, the other triggers' once they had an invocation.
    usual: AtomicU8,
    /// Persistent mode: the worker metrics are exposed.
    persistent: AtomicBool,
    /// The invocation counters, per trigger (in the order of [`TRIGGERS`]).
    by_trigger: [PerTrigger; 3],
    inflight: AtomicI64,
    queued: AtomicI64,
    worker_restarts: AtomicU64,
    workers_alive: AtomicI64,
    rejected: [AtomicU64; 4],
    /// Bytes held for invocations now (`RUNR_MAX_INFLIGHT_BYTES` counts them).
    inflight_bytes: AtomicI64,
    /// The budget and the cgroup's memory limit; -1: none.
    budget_bytes: AtomicI64,
    memory_limit: AtomicI64,
}

/// The counters of one trigger's invocations.
#[derive(Debug)]
struct PerTrigger {
    /// Finished invocations by status class: index 1 is 1xx ... 9 is 9xx.
    invocations: [AtomicU64; 10],
    errors: [AtomicU64; 6],
    timeouts: AtomicU64,
    coldstarts: AtomicU64,
    /// Per bucket, not cumulative (summed when written); the +Inf bucket is `count`.
    buckets: [AtomicU64; 13],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl PerTrigger {
    const fn new() -> PerTrigger {
        PerTrigger {
            invocations: [ZERO; 10],
            errors: [ZERO; 6],
            timeouts: ZERO,
            coldstarts: ZERO,
            buckets: [ZERO; 13],
            count: ZERO,
            sum_nanos: ZERO,
        }
    }
}

const TRIGGERS: [Trigger; 3] = [Trigger::Http, Trigger::Queue, Trigger::Schedule];

/// The error classes `faas_errors_total` counts: those of invocations (a request whose body
/// could not be read never became one).
const COUNTED: [ErrorClass; 6] = [
    ErrorClass::Timeout,
    ErrorClass::Crash,
    ErrorClass::Start,
    ErrorClass::Limit,
    ErrorClass::Overload,
    ErrorClass::Unavailable,
];

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);

static METRICS: Metrics = Metrics::new();

/// The process's metrics.
pub fn get() -> &'static Metrics {
    &METRICS
}

/// One finished invocation, as the metrics see it.
#[derive(Debug, Clone, Copy)]
pub struct Invocation {
    /// Where it came from.
    pub trigger: Trigger,
    /// The status answered.
    pub status: u16,
    /// From the request's arrival to the answer.
    pub took: Duration,
    /// The class of a wrapper-made answer.
    pub error: Option<ErrorClass>,
    /// The first invocation of the process that ran it.
    pub cold_start: bool,
}

/// A gauge held up while a value lives: one in flight, one queued.
#[derive(Debug)]
pub struct Held(&'static AtomicI64);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// Every count at zero (the process's one [`METRICS`]; a fresh one per unit test).
    #[allow(clippy::declare_interior_mutable_const)]
    const fn new() -> Metrics {
        const FRESH: PerTrigger = PerTrigger::new();
        Metrics {
            usual: AtomicU8::new(0),
            persistent: AtomicBool::new(false),
            by_trigger: [FRESH; 3],
            inflight: AtomicI64::new(0),
            queued: AtomicI64::new(0),
            worker_restarts: ZERO,
            workers_alive: AtomicI64::new(0),
            rejected: [ZERO; 4],
            inflight_bytes: AtomicI64::new(0),
            budget_bytes: AtomicI64::new(-1),
            memory_limit: AtomicI64::new(-1),
        }
    }

    /// Shows the series of `usual` (the pod's trigger, or http when each request decides)
    /// from the start; `persistent` exposes the worker metrics.
    pub fn configure(&self, usual: Trigger, persistent: bool) {
        self.usual
            .store(trigger_index(usual) as u8, Ordering::Relaxed);
        self.persistent.store(persistent, Ordering::Relaxed);
    }

    /// The cgroup's memory limit and the budget of bytes held for invocations (`None`: none).
    pub fn memory(&self, limit: Option<u64>, budget: Option<u64>) {
        let gauge = |v: Option<u64>| v.map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX));
        self.memory_limit.store(gauge(limit), Ordering::Relaxed);
        self.budget_bytes.store(gauge(budget), Ordering::Relaxed);
    }

    /// Bytes held for invocations change by `delta`.
    pub fn inflight_bytes(&self, delta: i64) {
        self.inflight_bytes.fetch_add(delta, Ordering::Relaxed);
    }

    /// Counts a finished invocation.
    pub fn invocation(&self, inv: Invocation) {
        let t = &self.by_trigger[trigger_index(inv.trigger)];
        let class = usize::from(inv.status / 100).min(9);
        t.invocations[class].fetch_add(1, Ordering::Relaxed);
        if let Some(i) = inv.error.and_then(|e| COUNTED.iter().position(|c| *c == e)) {
            t.errors[i].fetch_add(1, Ordering::Relaxed);
            if COUNTED[i] == ErrorClass::Timeout {
                t.timeouts.fetch_add(1, Ordering::Relaxed);
            }
        }
        if inv.cold_start {
            t.coldstarts.fetch_add(1, Ordering::Relaxed);
        }
        let nanos = u64::try_from(inv.took.as_nanos()).unwrap_or(u64::MAX);
        if let Some(b) = BUCKET_NANOS.iter().position(|&limit| nanos <= limit) {
            t.buckets[b].fetch_add(1, Ordering::Relaxed);
        }
        t.count.fetch_add(1, Ordering::Relaxed);
        t.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Counts a request refused before a handler ran.
    pub fn rejected(&self, why: Rejected) {
        let i = Rejected::ALL.iter().position(|r| *r == why).unwrap_or(0);
        self.rejected[i].fetch_add(1, Ordering::Relaxed);
    }

    /// One more invocation in a handler, until the returned value is dropped.
    pub fn in_flight(&'static self) -> Held {
        Metrics::hold(&self.inflight)
    }

    /// One more request waiting for a handler, until the returned value is dropped.
    pub fn queued(&'static self) -> Held {
        Metrics::hold(&self.queued)
    }

    /// One more persistent worker alive (started, and not exited), until dropped.
    pub fn worker_alive(&'static self) -> Held {
        Metrics::hold(&self.workers_alive)
    }

    /// Counts a worker started again after its predecessor exited or was killed.
    pub fn worker_restarted(&self) {
        self.worker_restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// Persistent workers alive right now.
    pub fn workers_alive(&self) -> i64 {
        self.workers_alive.load(Ordering::Relaxed)
    }

    fn hold(gauge: &'static AtomicI64) -> Held {
        gauge.fetch_add(1, Ordering::Relaxed);
        Held(gauge)
    }

    /// The Prometheus text exposition format (version 0.0.4) of every metric.
    pub fn render(&self) -> String {
        let usual = usize::from(self.usual.load(Ordering::Relaxed)).min(2);
        // The pod's usual trigger always, the others once they had an invocation.
        let shown: Vec<(&str, &PerTrigger)> = TRIGGERS
            .iter()
            .zip(&self.by_trigger)
            .enumerate()
            .filter(|(i, (_, t))| *i == usual || load(&t.count) > 0)
            .map(|(_, (trigger, t))| (trigger.as_str(), t))
            .collect();
        let mut out = String::with_capacity(4096);
        invocations(&mut out, &shown);
        durations(&mut out, &shown);
        self.gauges(&mut out);
        self.rejections(&mut out);
        out
    }

    /// The gauges (and the persistent workers' restarts).
    fn gauges(&self, out: &mut String) {
        let get = load;
        gauge(
            out,
            "runr_inflight_invocations",
            "Invocations running in a handler now.",
            self.inflight.load(Ordering::Relaxed),
        );
        gauge(
            out,
            "runr_queued_invocations",
            "Requests waiting for a handler now.",
            self.queued.load(Ordering::Relaxed),
        );
        gauge(
            out,
            "runr_inflight_bytes",
            "Bytes held for invocations now: buffered bodies, envelopes, answers, captures.",
            self.inflight_bytes.load(Ordering::Relaxed),
        );
        let budget = self.budget_bytes.load(Ordering::Relaxed);
        if budget >= 0 {
            gauge(
                out,
                "runr_inflight_bytes_limit",
                "RUNR_MAX_INFLIGHT_BYTES: bytes held for invocations at most.",
                budget,
            );
        }
        let limit = self.memory_limit.load(Ordering::Relaxed);
        if limit >= 0 {
            gauge(
                out,
                "runr_memory_limit_bytes",
                "The memory limit of the wrapper's cgroup, read at start.",
                limit,
            );
        }
        if self.persistent.load(Ordering::Relaxed) {
            header(
                out,
                "runr_worker_restarts_total",
                "counter",
                "Persistent workers started again after one exited or was killed.",
            );
            let _ = writeln!(
                out,
                "runr_worker_restarts_total {}",
                get(&self.worker_restarts)
            );
            gauge(
                out,
                "runr_workers_alive",
                "Persistent workers started and running.",
                self.workers_alive(),
            );
        }
    }

    /// `runr_rejected_total`.
    fn rejections(&self, out: &mut String) {
        let get = load;
        header(
            out,
            "runr_rejected_total",
            "counter",
            "Requests refused before a handler ran, by reason.",
        );
        for (why, n) in Rejected::ALL.iter().zip(&self.rejected) {
            let _ = writeln!(
                out,
                "runr_rejected_total{{reason=\"{}\"}} {}",
                why.as_str(),
                get(n)
            );
        }
    }
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// `faas_invocations_total`, `faas_errors_total`, `faas_timeouts_total`,
/// `faas_coldstarts_total` of the `shown` triggers.
fn invocations(out: &mut String, shown: &[(&str, &PerTrigger)]) {
    let get = load;
    header(
        out,
        "faas_invocations_total",
        "counter",
        "Invocations by trigger and status class.",
    );
    for (trigger, t) in shown {
        for (class, n) in t.invocations.iter().enumerate().skip(1) {
            let n = get(n);
            // 2xx-5xx always (zero included), other classes once they happened.
            if (2..=5).contains(&class) || n > 0 {
                let _ = writeln!(
                    out,
                    "faas_invocations_total{{trigger=\"{trigger}\",code=\"{class}xx\"}} {n}"
                );
            }
        }
    }
    header(
        out,
        "faas_errors_total",
        "counter",
        "Invocations answered by the wrapper instead of the handler, by error class.",
    );
    for (trigger, t) in shown {
        for (class, n) in COUNTED.iter().zip(&t.errors) {
            let _ = writeln!(
                out,
                "faas_errors_total{{trigger=\"{trigger}\",type=\"{}\"}} {}",
                class.as_str(),
                get(n)
            );
        }
    }
    per_trigger(
        out,
        "faas_timeouts_total",
        "Invocations that ran into the timeout.",
        shown,
        |t| get(&t.timeouts),
    );
    per_trigger(
        out,
        "faas_coldstarts_total",
        "First invocations of a process (the wrapper in exec mode, each worker in persistent mode).",
        shown,
        |t| get(&t.coldstarts),
    );
}

/// `faas_invoke_duration_seconds` of the `shown` triggers.
fn durations(out: &mut String, shown: &[(&str, &PerTrigger)]) {
    let get = load;
    header(
        out,
        "faas_invoke_duration_seconds",
        "histogram",
        "Time from a request's arrival to its answer.",
    );
    for (trigger, t) in shown {
        let mut cumulative = 0;
        for (le, n) in BUCKETS.iter().zip(&t.buckets) {
            cumulative += get(n);
            let _ = writeln!(
                out,
                "faas_invoke_duration_seconds_bucket{{trigger=\"{trigger}\",le=\"{le}\"}} {cumulative}"
            );
        }
        let count = get(&t.count);
        let _ = writeln!(
            out,
            "faas_invoke_duration_seconds_bucket{{trigger=\"{trigger}\",le=\"+Inf\"}} {count}\n\
             faas_invoke_duration_seconds_sum{{trigger=\"{trigger}\"}} {}\n\
             faas_invoke_duration_seconds_count{{trigger=\"{trigger}\"}} {count}",
            get(&t.sum_nanos) as f64 / 1e9
        );
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A counter with one series per shown trigger.
fn per_trigger(
    out: &mut String,
    name: &str,
    help: &str,
    shown: &[(&str, &PerTrigger)],
    value: impl Fn(&PerTrigger) -> u64,
) {
    header(out, name, "counter", help);
    for (trigger, t) in shown {
        let _ = writeln!(out, "{name}{{trigger=\"{trigger}\"}} {}", value(t));
    }
}

fn trigger_index(trigger: Trigger) -> usize {
    TRIGGERS.iter().position(|t| *t == trigger).unwrap_or(0)
}

fn gauge(out: &mut String, name: &str, help: &str, n: i64) {
    header(out, name, "gauge", help);
    let _ = writeln!(out, "{name} {n}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> Metrics {
        Metrics::new()
    }

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
    }

    #[test]
    fn counts_and_buckets() {
        let m = fresh();
        m.configure(Trigger::Queue, true);
        let ms = Duration::from_millis;
        for (status, took, error, cold) in [
            (200, ms(3), None, true),
            (200, ms(5), None, false),
            (504, ms(1500), Some(ErrorClass::Timeout), false),
            (502, ms(70), Some(ErrorClass::Crash), false),
            (404, ms(61_000), None, false),
            (101, ms(1), None, false),
        ] {
            m.invocation(Invocation {
                trigger: Trigger::Queue,
                status,
                took,
                error,
                cold_start: cold,
            });
        }
        m.rejected(Rejected::BodyTooLarge);
        m.worker_restarted();
        let text = m.render();
        let q = "{trigger=\"queue\"";
        assert_eq!(
            line(&text, &format!("faas_invocations_total{q},code=\"2xx\"}}")),
            format!("faas_invocations_total{q},code=\"2xx\"}} 2")
        );
        assert!(text.contains(&format!("faas_invocations_total{q},code=\"1xx\"}} 1")));
        assert!(text.contains(&format!("faas_invocations_total{q},code=\"3xx\"}} 0")));
        assert!(!text.contains("code=\"6xx\""));
        assert!(text.contains(&format!("faas_errors_total{q},type=\"timeout\"}} 1")));
        assert!(text.contains(&format!("faas_errors_total{q},type=\"overload\"}} 0")));
        assert!(text.contains(&format!("faas_timeouts_total{q}}} 1")));
        assert!(text.contains(&format!("faas_coldstarts_total{q}}} 1")));
        // 5 ms is in the 5 ms bucket (le is inclusive); 61 s only in +Inf.
        for (le, n) in [
            ("0.005", 3),
            ("0.05", 3),
            ("0.1", 4),
            ("2.5", 5),
            ("60", 5),
            ("+Inf", 6),
        ] {
            assert!(
                text.contains(&format!(
                    "faas_invoke_duration_seconds_bucket{q},le=\"{le}\"}} {n}\n"
                )),
                "{le}: {text}"
            );
        }
        assert!(text.contains(&format!("faas_invoke_duration_seconds_count{q}}} 6")));
        assert!(text.contains(&format!("faas_invoke_duration_seconds_sum{q}}} 62.579\n")));
        assert!(text.contains("runr_rejected_total{reason=\"body_too_large\"} 1"));
        assert!(text.contains("runr_rejected_total{reason=\"headers_too_large\"} 0"));
        assert!(text.contains("runr_worker_restarts_total 1"));
        m.configure(Trigger::Http, false);
        assert!(
            !m.render().contains("runr_worker"),
            "exec mode has no workers"
        );
    }

    #[test]
    fn each_trigger_has_its_series_once_it_had_an_invocation() {
        let m = fresh();
        m.configure(Trigger::Http, false);
        let text = m.render();
        assert!(text.contains("faas_invocations_total{trigger=\"http\",code=\"2xx\"} 0"));
        assert!(!text.contains("trigger=\"queue\""), "{text}");
        m.invocation(Invocation {
            trigger: Trigger::Queue,
            status: 502,
            took: Duration::from_millis(2),
            error: Some(ErrorClass::Crash),
            cold_start: false,
        });
        let text = m.render();
        for line in [
            "faas_invocations_total{trigger=\"http\",code=\"5xx\"} 0",
            "faas_invocations_total{trigger=\"queue\",code=\"5xx\"} 1",
            "faas_errors_total{trigger=\"queue\",type=\"crash\"} 1",
            "faas_errors_total{trigger=\"http\",type=\"crash\"} 0",
            "faas_invoke_duration_seconds_count{trigger=\"queue\"} 1",
            "faas_timeouts_total{trigger=\"queue\"} 0",
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line}: {text}");
        }
        assert!(!text.contains("trigger=\"schedule\""), "{text}");
        // One HELP/TYPE per family, every series of it right below.
        assert_eq!(text.matches("# TYPE faas_errors_total").count(), 1);
        let family: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("# TYPE faas_timeouts_total"))
            .skip(1)
            .take_while(|l| !l.starts_with('#'))
            .collect();
        assert_eq!(
            family,
            [
                "faas_timeouts_total{trigger=\"http\"} 0",
                "faas_timeouts_total{trigger=\"queue\"} 0"
            ]
        );
    }

    #[test]
    fn the_memory_budget_is_exported_when_there_is_one() {
        let m = Metrics::new();
        let text = m.render();
        assert!(text.contains("\nrunr_inflight_bytes 0\n"), "{text}");
        assert!(!text.contains("runr_inflight_bytes_limit"), "{text}");
        assert!(!text.contains("runr_memory_limit_bytes"), "{text}");
        m.memory(Some(256 << 20), Some(128 << 20));
        m.inflight_bytes(9 << 20);
        m.rejected(Rejected::OverBudget);
        let text = m.render();
        for line in [
            "runr_inflight_bytes 9437184",
            "runr_inflight_bytes_limit 134217728",
            "runr_memory_limit_bytes 268435456",
            "runr_rejected_total{reason=\"over_budget\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
    }

    #[test]
    fn gauges_follow_what_is_held() {
        let before = get().inflight.load(Ordering::Relaxed);
        let held = get().in_flight();
        assert_eq!(get().inflight.load(Ordering::Relaxed), before + 1);
        drop(held);
        assert_eq!(get().inflight.load(Ordering::Relaxed), before);
    }
}
