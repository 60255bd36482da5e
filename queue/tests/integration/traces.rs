//! Every attempt carries a W3C `traceparent`: the producer's trace continued as a child span
//! when the entry has a valid `traceparent` field (its `tracestate` passed along), else a new
//! trace per entry; a new span per attempt; the delivery's log lines name the trace id.

use std::collections::BTreeMap;

use runr_testkit::otlp::Collector;
use runr_testkit::redis::Redis;
use serde_json::Value;

use crate::support::*;

const PRODUCER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const PRODUCER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// Trace id, span id, flags and tracestate of one attempt, as the receiver saw them.
type Attempt = (String, String, String, Option<String>);

/// `(version, trace id, span id, flags)` of a valid traceparent; panics on anything else.
fn parts(tp: &str) -> (String, String, String, String) {
    let p: Vec<&str> = tp.split('-').collect();
    assert_eq!(p.len(), 4, "{tp}");
    assert!(
        p[0] == "00" && p[1].len() == 32 && p[2].len() == 16 && p[3].len() == 2,
        "{tp}"
    );
    assert!(tp
        .bytes()
        .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    assert!(p[1] != "0".repeat(32) && p[2] != "0".repeat(16), "{tp}");
    (p[0].into(), p[1].into(), p[2].into(), p[3].into())
}

#[test]
fn deliveries_continue_the_producers_trace_or_start_one() {
    let dir = tmp();
    let redis = Redis::start();
    // Even `n`: the first attempt fails, so those entries are sent twice.
    let receiver = Receiver::start(dir.path(), &["--fail-mod", "2"]);
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &receiver.url(), "c1"),
            &[("RUNR_QUEUE_BACKOFF", "10ms")],
        ),
    );
    let mut conn = redis.conn();
    let traced = conn.xadd(
        STREAM,
        &[
            ("n", "2"),
            ("traceparent", PRODUCER),
            ("tracestate", "vendor=abc"),
        ],
    );
    let unsampled = conn.xadd(
        STREAM,
        &[("n", "1"), ("traceparent", &PRODUCER.replace("-01", "-00"))],
    );
    let plain: Vec<String> = (3..6)
        .map(|n| conn.xadd(STREAM, &[("n", &n.to_string())]))
        .collect();
    let broken = conn.xadd(STREAM, &[("n", "7"), ("traceparent", "00-not-a-trace-01")]);
    let mut ids = vec![traced.clone(), unsampled.clone(), broken.clone()];
    ids.extend(plain.iter().cloned());
    wait_all_acked(&redis, &receiver, &ids);
    receiver.assert_no_problems();

    let mut by_id: BTreeMap<String, Vec<Attempt>> = BTreeMap::new();
    for r in receiver.phase("start") {
        let tp = r["traceparent"]
            .as_str()
            .expect("a traceparent on every attempt");
        let (_, trace, span, flags) = parts(tp);
        by_id
            .entry(r["id"].as_str().unwrap().to_string())
            .or_default()
            .push((
                trace,
                span,
                flags,
                r["tracestate"].as_str().map(str::to_string),
            ));
    }
    // The producer's trace, continued: its trace id, a span of our own (not the producer's),
    // its flags and tracestate; two attempts, two spans, one trace.
    let t = &by_id[&traced];
    assert_eq!(t.len(), 2, "{t:?}");
    for (trace, span, flags, state) in t {
        assert_eq!(trace, PRODUCER_TRACE);
        assert_ne!(span, "00f067aa0ba902b7");
        assert_eq!(flags, "01");
        assert_eq!(state.as_deref(), Some("vendor=abc"));
    }
    assert_ne!(t[0].1, t[1].1, "a new span per attempt");
    let u = &by_id[&unsampled];
    assert_eq!((u[0].0.as_str(), u[0].2.as_str()), (PRODUCER_TRACE, "00"));
    // No (valid) traceparent: a new trace per entry, the same for each of its attempts.
    let mut new_traces = Vec::new();
    for id in plain.iter().chain([&broken]) {
        let attempts = &by_id[id];
        assert!(attempts
            .iter()
            .all(|a| a.0 == attempts[0].0 && a.2 == "01" && a.3.is_none()));
        assert_ne!(attempts[0].0, PRODUCER_TRACE);
        new_traces.push(attempts[0].0.clone());
    }
    new_traces.sort();
    new_traces.dedup();
    assert_eq!(new_traces.len(), 4, "one trace per entry");
    // The log lines of a delivery name its trace (the delivered line follows the ack).
    c.wait_delivered(ids.len());
    for (id, attempts) in &by_id {
        let delivered: Vec<String> = c
            .lines_with(" delivered ")
            .into_iter()
            .filter(|l| field(l, "id").as_deref() == Some(id))
            .collect();
        assert_eq!(delivered.len(), 1, "{id}");
        assert_eq!(
            field(&delivered[0], "trace_id").as_deref(),
            Some(attempts[0].0.as_str())
        );
    }
    let failed = c.lines_with("delivery failed");
    assert!(failed
        .iter()
        .any(|l| field(l, "trace_id").as_deref() == Some(PRODUCER_TRACE)));
    c.stop_cleanly();
}

// === the exported spans ===

/// The value of attribute `key` of `span`, or `None`.
fn attr_of<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

fn str_attr(span: &Value, key: &str) -> Option<String> {
    attr_of(span, key).and_then(|v| v["stringValue"].as_str().map(str::to_string))
}

fn int_attr(span: &Value, key: &str) -> Option<i64> {
    attr_of(span, key).and_then(|v| v["intValue"].as_str()?.parse().ok())
}

/// The export's variables, with a short batch delay so spans arrive while the test waits.
fn export_env(collector: &Collector) -> Vec<(&'static str, String)> {
    vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{}", collector.port),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "50".to_string()),
    ]
}

#[test]
fn each_attempt_is_exported_as_a_consumer_span() {
    let dir = tmp();
    let redis = Redis::start();
    let collector = Collector::start();
    // Even `n`: the first attempt fails (500), so those entries are sent twice.
    let receiver = Receiver::start(dir.path(), &["--fail-mod", "2"]);
    let export = export_env(&collector);
    let export: Vec<(&str, &str)> = export.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            with(
                base_env(&redis, &receiver.url(), "c1"),
                &[
                    ("RUNR_QUEUE_BACKOFF", "10ms"),
                    ("OTEL_SERVICE_NAME", "orders-fn"),
                ],
            ),
            &export,
        ),
    );
    let mut conn = redis.conn();
    let traced = conn.xadd(STREAM, &[("n", "2"), ("traceparent", PRODUCER)]);
    let unsampled = conn.xadd(
        STREAM,
        &[("n", "1"), ("traceparent", &PRODUCER.replace("-01", "-00"))],
    );
    let plain = conn.xadd(STREAM, &[("n", "3")]);
    let ids = [traced.clone(), unsampled.clone(), plain.clone()];
    wait_all_acked(&redis, &receiver, &ids);
    // Three spans: the traced entry's two attempts and the plain entry's one; none for the
    // entry its producer did not sample.
    let (docs, spans) = collector.spans_until(LONG, |s| s.len() >= 3);
    c.stop_cleanly();
    let mut late = Vec::new();
    while let Ok((_, _, doc)) = collector.rx.try_recv() {
        late.extend(runr_testkit::otlp::flatten(&doc));
    }
    assert!(late.is_empty(), "no more spans than attempts: {late:#?}");
    assert_eq!(spans.len(), 3, "{spans:#?}");

    // What the receiver was sent: each attempt's traceparent names the span exported for it.
    let sent: Vec<(String, i64, String, String)> = receiver
        .phase("start")
        .iter()
        .map(|r| {
            let (_, trace, span, _) = parts(r["traceparent"].as_str().unwrap());
            (
                r["id"].as_str().unwrap().to_string(),
                r["attempt"].as_i64().unwrap(),
                trace,
                span,
            )
        })
        .collect();
    for s in &spans {
        let id = str_attr(s, "messaging.message.id").expect("the entry id");
        let attempt = int_attr(s, "runr.queue.attempt").expect("the attempt");
        let (_, _, trace, span) = sent
            .iter()
            .find(|(i, a, _, _)| *i == id && *a == attempt)
            .unwrap_or_else(|| panic!("span of an attempt never made: {s:#}"));
        assert_eq!(s["traceId"].as_str(), Some(trace.as_str()), "{s:#}");
        assert_eq!(s["spanId"].as_str(), Some(span.as_str()), "{s:#}");
        assert_eq!(s["kind"], 5, "SPAN_KIND_CONSUMER: {s:#}");
        assert_eq!(s["name"], format!("process {STREAM}"));
        assert_eq!(s["flags"], 1);
        assert_eq!(str_attr(s, "messaging.system").as_deref(), Some("redis"));
        assert_eq!(
            str_attr(s, "messaging.destination.name").as_deref(),
            Some(STREAM)
        );
        assert_eq!(
            str_attr(s, "messaging.consumer.group.name").as_deref(),
            Some(GROUP)
        );
        assert_eq!(
            str_attr(s, "messaging.operation.type").as_deref(),
            Some("process")
        );
        let start: u128 = s["startTimeUnixNano"].as_str().unwrap().parse().unwrap();
        let end: u128 = s["endTimeUnixNano"].as_str().unwrap().parse().unwrap();
        assert!(start > 0 && start <= end, "{s:#}");
        let (outcome, status, error) = (
            str_attr(s, "runr.queue.outcome"),
            int_attr(s, "http.response.status_code"),
            s["status"]["code"].as_i64(),
        );
        if id == traced {
            // Continued: the producer's trace, the producer's span as the parent.
            assert_eq!(s["traceId"], PRODUCER_TRACE);
            assert_eq!(s["parentSpanId"], "00f067aa0ba902b7");
            let want = if attempt == 1 {
                (Some("retried".to_string()), Some(500), Some(2))
            } else {
                (Some("acked".to_string()), Some(200), Some(0))
            };
            assert_eq!((outcome, status, error), want, "{s:#}");
        } else {
            assert_eq!(id, plain, "{s:#}");
            assert!(s.get("parentSpanId").is_none(), "a new trace: {s:#}");
            assert_eq!(
                (outcome, status, error),
                (Some("acked".to_string()), Some(200), Some(0))
            );
        }
    }
    let doc = &docs[0];
    let rs = &doc["resourceSpans"][0];
    assert_eq!(
        runr_testkit::otlp::attr(&rs["resource"]["attributes"], "service.name")["stringValue"],
        "orders-fn"
    );
    assert_eq!(rs["scopeSpans"][0]["scope"]["name"], "runr-queue");
}
