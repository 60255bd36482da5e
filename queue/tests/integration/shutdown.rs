//! SIGTERM: no more reads, deliveries in flight finish (up to the drain limit), entries waiting
//! for a retry are left pending for the next consumer, which counts their attempts on.

use std::time::{Duration, Instant};

use runr_testkit::redis::Redis;
use runr_testkit::wait_for;

use crate::support::*;

#[test]
fn sigterm_lets_deliveries_in_flight_finish_and_reads_no_more() {
    let dir = tmp();
    let redis = Redis::start();
    let gate = Gate::closed(dir.path(), "held");
    let receiver = Receiver::start(dir.path(), &["--hold-while", gate.arg()]);
    create_group(&redis);
    let mut conn = redis.conn();
    let ids: Vec<String> = (0..6)
        .map(|i| conn.xadd(STREAM, &[("n", &i.to_string())]))
        .collect();
    let env = with(
        base_env(&redis, &receiver.url(), "a"),
        &[("RUNR_QUEUE_CONCURRENCY", "3")],
    );
    let mut a = Consumer::start(dir.path(), "a", &env);
    receiver.wait_started(3);
    // SIGTERM while the receiver holds all three; they finish after it, and the drain waits
    // for them, not for its 25 s limit.
    a.child.signal(nix::sys::signal::Signal::SIGTERM);
    a.wait_log("stopping: no more reads");
    gate.open();
    let status = a.child.wait_timeout(LONG);
    assert!(status.success(), "{status}: {}", a.log());
    assert!(!a.log().contains("drain limit"), "{}", a.log());
    assert!(
        a.log().contains("] INFO stopped delivered=3 "),
        "{}",
        a.log()
    );
    // The three in flight were answered and acknowledged before it exited; nothing else was
    // read (the other three are not pending on anyone).
    let first: Vec<String> = receiver
        .phase("start")
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(first.len(), 3, "{first:?}");
    assert_eq!(receiver.succeeded().len(), 3);
    assert_eq!(conn.pending(STREAM, GROUP), 0);
    assert!(a.log().contains("stopping: no more reads"));
    assert!(a.log().contains("delivered=3"), "{}", a.log());
    // The rest are new entries for the next consumer: attempt 1, once each.
    let mut b = Consumer::start(dir.path(), "b", &with(env, &[("RUNR_QUEUE_CONSUMER", "b")]));
    wait_all_acked(&redis, &receiver, &ids);
    let starts = receiver.phase("start");
    assert_eq!(starts.len(), 6);
    assert!(starts.iter().all(|r| r["attempt"] == 1));
    b.stop_cleanly();
}

#[test]
fn an_entry_waiting_to_retry_is_left_pending_and_its_attempts_go_on() {
    let dir = tmp();
    let redis = Redis::start();
    // Attempt 1 fails; from attempt 2 on the receiver answers 200.
    let receiver = Receiver::start(dir.path(), &["--fail-until", "2"]);
    let env = |name: &str| {
        with(
            base_env(&redis, &receiver.url(), name),
            &[
                ("RUNR_QUEUE_BACKOFF", "1m"),
                ("RUNR_QUEUE_BACKOFF_MAX", "1m"),
                ("RUNR_QUEUE_CLAIM_IDLE", "500ms"),
            ],
        )
    };
    let mut a = Consumer::start(dir.path(), "a", &env("a"));
    let id = redis.conn().xadd(STREAM, &[("k", "v")]);
    a.wait_log("delivery failed");
    // It does not sit out its minute of backoff: stop_cleanly sees a drain that completed,
    // which the 25 s drain limit would have cut short otherwise.
    a.stop_cleanly();
    assert!(a
        .log()
        .contains("left pending at shutdown while waiting to retry"));
    let pending = redis.conn().pending_entries(STREAM, GROUP);
    assert_eq!(pending.len(), 1);
    assert_eq!(
        (pending[0].0.as_str(), pending[0].1.as_str(), pending[0].3),
        (id.as_str(), "a", 1)
    );

    let mut b = Consumer::start(dir.path(), "b", &env("b"));
    b.wait_log("claimed entries left pending by another consumer");
    wait_all_acked(&redis, &receiver, std::slice::from_ref(&id));
    let attempts: Vec<_> = receiver
        .phase("start")
        .iter()
        .map(|r| r["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(attempts, [1, 2]);
    b.stop_cleanly();
}

#[test]
fn the_drain_limit_bounds_the_wait_for_slow_deliveries() {
    let dir = tmp();
    let redis = Redis::start();
    // Held for as long as the test runs: only the drain limit can end the wait.
    let gate = Gate::closed(dir.path(), "never");
    let receiver = Receiver::start(dir.path(), &["--hold-while", gate.arg()]);
    let mut a = Consumer::start(
        dir.path(),
        "a",
        &with(
            base_env(&redis, &receiver.url(), "a"),
            &[("RUNR_QUEUE_DRAIN_TIMEOUT", "1s")],
        ),
    );
    let id = redis.conn().xadd(STREAM, &[("k", "v")]);
    receiver.wait_started(1);
    let t = Instant::now();
    assert!(a.terminate(LONG).success(), "{}", a.log());
    // At least the limit (a lower bound holds on any machine); that it was the limit and not
    // the delivery that ended the wait: the delivery is still held, and the line says so.
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    assert!(receiver.phase("end").is_empty());
    assert!(
        a.log().contains("stopped at the drain limit"),
        "{}",
        a.log()
    );
    // Unfinished: pending for the next consumer.
    let mut conn = redis.conn();
    wait_for("the entry to stay pending", LONG, || {
        (conn
            .pending_entries(STREAM, GROUP)
            .first()
            .map(|p| p.0.clone())
            == Some(id.clone()))
        .then_some(())
    });
}
