//! What retrying cannot fix goes to the dead-letter stream at once: a 413 with
//! `X-RunR-Error: limit`, an entry whose body would pass RUNR_QUEUE_MAX_BODY, fields that are
//! not UTF-8.

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

#[test]
fn a_413_with_the_limit_class_is_dead_lettered_after_one_attempt() {
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
                ("RUNR_QUEUE_MAX_ATTEMPTS", "5"),
                ("RUNR_QUEUE_BACKOFF", "10ms"),
            ],
        ),
    );
    let id = redis.conn().xadd(STREAM, &[("big", "payload")]);
    let dead = dead_letter_fields(&redis, 1);
    assert_eq!(receiver.phase("start").len(), 1, "retried a 413 limit");
    assert_eq!(get(&dead[0], "big"), "payload");
    assert_eq!(get(&dead[0], "runr-status"), "413");
    assert_eq!(get(&dead[0], "runr-error"), "limit");
    assert_eq!(get(&dead[0], "runr-attempts"), "1");
    assert_eq!(get(&dead[0], "runr-id"), id);
    c.stop_cleanly();
}

#[test]
fn a_413_without_a_class_is_the_handlers_own_and_is_retried() {
    let dir = tmp();
    let redis = Redis::start();
    let receiver = Receiver::start(dir.path(), &["--always-fail", "--status", "413"]);
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
    redis.conn().xadd(STREAM, &[("k", "v")]);
    let dead = dead_letter_fields(&redis, 1);
    let attempts: Vec<_> = receiver
        .phase("start")
        .iter()
        .map(|r| r["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(attempts, [1, 2, 3]);
    assert_eq!(get(&dead[0], "runr-status"), "413");
    assert_eq!(get(&dead[0], "runr-error"), "");
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
    wait_all_acked(&redis, &receiver, &ids);
    let delivered = c.delivered();
    assert_eq!(delivered.len(), 3, "{}", c.log());
    for (_, attempt, answer) in &delivered {
        assert_eq!(*attempt, 1);
        assert_eq!(answer, "<body not read: longer than 1048576 bytes>");
    }
    assert_eq!(conn.cmd_str(&["XLEN", DLQ]).int(), 0);
    c.stop_cleanly();
}
