//! Retries, backoff and the dead-letter stream: through the real wrapper with Bash handlers that
//! fail on purpose, and through the receiver for the wrapper's error classes and Retry-After.

use std::path::Path;
use std::time::Duration;

use runr_testkit::redis::Redis;
use runr_testkit::wait_for;

use crate::support::*;

/// A handler that records `<event id> <attempt> <ns since epoch>` and fails (exit 1, which the
/// wrapper answers 500) while the attempt is below `succeed_at` (0: always fails).
fn flaky_handler(record: &Path, succeed_at: u32) -> String {
    format!(
        r#"#!/usr/bin/env bash
set -euo pipefail
attempt=$RUNR_HEADER_X_RUNR_DELIVERY_ATTEMPT
printf '%s %s %s\n' "$RUNR_EVENT_ID" "$attempt" "$(date +%s%N)" >> '{}'
if [ {succeed_at} -eq 0 ] || [ "$attempt" -lt {succeed_at} ]; then
  echo "failing attempt $attempt on purpose" >&2
  exit 1
fi
printf 'processed %s (from bash)' "$(cat)"
"#,
        record.display()
    )
}

/// `(attempt, ns)` per event id, in the order they were made.
fn attempts(record: &Path) -> std::collections::BTreeMap<String, Vec<(u32, u128)>> {
    let mut out = std::collections::BTreeMap::<String, Vec<(u32, u128)>>::new();
    for line in std::fs::read_to_string(record).unwrap_or_default().lines() {
        let mut w = line.split_whitespace();
        let (id, a, t) = (w.next().unwrap(), w.next().unwrap(), w.next().unwrap());
        out.entry(id.to_string())
            .or_default()
            .push((a.parse().unwrap(), t.parse().unwrap()));
    }
    out
}

#[test]
fn a_handler_that_fails_twice_then_succeeds_sees_attempts_1_2_3() {
    let dir = tmp();
    let record = dir.path().join("attempts.txt");
    let redis = Redis::start();
    let wrapper = wrapper(dir.path(), &flaky_handler(&record, 3), &[]);
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &format!("http://{}/", wrapper.addr), "c1"),
            &[
                ("RUNR_QUEUE_BACKOFF", "200ms"),
                ("RUNR_QUEUE_BACKOFF_MAX", "5s"),
                // One entry at a time, so the record lists each entry's attempts in turn.
                ("RUNR_QUEUE_CONCURRENCY", "1"),
            ],
        ),
    );
    let mut conn = redis.conn();
    let ids: Vec<String> = (0..3)
        .map(|i| conn.xadd(STREAM, &[("msg", &format!("m{i}"))]))
        .collect();
    wait_for("every entry acknowledged after 3 attempts", LONG, || {
        (conn.pending(STREAM, GROUP) == 0 && c.delivered().len() == ids.len()).then_some(())
    });
    let seen = attempts(&record);
    for id in &ids {
        let tries = &seen[id];
        let numbers: Vec<u32> = tries.iter().map(|(a, _)| *a).collect();
        assert_eq!(numbers, [1, 2, 3], "{id}");
        // Equal jitter: retry 1 waits at least 100 ms (half of 200 ms), retry 2 at least 200 ms.
        let gap = |i: usize| Duration::from_nanos((tries[i].1 - tries[i - 1].1) as u64);
        assert!(gap(1) >= Duration::from_millis(100), "{id}: {:?}", gap(1));
        assert!(gap(2) >= Duration::from_millis(200), "{id}: {:?}", gap(2));
    }
    for (id, attempt, answer) in c.delivered() {
        assert_eq!(attempt, 3, "{id}");
        assert!(answer.starts_with("processed {\"msg\":\"m"), "{answer}");
    }
    // Each failed attempt is one warning with its number, status and next wait.
    let failed = c.lines_with("delivery failed");
    assert_eq!(failed.len(), 6, "{failed:#?}");
    assert!(
        failed.iter().all(|l| l.contains("status=500")),
        "{failed:#?}"
    );
    assert_eq!(conn.cmd_str(&["XLEN", DLQ]).int(), 0);
    c.stop_cleanly();
}

#[test]
fn after_the_last_attempt_the_entry_is_dead_lettered_with_its_fields() {
    let dir = tmp();
    let record = dir.path().join("attempts.txt");
    let redis = Redis::start();
    let wrapper = wrapper(dir.path(), &flaky_handler(&record, 0), &[]);
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &format!("http://{}/", wrapper.addr), "c1"),
            &[
                ("RUNR_QUEUE_MAX_ATTEMPTS", "3"),
                ("RUNR_QUEUE_BACKOFF", "20ms"),
                ("RUNR_QUEUE_BACKOFF_MAX", "50ms"),
            ],
        ),
    );
    let mut conn = redis.conn();
    let fields = [
        ("order", "17"),
        ("note", "ünïcode, \"quotes\""),
        ("order", "18"),
    ];
    let id = conn.xadd(STREAM, &fields);
    wait_for("the entry in the dead-letter stream", LONG, || {
        (conn.cmd_str(&["XLEN", DLQ]).int() == 1).then_some(())
    });
    wait_for("nothing pending", LONG, || {
        (conn.pending(STREAM, GROUP) == 0).then_some(())
    });
    let dead = conn.xrange(DLQ);
    let (_, got) = &dead[0];
    // The original fields, flat and in order, then what became of the entry.
    let original: Vec<(String, String)> = fields
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(&got[..3], &original[..]);
    let extra: std::collections::BTreeMap<&str, &str> = got[3..]
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(extra["runr-status"], "500");
    // The real wrapper's class (X-RunR-Error) for a handler that exits without an answer.
    assert_eq!(extra["runr-error"], "crash");
    assert_eq!(extra["runr-attempts"], "3");
    assert_eq!(extra["runr-id"], id.as_str());
    let at = extra["runr-failed-at"];
    assert!(
        at.len() == "2026-12-01T07:00:00.000Z".len() && at.ends_with('Z') && at.contains('T'),
        "{at}"
    );
    // The start of the last answer's body: the wrapper's error document.
    assert!(extra["runr-body"].starts_with('{'), "{got:?}");
    assert_eq!(extra.len(), 6, "{got:?}");
    assert_eq!(
        attempts(&record)[&id]
            .iter()
            .map(|(a, _)| *a)
            .collect::<Vec<_>>(),
        [1, 2, 3]
    );
    let lines = c.lines_with("dead-lettered");
    assert_eq!(lines.len(), 1, "{}", c.log());
    assert!(lines[0].contains("attempts=3") && lines[0].contains("status=500"));
    c.stop_cleanly();
}

/// The class is kept in the dead letter, and the answer's `Retry-After` (seconds or an HTTP
/// date) is a floor the backoff cap does not shorten.
fn retry_after_is_a_floor(status: &str, retry_after: &str) {
    let dir = tmp();
    let redis = Redis::start();
    let receiver = Receiver::start(
        dir.path(),
        &[
            "--always-fail",
            "--status",
            status,
            "--class",
            "overload",
            "--retry-after",
            retry_after,
        ],
    );
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &receiver.url(), "c1"),
            &[
                ("RUNR_QUEUE_MAX_ATTEMPTS", "2"),
                ("RUNR_QUEUE_BACKOFF", "10ms"),
                ("RUNR_QUEUE_BACKOFF_MAX", "20ms"),
            ],
        ),
    );
    let mut conn = redis.conn();
    let id = conn.xadd(STREAM, &[("k", "v")]);
    wait_for("the entry in the dead-letter stream", LONG, || {
        (conn.cmd_str(&["XLEN", DLQ]).int() == 1).then_some(())
    });
    receiver.assert_no_problems();
    let starts = receiver.phase("start");
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[0]["attempt"], 1);
    assert_eq!(starts[1]["attempt"], 2);
    // The cap is 20 ms; Retry-After is a floor it does not shorten (a lower bound: it holds
    // on a loaded machine).
    let gap = starts[1]["t"].as_f64().unwrap() - starts[0]["t"].as_f64().unwrap();
    assert!(gap >= 1.0, "{status}: retried after {gap:.3} s");
    let (_, got) = &conn.xrange(DLQ)[0];
    let find = |k: &str| got.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(find("k"), Some("v"));
    assert_eq!(find("runr-status"), Some(status));
    assert_eq!(find("runr-error"), Some("overload"));
    assert_eq!(find("runr-attempts"), Some("2"));
    assert_eq!(find("runr-id"), Some(id.as_str()));
    let failed = c.lines_with("delivery failed");
    assert!(field(&failed[0], "retry_in").is_some(), "{}", failed[0]);
    c.stop_cleanly();
}

#[test]
fn a_503_retry_after_outlasts_the_cap() {
    retry_after_is_a_floor("503", "2");
}

#[test]
fn a_429_retry_after_outlasts_the_cap_as_a_503_does() {
    retry_after_is_a_floor("429", "2");
}

#[test]
fn a_429_retry_after_as_an_http_date() {
    // Three seconds after the answer, to the second: at least 2 s of wait.
    retry_after_is_a_floor("429", "date+3");
}
