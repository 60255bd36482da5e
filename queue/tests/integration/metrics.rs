//! `/metrics` and `/healthz` on `RUNR_QUEUE_METRICS_PORT`: the text read back with Prometheus'
//! own parser (prometheus_client, through testkit, as the wrapper's tests do), every count checked against what
//! the test made happen, the group's figures read from Redis, and the health following Redis.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use runr_testkit::redis::Redis;
use runr_testkit::wait_for;

use crate::support::*;

/// One scrape parsed by prometheus_client: samples by name and labels, and each family's type.
struct Scrape {
    samples: BTreeMap<String, f64>,
    types: BTreeMap<String, String>,
    text: String,
}

impl Scrape {
    fn get(&self, series: &str) -> Option<f64> {
        self.samples.get(series).copied()
    }

    fn value(&self, series: &str) -> f64 {
        self.get(series)
            .unwrap_or_else(|| panic!("no {series} in\n{}", self.text))
    }
}

fn scrape(addr: SocketAddr) -> Scrape {
    let r = runr_testkit::http::get(addr, "/metrics");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    parse(&r.body)
}

/// `body` read by prometheus_client's parser (testkit's); panics when it does not parse.
fn parse(body: &[u8]) -> Scrape {
    let parsed = runr_testkit::prom::parse(body);
    let samples = parsed
        .samples
        .into_iter()
        .map(|(name, labels, value)| {
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            let name = if labels.is_empty() {
                name
            } else {
                format!("{name}{{{}}}", labels.join(","))
            };
            (name, value)
        })
        .collect();
    Scrape {
        samples,
        types: parsed.types,
        text: String::from_utf8_lossy(body).into_owned(),
    }
}

fn outcome(s: &Scrape, o: &str) -> f64 {
    s.value(&format!("runr_queue_deliveries_total{{outcome=\"{o}\"}}"))
}

#[test]
fn metrics_count_every_outcome_and_read_the_group_from_redis() {
    let dir = tmp();
    let mut redis = Redis::start();
    let gate = Gate::closed(dir.path(), "held");
    // Even `n`: the first attempt fails (500), the retry succeeds.
    let receiver = Receiver::start(dir.path(), &["--hold-while", gate.arg(), "--fail-mod", "2"]);
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &receiver.url(), "c1"),
            &[
                ("RUNR_QUEUE_METRICS_PORT", "0"),
                ("RUNR_QUEUE_CONCURRENCY", "2"),
                ("RUNR_QUEUE_BACKOFF", "10ms"),
                ("RUNR_QUEUE_MAX_BODY", "1KiB"),
            ],
        ),
    );
    let line = c.lines_with("serving metrics").remove(0);
    let addr: SocketAddr = field(&line, "metrics_addr").unwrap().parse().unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], addr.port()));
    let health = runr_testkit::http::get(addr, "/healthz");
    assert_eq!(
        (health.status, health.text()),
        (200, "redis answers\n".into())
    );

    // Five entries, two of them held in delivery: in hand 2, pending 2, lag 3.
    let mut conn = redis.conn();
    let held: Vec<String> = [1, 3, 5, 7, 9]
        .iter()
        .map(|n| conn.xadd(STREAM, &[("n", &n.to_string())]))
        .collect();
    receiver.wait_started(2);
    let s = wait_for("the group's figures with two entries held", LONG, || {
        let s = scrape(addr);
        (s.get("runr_queue_group_lag") == Some(3.0)
            && s.get("runr_queue_group_pending") == Some(2.0))
        .then_some(s)
    });
    assert_eq!(s.value("runr_queue_entries_in_hand"), 2.0);
    assert_eq!(s.value("runr_queue_redis_up"), 1.0);
    assert!(s.value("runr_queue_oldest_pending_age_seconds") >= 0.0);
    assert_eq!(s.types["runr_queue_delivery_duration_seconds"], "histogram");
    assert_eq!(s.types["runr_queue_deliveries"], "counter");
    assert_eq!(s.types["runr_queue_group_lag"], "gauge");
    gate.open();
    wait_all_acked(&redis, &receiver, &held);

    // Three that fail once, and one too large to deliver.
    let mut ids: Vec<String> = [0, 2, 4]
        .iter()
        .map(|n| conn.xadd(STREAM, &[("n", &n.to_string())]))
        .collect();
    let big = "b".repeat(2000);
    conn.xadd(STREAM, &[("n", "11"), ("blob", &big)]);
    ids.extend(held);
    wait_all_acked(&redis, &receiver, &ids);
    wait_for("the dead letter", LONG, || {
        (conn.cmd_str(&["XLEN", DLQ]).int() == 1).then_some(())
    });
    let s = wait_for("everything counted and the group drained", LONG, || {
        let s = scrape(addr);
        (outcome(&s, "acked") == 8.0
            && outcome(&s, "dead_lettered") == 1.0
            && s.get("runr_queue_group_pending") == Some(0.0)
            && s.get("runr_queue_group_lag") == Some(0.0))
        .then_some(s)
    });
    assert_eq!(outcome(&s, "retried"), 3.0, "{}", s.text);
    assert_eq!(outcome(&s, "abandoned"), 0.0);
    // 5 first attempts, then 3 failing and 3 retries; the big entry was never sent.
    assert_eq!(s.value("runr_queue_attempts_total"), 11.0);
    assert_eq!(s.value("runr_queue_delivery_duration_seconds_count"), 11.0);
    assert_eq!(
        s.value("runr_queue_delivery_duration_seconds_bucket{le=\"+Inf\"}"),
        11.0
    );
    assert!(s.value("runr_queue_delivery_duration_seconds_sum") > 0.0);
    assert_eq!(s.value("runr_queue_entries_in_hand"), 0.0);
    assert_eq!(s.value("runr_queue_oldest_pending_age_seconds"), 0.0);
    assert_eq!(s.value("runr_queue_redis_outages_total"), 0.0);

    // Wrong method, unknown path.
    let r = runr_testkit::http::request(
        addr,
        "POST",
        "/metrics",
        &[],
        runr_testkit::http::Body::None,
    );
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));
    assert_eq!(runr_testkit::http::get(addr, "/").status, 404);

    // Redis gone: the health says so, the metrics still answer.
    redis.stop();
    wait_for("/healthz to say 503", LONG, || {
        let r = runr_testkit::http::get(addr, "/healthz");
        (r.status == 503).then_some(r)
    });
    let s = wait_for("a poll that Redis did not answer", LONG, || {
        let s = scrape(addr);
        (s.value("runr_queue_redis_up") == 0.0).then_some(s)
    });
    assert!(s.value("runr_queue_polls_failed_total") >= 1.0);
    let status = c.terminate(LONG);
    assert!(status.success(), "{status}: {}", c.log());
}

#[test]
fn no_metrics_port_by_default() {
    let dir = tmp();
    let redis = Redis::start();
    let receiver = Receiver::start(dir.path(), &[]);
    let mut c = Consumer::start(dir.path(), "c1", &base_env(&redis, &receiver.url(), "c1"));
    assert!(!c.log().contains("serving metrics"), "{}", c.log());
    c.stop_cleanly();
}

#[test]
fn a_metrics_port_in_use_is_exit_1_naming_it() {
    let dir = tmp();
    let redis = Redis::start();
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let mut c = Consumer::spawn(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, "http://127.0.0.1:9/", "c1"),
            &[("RUNR_QUEUE_METRICS_PORT", &port)],
        ),
    );
    let status = c.child.wait_timeout(LONG);
    assert_eq!(status.code(), Some(1), "{}", c.log());
    assert!(
        c.log()
            .contains(&format!("cannot listen on RUNR_QUEUE_METRICS_PORT {port}")),
        "{}",
        c.log()
    );
}

/// 32 scrapers × 20 requests, alternating `/metrics` and `/healthz`, while the consumer delivers
/// a stream being written: every answer complete and exact (status, the header set, the length),
/// every `/metrics` body read by Prometheus' parser with counts that never go down within one
/// scraper's sequence, every `/healthz` body byte for byte.
#[test]
fn many_concurrent_scrapers_while_delivering() {
    const SCRAPERS: usize = 32;
    const REQUESTS: usize = 20;
    const ENTRIES: usize = 400;
    let dir = tmp();
    let redis = Redis::start();
    let receiver = Receiver::start(dir.path(), &["--fail-mod", "5"]);
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &receiver.url(), "c1"),
            &[
                ("RUNR_QUEUE_METRICS_PORT", "0"),
                ("RUNR_QUEUE_BACKOFF", "10ms"),
                ("RUNR_QUEUE_LOG", "info"),
            ],
        ),
    );
    let line = c.lines_with("serving metrics").remove(0);
    let addr: SocketAddr = field(&line, "metrics_addr").unwrap().parse().unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], addr.port()));

    let producer = {
        let mut conn = redis.conn();
        std::thread::spawn(move || {
            (0..ENTRIES)
                .map(|n| conn.xadd(STREAM, &[("n", &n.to_string())]))
                .collect::<Vec<String>>()
        })
    };
    let scrapers: Vec<_> = (0..SCRAPERS)
        .map(|i| {
            std::thread::spawn(move || {
                let mut acked = 0.0;
                let mut parsed = 0;
                for k in 0..REQUESTS {
                    let metrics = (i + k) % 2 == 0;
                    let path = if metrics { "/metrics" } else { "/healthz" };
                    let r = runr_testkit::http::get(addr, path);
                    let mut names: Vec<String> = r
                        .headers
                        .iter()
                        .map(|(n, _)| n.to_ascii_lowercase())
                        .collect();
                    names.sort();
                    assert_eq!(
                        (r.status, names),
                        (
                            200,
                            vec![
                                "content-length".into(),
                                "content-type".into(),
                                "date".into()
                            ]
                        ),
                        "{path}: {:?} {}",
                        r.headers,
                        r.text()
                    );
                    assert_eq!(
                        r.header("content-length"),
                        Some(r.body.len().to_string().as_str())
                    );
                    if metrics {
                        assert_eq!(
                            r.header("content-type"),
                            Some("text/plain; version=0.0.4; charset=utf-8")
                        );
                        let s = parse(&r.body);
                        let now = outcome(&s, "acked");
                        assert!(now >= acked, "acked went from {acked} to {now}");
                        acked = now;
                        assert!(s.value("runr_queue_entries_in_hand") >= 0.0);
                        assert_eq!(s.types["runr_queue_deliveries"], "counter");
                        parsed += 1;
                    } else {
                        assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
                        assert_eq!(r.body, b"redis answers\n");
                    }
                }
                parsed
            })
        })
        .collect();
    let parsed: usize = scrapers.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(parsed, SCRAPERS * REQUESTS / 2);
    let ids = producer.join().unwrap();
    wait_all_acked(&redis, &receiver, &ids);
    let s = wait_for("every entry counted", LONG, || {
        let s = scrape(addr);
        (outcome(&s, "acked") == ENTRIES as f64).then_some(s)
    });
    assert_eq!(outcome(&s, "retried"), (ENTRIES / 5) as f64, "{}", s.text);
    c.stop_cleanly();
}
