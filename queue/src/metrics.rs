//! Prometheus metrics on `RUNR_QUEUE_METRICS_PORT` (off by default): `GET /metrics` in the text
//! exposition format, written by hand as the wrapper's are (its `observe::metrics`: a few
//! relaxed atomic adds per delivery, fixed label sets, no registry), and `GET /healthz`, 200 when
//! Redis answers a `PING` and 503 when it does not.
//!
//! Counted per delivery: deliveries by outcome, attempts, the duration of each attempt, entries
//! in hand. Read from Redis every [`POLL_EVERY`] by one task, not per entry: the group's lag and
//! pending count (`XINFO GROUPS`) and the age of its oldest pending entry (`XPENDING` summary: the
//! smallest pending id's time).

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use http::{Method, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;

use crate::store::Store;

/// How often the group's figures are read from Redis.
pub(crate) const POLL_EVERY: Duration = Duration::from_secs(5);
/// How long `/healthz` waits for Redis's `PING`.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);
/// The content type of the Prometheus text format.
const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds of the duration histogram's buckets, seconds: 5 ms to 60 s (the wrapper's).
const BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// What became of an entry the consumer had in hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A 2xx, and the entry acknowledged.
    Acked,
    /// A failed attempt that is retried (counted once per retry).
    Retried,
    /// Moved to the dead-letter stream.
    DeadLettered,
    /// Let go without an outcome: left pending at shutdown, or taken over by another consumer
    /// (it delivers it).
    Abandoned,
}

impl Outcome {
    const ALL: [Outcome; 4] = [
        Outcome::Acked,
        Outcome::Retried,
        Outcome::DeadLettered,
        Outcome::Abandoned,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Outcome::Acked => "acked",
            Outcome::Retried => "retried",
            Outcome::DeadLettered => "dead_lettered",
            Outcome::Abandoned => "abandoned",
        }
    }
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);

/// Every counter and gauge of the consumer.
#[derive(Debug)]
pub(crate) struct Metrics {
    outcomes: [AtomicU64; 4],
    attempts: AtomicU64,
    /// Per bucket, not cumulative (summed when written); the +Inf bucket is `count`.
    buckets: [AtomicU64; 13],
    count: AtomicU64,
    sum_nanos: AtomicU64,
    in_hand: AtomicI64,
    /// From the last poll of Redis; `polled` once one succeeded, `lag` -1 when Redis reports
    /// none (before Redis 7, or after entries were deleted).
    polled: AtomicBool,
    redis_up: AtomicBool,
    lag: AtomicI64,
    pending: AtomicI64,
    oldest_age_ms: AtomicI64,
    polls_failed: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            outcomes: [ZERO; 4],
            attempts: ZERO,
            buckets: [ZERO; 13],
            count: ZERO,
            sum_nanos: ZERO,
            in_hand: AtomicI64::new(0),
            polled: AtomicBool::new(false),
            redis_up: AtomicBool::new(false),
            lag: AtomicI64::new(-1),
            pending: AtomicI64::new(0),
            oldest_age_ms: AtomicI64::new(0),
            polls_failed: ZERO,
        }
    }
}

/// The group's figures as one poll read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupFigures {
    /// Entries no consumer of the group has read yet; `None` when Redis cannot tell.
    pub lag: Option<i64>,
    /// Entries read and not acknowledged.
    pub pending: i64,
    /// The smallest pending id's time, milliseconds since the epoch.
    pub oldest_pending_ms: Option<u64>,
}

impl Metrics {
    pub(crate) fn outcome(&self, o: Outcome) {
        let i = Outcome::ALL.iter().position(|x| *x == o).unwrap_or(0);
        self.outcomes[i].fetch_add(1, Ordering::Relaxed);
    }

    /// One attempt made, and how long it took to its answer's head (or its failure).
    pub(crate) fn attempt(&self, took: Duration) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let secs = took.as_secs_f64();
        if let Some(b) = BUCKETS.iter().position(|&limit| secs <= limit) {
            self.buckets[b].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub(crate) fn set_in_hand(&self, n: usize) {
        self.in_hand
            .store(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    fn polled(&self, figures: Option<GroupFigures>, now_ms: u64) {
        match figures {
            Some(f) => {
                self.lag.store(f.lag.unwrap_or(-1), Ordering::Relaxed);
                self.pending.store(f.pending, Ordering::Relaxed);
                let age = f.oldest_pending_ms.map_or(0, |t| now_ms.saturating_sub(t));
                self.oldest_age_ms
                    .store(i64::try_from(age).unwrap_or(i64::MAX), Ordering::Relaxed);
                self.redis_up.store(true, Ordering::Relaxed);
                self.polled.store(true, Ordering::Relaxed);
            }
            None => {
                self.redis_up.store(false, Ordering::Relaxed);
                self.polls_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The Prometheus text exposition format (version 0.0.4) of every metric.
    pub(crate) fn render(&self, outages: u64) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::with_capacity(2048);
        header(
            &mut out,
            "runr_queue_deliveries_total",
            "counter",
            "What became of entries in hand: acked, retried (per retry), dead_lettered, abandoned (left pending at shutdown or taken over).",
        );
        for (o, n) in Outcome::ALL.iter().zip(&self.outcomes) {
            let _ = writeln!(
                out,
                "runr_queue_deliveries_total{{outcome=\"{}\"}} {}",
                o.as_str(),
                get(n)
            );
        }
        header(
            &mut out,
            "runr_queue_attempts_total",
            "counter",
            "Deliveries attempted (HTTP requests to the function).",
        );
        let _ = writeln!(out, "runr_queue_attempts_total {}", get(&self.attempts));
        header(
            &mut out,
            "runr_queue_delivery_duration_seconds",
            "histogram",
            "Time of one attempt, from sending the event to the answer's status and headers (or the failure).",
        );
        let mut cumulative = 0;
        for (le, n) in BUCKETS.iter().zip(&self.buckets) {
            cumulative += get(n);
            let _ = writeln!(
                out,
                "runr_queue_delivery_duration_seconds_bucket{{le=\"{le}\"}} {cumulative}"
            );
        }
        let count = get(&self.count);
        let _ = writeln!(
            out,
            "runr_queue_delivery_duration_seconds_bucket{{le=\"+Inf\"}} {count}\n\
             runr_queue_delivery_duration_seconds_sum {}\n\
             runr_queue_delivery_duration_seconds_count {count}",
            get(&self.sum_nanos) as f64 / 1e9
        );
        gauge(
            &mut out,
            "runr_queue_entries_in_hand",
            "Entries this consumer holds now (delivering or waiting for a retry).",
            self.in_hand.load(Ordering::Relaxed),
        );
        header(
            &mut out,
            "runr_queue_redis_outages_total",
            "counter",
            "Times Redis became unavailable to this consumer.",
        );
        let _ = writeln!(out, "runr_queue_redis_outages_total {outages}");
        gauge(
            &mut out,
            "runr_queue_redis_up",
            "1 when the last poll of the group's figures got an answer from Redis.",
            i64::from(self.redis_up.load(Ordering::Relaxed)),
        );
        header(
            &mut out,
            "runr_queue_polls_failed_total",
            "counter",
            "Polls of the group's figures that Redis did not answer.",
        );
        let _ = writeln!(
            out,
            "runr_queue_polls_failed_total {}",
            get(&self.polls_failed)
        );
        if self.polled.load(Ordering::Relaxed) {
            let lag = self.lag.load(Ordering::Relaxed);
            header(
                &mut out,
                "runr_queue_group_lag",
                "gauge",
                "Entries of the stream no consumer of the group has read (XINFO GROUPS lag; absent when Redis cannot tell).",
            );
            if lag >= 0 {
                let _ = writeln!(out, "runr_queue_group_lag {lag}");
            }
            gauge(
                &mut out,
                "runr_queue_group_pending",
                "Entries read by the group's consumers and not acknowledged (XINFO GROUPS pending).",
                self.pending.load(Ordering::Relaxed),
            );
            header(
                &mut out,
                "runr_queue_oldest_pending_age_seconds",
                "gauge",
                "Age of the oldest pending entry of the group, from its id's time (0 when none is pending).",
            );
            let _ = writeln!(
                out,
                "runr_queue_oldest_pending_age_seconds {}",
                self.oldest_age_ms.load(Ordering::Relaxed) as f64 / 1000.0
            );
        }
        out
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn gauge(out: &mut String, name: &str, help: &str, n: i64) {
    header(out, name, "gauge", help);
    let _ = writeln!(out, "{name} {n}");
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Reads the group's figures from Redis every [`POLL_EVERY`], for as long as the process runs.
pub(crate) async fn poll(metrics: Arc<Metrics>, store: Arc<Store>) {
    loop {
        let figures = store.group_figures().await;
        if let Err(e) = &figures {
            tracing::debug!(error = %e, "could not read the group's figures");
        }
        metrics.polled(figures.ok(), now_ms());
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// Binds `port` on every interface and serves `/metrics` and `/healthz` in a task of its own
/// until the process ends; logs `serving metrics metrics_addr=<addr>`.
pub(crate) async fn start(
    port: u16,
    metrics: Arc<Metrics>,
    store: Arc<Store>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port)).await?;
    tracing::info!(
        metrics_addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        "serving metrics on /metrics and Redis's health on /healthz"
    );
    tokio::spawn(poll(metrics.clone(), store.clone()));
    tokio::spawn(runr_base::serve::serve_connections(
        listener,
        hyper::server::conn::http1::Builder::new(),
        // The endpoint stays up through the drain; it ends with the runtime.
        std::future::pending(),
        Duration::ZERO,
        move |_stream, _peer| {
            let (metrics, store) = (metrics.clone(), store.clone());
            service_fn(move |req| handle(metrics.clone(), store.clone(), req))
        },
    ));
    Ok(())
}

fn reply(status: StatusCode, text: String) -> hyper::Response<Full<Bytes>> {
    let mut res = hyper::Response::new(Full::new(Bytes::from(text)));
    *res.status_mut() = status;
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}

async fn handle(
    metrics: Arc<Metrics>,
    store: Arc<Store>,
    req: hyper::Request<Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let get = matches!(*req.method(), Method::GET | Method::HEAD);
    let res = match (get, req.uri().path()) {
        (true, "/metrics") => {
            let mut res = reply(StatusCode::OK, metrics.render(store.health.outages()));
            res.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_TEXT));
            res
        }
        (true, "/healthz") => match tokio::time::timeout(HEALTH_TIMEOUT, store.ping()).await {
            Ok(Ok(())) => reply(StatusCode::OK, "redis answers\n".to_string()),
            Ok(Err(e)) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("redis does not answer: {e}\n"),
            ),
            Err(_) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "redis does not answer: no PONG within {}\n",
                    runr_base::env::display_duration(HEALTH_TIMEOUT)
                ),
            ),
        },
        (false, "/metrics" | "/healthz") => {
            let mut r = reply(
                StatusCode::METHOD_NOT_ALLOWED,
                "only GET /metrics and GET /healthz\n".to_string(),
            );
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            r
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "only GET /metrics and GET /healthz\n".to_string(),
        ),
    };
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_buckets_and_polled_figures() {
        let m = Metrics::default();
        m.outcome(Outcome::Acked);
        m.outcome(Outcome::Acked);
        m.outcome(Outcome::Abandoned);
        let ms = Duration::from_millis;
        for d in [ms(3), ms(5), ms(70), ms(61_000)] {
            m.attempt(d);
        }
        m.set_in_hand(3);
        let text = m.render(2);
        for line in [
            "runr_queue_deliveries_total{outcome=\"acked\"} 2\n",
            "runr_queue_deliveries_total{outcome=\"retried\"} 0\n",
            "runr_queue_deliveries_total{outcome=\"abandoned\"} 1\n",
            "runr_queue_attempts_total 4\n",
            "runr_queue_delivery_duration_seconds_bucket{le=\"0.005\"} 2\n",
            "runr_queue_delivery_duration_seconds_bucket{le=\"0.1\"} 3\n",
            "runr_queue_delivery_duration_seconds_bucket{le=\"60\"} 3\n",
            "runr_queue_delivery_duration_seconds_bucket{le=\"+Inf\"} 4\n",
            "runr_queue_delivery_duration_seconds_sum 61.078\n",
            "runr_queue_entries_in_hand 3\n",
            "runr_queue_redis_outages_total 2\n",
            "runr_queue_redis_up 0\n",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
        // Nothing read from Redis yet: no group figures rather than zeros that look true.
        assert!(!text.contains("runr_queue_group_pending"), "{text}");
        m.polled(
            Some(GroupFigures {
                lag: Some(7),
                pending: 2,
                oldest_pending_ms: Some(1_000),
            }),
            3_500,
        );
        let text = m.render(0);
        for line in [
            "runr_queue_group_lag 7\n",
            "runr_queue_group_pending 2\n",
            "runr_queue_oldest_pending_age_seconds 2.5\n",
            "runr_queue_redis_up 1\n",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
        m.polled(
            Some(GroupFigures {
                lag: None,
                pending: 0,
                oldest_pending_ms: None,
            }),
            3_500,
        );
        let text = m.render(0);
        assert!(!text.contains("\nrunr_queue_group_lag "), "{text}");
        assert!(text.contains("# TYPE runr_queue_group_lag gauge"));
        assert!(text.contains("runr_queue_oldest_pending_age_seconds 0\n"));
        m.polled(None, 0);
        assert!(m.render(0).contains("runr_queue_polls_failed_total 1\n"));
    }
}
