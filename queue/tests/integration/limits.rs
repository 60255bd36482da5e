//! What goes to the dead-letter stream at once: answers the operator listed in
//! RUNR_QUEUE_DEAD_LETTER_AT_ONCE (nothing by default: every non-2xx answer is retried), an
//! entry whose body would pass RUNR_QUEUE_MAX_BODY (the wrapper's own limit by default), fields
//! that are not UTF-8; and the answer's body, read within bounds of bytes and time.

use runr_testkit::redis::{Redis, Reply};
use runr_testkit::wait_for;

use crate::support::*;

fn dead_letter_fields(redis: &Redis, n: usize) -> Vec<Vec<(String, String)>> {
    let mut conn = redis.conn();
    wait_for(&format!("{n} dead-lettered entries"), LONG, || {
        (conn.cmd_str(&["XLEN", DLQ]).int() as usize >= n && conn.pending(STREAM, GROUP) == 0)
            .then_some(())
    });
    conn.xrange(DLQ).into_iter().map(|(_, f)| f).collect()
}

fn get<'a>(fields: &'a [(String, String)], name: &str) -> &'a str {
    fields
        .iter()
        .rev()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} in {fields:?}"))
}

fn attempts_of(receiver: &Receiver, id: &str) -> Vec<u64> {
    receiver
        .phase("start")
        .iter()
        .filter(|r| r["id"] == id)
        .map(|r| r["attempt"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_413_with_the_limit_class_is_retried_like_any_other_answer() {
    // The spec: every non-2xx answer is retried. Nothing is dead-lettered at once by default.
    let dir = tmp();
    let redis = Redis::start();
    let receiver = Receiver::start(
        dir.path(),
        &["--always-fail", "--status", "413", "--class", "limit"],
    );
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &receiver.url(), "c1"),
            &[
                ("RUNR_QUEUE_MAX_ATTEMPTS", "3"),
                ("RUNR_QUEUE_BACKOFF", "10ms"),
                ("RUNR_QUEUE_BACKOFF_MAX", "10ms"),
            ],
        ),
    );
    let id = redis.conn().xadd(STREAM, &[("big", "payload")]);
    let dead = dead_letter_fields(&redis, 1);
    assert_eq!(attempts_of(&receiver, &id), [1, 2, 3]);
    assert_eq!(get(&dead[0], "big"), "payload");
    assert_eq!(get(&dead[0], "runr-status"), "413");
    assert_eq!(get(&dead[0], "runr-error"), "limit");
    assert_eq!(get(&dead[0], "runr-attempts"), "3");
    assert_eq!(get(&dead[0], "runr-id"), id);
    c.stop_cleanly();
}

#[test]
fn the_operators_list_dead_letters_those_answers_at_once() {
    let dir = tmp();
    let redis = Redis::start();
    let receiver = Receiver::start(dir.path(), &["--by-field"]);
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &receiver.url(), "c1"),
            &[
                ("RUNR_QUEUE_MAX_ATTEMPTS", "3"),
                ("RUNR_QUEUE_BACKOFF", "10ms"),
                ("RUNR_QUEUE_BACKOFF_MAX", "10ms"),
                ("RUNR_QUEUE_DEAD_LETTER_AT_ONCE", "limit, 422"),
            ],
        ),
    );
    // (status, class, attempts made, runr-error): listed classes and statuses end after one
    // attempt, everything else after the last.
    let cases: [(&str, &str, u64, &str); 6] = [
        ("413", "limit", 1, "limit"),
        ("502", "limit", 1, "limit"),
        ("422", "", 1, ""),
        ("413", "", 3, ""),
        ("500", "crash", 3, "crash"),
        ("400", "", 3, ""),
    ];
    let mut conn = redis.conn();
    let ids: Vec<String> = cases
        .iter()
        .map(|(status, class, _, _)| {
            let mut fields = vec![("status", *status)];
            if !class.is_empty() {
                fields.push(("class", *class));
            }
            conn.xadd(STREAM, &fields)
        })
        .collect();
    let dead = dead_letter_fields(&redis, cases.len());
    receiver.assert_no_problems();
    for (id, (status, _, attempts, class)) in ids.iter().zip(cases) {
        let f = dead
            .iter()
            .find(|f| get(f, "runr-id") == id)
            .unwrap_or_else(|| panic!("{id} not dead-lettered"));
        assert_eq!(
            attempts_of(&receiver, id).len() as u64,
            attempts,
            "{status} {class:?}"
        );
        assert_eq!(get(f, "runr-attempts"), attempts.to_string());
        assert_eq!(get(f, "runr-status"), status);
        assert_eq!(get(f, "runr-error"), class);
    }
    c.stop_cleanly();
}

#[test]
fn entries_over_the_body_limit_or_not_utf8_are_never_delivered() {
    let dir = tmp();
    let redis = Redis::start();
    let receiver = Receiver::start(dir.path(), &[]);
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &receiver.url(), "c1"),
            &[("RUNR_QUEUE_MAX_BODY", "1KiB")],
        ),
    );
    let mut conn = redis.conn();
    // {"k":"<v>"} is 8 bytes plus the value: 1016 bytes of value is exactly 1 KiB.
    let at_limit = "a".repeat(1016);
    let over = "a".repeat(1017);
    // Escapes count: 400 newlines are 800 bytes of JSON, 600 are 1200.
    let escaped_over = "\n".repeat(600);
    let ok_id = conn.xadd(STREAM, &[("k", &at_limit)]);
    let over_id = conn.xadd(STREAM, &[("k", &over)]);
    let esc_id = conn.xadd(STREAM, &[("k", &escaped_over)]);
    let bad = conn.cmd(&[b"XADD", STREAM.as_bytes(), b"*", b"k", b"\xff\xfe"]);
    let bad_id = bad.text();
    wait_all_acked(&redis, &receiver, std::slice::from_ref(&ok_id));
    let dead = dead_letter_fields(&redis, 3);
    let starts = receiver.phase("start");
    assert_eq!(starts.len(), 1, "only the entry at the limit is delivered");
    assert_eq!(starts[0]["length"], 1024);
    let by_id = |id: &str| {
        dead.iter()
            .find(|f| get(f, "runr-id") == id)
            .unwrap_or_else(|| panic!("{id} not dead-lettered: {dead:?}"))
    };
    for id in [&over_id, &esc_id] {
        let f = by_id(id);
        assert_eq!(get(f, "runr-error"), "limit");
        assert_eq!(get(f, "runr-status"), "0");
        assert_eq!(get(f, "runr-attempts"), "0");
    }
    assert_eq!(get(by_id(&over_id), "k"), over);
    let f = by_id(&bad_id);
    assert_eq!(get(f, "runr-error"), "encoding");
    // The raw bytes are kept as they were.
    let raw = conn.cmd_str(&["XRANGE", DLQ, "-", "+"]);
    let entry = raw
        .items()
        .iter()
        .map(|e| e.items()[1].items().to_vec())
        .find(|f| f.iter().any(|v| v.text() == bad_id))
        .expect("the non-UTF-8 entry");
    assert_eq!(entry[0], Reply::Bulk(b"k".to_vec()));
    assert_eq!(entry[1], Reply::Bulk(b"\xff\xfe".to_vec()));
    c.stop_cleanly();
}

#[test]
fn an_answer_body_past_the_drain_limit_is_not_buffered_and_the_status_counts() {
    let dir = tmp();
    let redis = Redis::start();
    // 2 MiB answers: past the 1 MiB the consumer reads to keep a connection.
    let receiver = Receiver::start(dir.path(), &["--answer-bytes", "2097152"]);
    let mut c = Consumer::start(dir.path(), "c1", &base_env(&redis, &receiver.url(), "c1"));
    let mut conn = redis.conn();
    let ids: Vec<String> = (0..3)
        .map(|i| conn.xadd(STREAM, &[("n", &i.to_string())]))
        .collect();
    // Not `wait_all_acked`: that counts only answers the receiver wrote out whole, and the
    // consumer closes after 1 MiB, so on a busy machine the receiver's write of the rest fails.
    wait_for("every entry acknowledged", LONG, || {
        (conn.pending(STREAM, GROUP) == 0 && c.delivered().len() >= ids.len()).then_some(())
    });
    assert_eq!(receiver.phase("start").len(), 3);
    let delivered = c.delivered();
    assert_eq!(delivered.len(), 3, "{}", c.log());
    for (_, attempt, answer) in &delivered {
        assert_eq!(*attempt, 1);
        assert_eq!(answer, "<body not read: longer than 1048576 bytes>");
    }
    assert_eq!(conn.cmd_str(&["XLEN", DLQ]).int(), 0);
    c.stop_cleanly();
}

#[test]
fn a_2xx_whose_body_stalls_is_acknowledged_at_its_head() {
    let dir = tmp();
    let redis = Redis::start();
    // Each 200 promises 1000 bytes more than it sends, then sends nothing for an hour.
    let receiver = Receiver::start(dir.path(), &["--stall-body"]);
    // One slot and the default delivery timeout (5 minutes): the three entries get through
    // only if a stalled body neither delays the ack nor holds the slot.
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &receiver.url(), "c1"),
            &[("RUNR_QUEUE_CONCURRENCY", "1")],
        ),
    );
    let mut conn = redis.conn();
    let ids: Vec<String> = (0..3)
        .map(|i| conn.xadd(STREAM, &[("n", &i.to_string())]))
        .collect();
    wait_for("every entry acknowledged", LONG, || {
        (conn.pending(STREAM, GROUP) == 0 && c.delivered().len() == ids.len()).then_some(())
    });
    assert_eq!(receiver.phase("start").len(), 3);
    // The receiver is still stalling every one of them.
    assert!(receiver.phase("end").is_empty());
    for (_, attempt, answer) in c.delivered() {
        assert_eq!(attempt, 1);
        assert_eq!(answer, "<body not read: not complete within 1s>");
    }
    assert_eq!(conn.cmd_str(&["XLEN", DLQ]).int(), 0);
    c.stop_cleanly();
}

/// The spec's handler shape, counting what it was given: `<bytes of the body>`.
const COUNTING_HANDLER: &str =
    "#!/usr/bin/env bash\nset -euo pipefail\nprintf 'got %s bytes' \"$(wc -c)\"\n";

#[test]
fn the_default_body_limit_is_the_wrappers_own() {
    let dir = tmp();
    let redis = Redis::start();
    let wrapper = wrapper(dir.path(), COUNTING_HANDLER, &[]);
    let target = format!("http://{}/", wrapper.addr);
    let env = |name: &str, extra: &[(&str, &str)]| {
        with(
            base_env(&redis, &target, name),
            &[
                &[
                    ("RUNR_QUEUE_MAX_ATTEMPTS", "2"),
                    ("RUNR_QUEUE_BACKOFF", "10ms"),
                    ("RUNR_QUEUE_BACKOFF_MAX", "10ms"),
                    ("RUNR_QUEUE_CONCURRENCY", "1"),
                ][..],
                extra,
            ]
            .concat(),
        )
    };
    // {"k":"<v>"} is 8 bytes plus the value.
    const LIMIT: usize = 10 << 20;
    let value = |body: usize| "v".repeat(body - 8);
    create_group(&redis);
    let mut conn = redis.conn();
    let two_mib = conn.xadd(STREAM, &[("k", &value(2 << 20))]);
    let at_limit = conn.xadd(STREAM, &[("k", &value(LIMIT))]);
    let over = conn.xadd(STREAM, &[("k", &value(LIMIT + 1))]);
    let mut c = Consumer::start(dir.path(), "c1", &env("c1", &[]));
    wait_for("two delivered, one dead-lettered", LONG, || {
        (conn.pending(STREAM, GROUP) == 0
            && c.delivered().len() == 2
            && conn.cmd_str(&["XLEN", DLQ]).int() == 1)
            .then_some(())
    });
    // What the function accepts is delivered, byte for byte: 2 MiB (the entry) and
    // exactly the limit.
    let delivered = c.delivered();
    for (id, size) in [(&two_mib, 2 << 20), (&at_limit, LIMIT)] {
        let (_, attempt, answer) = delivered.iter().find(|(d, _, _)| d == id).unwrap();
        assert_eq!(
            (*attempt, answer.as_str()),
            (1, format!("got {size} bytes").as_str())
        );
    }
    // One byte more never leaves the queue: the wrapper would answer 413.
    let (_, f) = &conn.xrange(DLQ)[0];
    let find = |k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(find("runr-id"), Some(over.as_str()));
    assert_eq!(find("runr-error"), Some("limit"));
    assert_eq!(find("runr-status"), Some("0"));
    assert_eq!(find("runr-attempts"), Some("0"));
    c.stop_cleanly();

    // Why the defaults must agree: with the consumer's limit raised, the wrapper refuses that
    // entry (413 `limit`, at its Content-Length, before reading a byte) and closes the
    // connection while the body is still being sent, so the consumer mostly sees the write fail
    // (`unreachable`) rather than the 413. Either way it is retried to the last attempt.
    conn.cmd_str(&["DEL", DLQ]);
    let over_again = conn.xadd(STREAM, &[("k", &value(LIMIT + 1))]);
    let mut c = Consumer::start(
        dir.path(),
        "c2",
        &env("c2", &[("RUNR_QUEUE_MAX_BODY", "11MiB")]),
    );
    let dead = dead_letter_fields(&redis, 1);
    assert_eq!(get(&dead[0], "runr-id"), over_again);
    let fate = (get(&dead[0], "runr-status"), get(&dead[0], "runr-error"));
    assert!(
        [("413", "limit"), ("0", "unreachable")].contains(&fate),
        "{fate:?}"
    );
    assert_eq!(get(&dead[0], "runr-attempts"), "2");
    c.stop_cleanly();
}
