//! Delivery: every CloudEvent attribute as the SDK reads it, the body byte for byte, the ack,
//! and the whole path through the real wrapper and the spec's Bash handler.

use runr_testkit::redis::Redis;
use runr_testkit::wait_for;

use crate::support::*;

#[test]
fn every_attribute_is_what_the_cloudevents_sdk_expects() {
    let dir = tmp();
    let redis = Redis::start();
    let receiver = Receiver::start(dir.path(), &[]);
    let mut c = Consumer::start(dir.path(), "c1", &base_env(&redis, &receiver.url(), "c1"));
    let entries: Vec<Vec<(&str, &str)>> = vec![
        vec![("msg", "hi")],
        vec![
            ("item", "42"),
            ("note", "quotes \" and \\ and\nnewlines\tand \u{1} control"),
        ],
        vec![("unicode", "grüße 😀 €"), ("empty", "")],
        // A name twice: passed on as Redis keeps it (most parsers, the SDK's too, keep the last).
        vec![("a", "1"), ("a", "2")],
    ];
    let mut conn = redis.conn();
    let ids: Vec<String> = entries.iter().map(|f| conn.xadd(STREAM, f)).collect();
    wait_all_acked(&redis, &receiver, &ids);
    receiver.assert_no_problems();

    let starts = receiver.phase("start");
    assert_eq!(starts.len(), ids.len(), "one delivery each: {starts:?}");
    for (id, fields) in ids.iter().zip(&entries) {
        let r = starts
            .iter()
            .find(|r| r["id"] == id.as_str())
            .expect("delivered");
        let a = &r["attributes"];
        assert_eq!(a["specversion"], "1.0");
        assert_eq!(a["type"], "dev.runr.queue.message");
        assert_eq!(a["source"], SOURCE);
        assert_eq!(a["id"], id.as_str());
        assert_eq!(a["datacontenttype"], "application/json");
        // ce-time is the entry's own time: the milliseconds of its id.
        let ms: u64 = id.split('-').next().unwrap().parse().unwrap();
        let want_time = runr_base::fmt::rfc3339_millis(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
        );
        assert_eq!(a["time"], want_time.as_str());
        assert_eq!(r["attempt"], 1);
        // The body byte for byte, and the data as the SDK decoded it.
        let body = expected_body(fields);
        assert_eq!(
            r["sha256"],
            sha256(body.as_bytes()).as_str(),
            "{id}: {body}"
        );
        assert_eq!(r["length"], body.len());
        let mut data = serde_json::Map::new();
        for (k, v) in fields {
            data.insert(k.to_string(), serde_json::Value::String(v.to_string()));
        }
        assert_eq!(r["data"], serde_json::Value::Object(data));
    }
    // Acknowledged: nothing pending, nothing dead-lettered, and the consumer says so.
    assert_eq!(conn.pending(STREAM, GROUP), 0);
    assert_eq!(conn.cmd_str(&["XLEN", DLQ]).int(), 0);
    let delivered = c.wait_delivered(ids.len());
    assert_eq!(delivered.len(), ids.len(), "{}", c.log());
    for (id, attempt, answer) in delivered {
        assert_eq!(attempt, 1);
        assert_eq!(answer, format!("ok {id}"));
    }
    c.stop_cleanly();
}

/// Every entry through the wrapper in exec mode to the spec's handler, each answer checked.
fn through_the_wrapper(concurrency: &str, entries: usize) {
    let dir = tmp();
    let redis = Redis::start();
    let wrapper = wrapper(dir.path(), SPEC_HANDLER, &[]);
    let target = format!("http://{}/", wrapper.addr);
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &target, "c1"),
            &[("RUNR_QUEUE_CONCURRENCY", concurrency)],
        ),
    );
    let mut conn = redis.conn();
    // The spec's example first, then entries of growing size.
    let mut bodies = vec![r#"{"msg":"hi"}"#.to_string()];
    let mut ids = vec![conn.xadd(STREAM, &[("msg", "hi")])];
    for i in 1..entries {
        let v = format!("entry {i} {}", "x".repeat(i * 37));
        bodies.push(expected_body(&[("msg", &v)]));
        ids.push(conn.xadd(STREAM, &[("msg", &v)]));
    }
    wait_for("every entry acknowledged", LONG, || {
        (conn.pending(STREAM, GROUP) == 0 && c.delivered().len() >= ids.len()).then_some(())
    });
    let delivered = c.delivered();
    assert_eq!(delivered.len(), ids.len(), "{}", c.log());
    for (id, body) in ids.iter().zip(&bodies) {
        let (_, attempt, answer) = delivered
            .iter()
            .find(|(d, _, _)| d == id)
            .unwrap_or_else(|| panic!("{id} not delivered:\n{}", c.log()));
        assert_eq!(*attempt, 1);
        // The consumer logs the first 256 bytes of the answer: what the handler printed.
        let want = format!("processed {body} (from bash)");
        let want: String = want.chars().take(256).collect();
        assert_eq!(*answer, want, "{id}");
    }
    assert!(c
        .log()
        .lines()
        .map(runr_testkit::logfmt::plain)
        .any(|l| l.contains(r#"answer=processed {"msg":"hi"} (from bash)"#)));
    assert_eq!(conn.cmd_str(&["XLEN", DLQ]).int(), 0);
    c.stop_cleanly();
}

#[test]
fn through_the_wrapper_to_the_spec_bash_handler() {
    through_the_wrapper("1", 40);
}

#[test]
fn through_the_wrapper_to_the_spec_bash_handler_8_at_once() {
    through_the_wrapper("8", 80);
}

#[test]
fn the_group_is_created_at_the_end_of_an_existing_stream() {
    let dir = tmp();
    let redis = Redis::start();
    let receiver = Receiver::start(dir.path(), &[]);
    let mut conn = redis.conn();
    // Before the group exists: not for this consumer (the group starts at `$`).
    let old = conn.xadd(STREAM, &[("old", "1")]);
    let mut c = Consumer::start(dir.path(), "c1", &base_env(&redis, &receiver.url(), "c1"));
    let new = conn.xadd(STREAM, &[("new", "1")]);
    wait_all_acked(&redis, &receiver, std::slice::from_ref(&new));
    assert!(!receiver.succeeded().contains_key(&old));
    assert_eq!(receiver.phase("start").len(), 1);
    c.stop_cleanly();
}
