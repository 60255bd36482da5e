//! At least once across crashes: a consumer killed with SIGKILL mid-delivery loses nothing; its
//! entries are claimed by another consumer (or re-read by itself when it comes back), and the
//! redelivery counts as an attempt.

use std::collections::BTreeMap;

use nix::sys::signal::Signal;
use runr_testkit::redis::Redis;

use crate::support::*;

#[test]
fn kill_9_mid_delivery_and_another_consumer_claims_everything() {
    let dir = tmp();
    let redis = Redis::start();
    let gate = Gate::closed(dir.path(), "held");
    let receiver = Receiver::start(dir.path(), &["--hold-while", gate.arg()]);
    let env = |name: &str| {
        with(
            base_env(&redis, &receiver.url(), name),
            &[
                ("RUNR_QUEUE_CONCURRENCY", "4"),
                ("RUNR_QUEUE_CLAIM_IDLE", "1s"),
            ],
        )
    };
    let mut a = Consumer::start(dir.path(), "a", &env("a"));
    let mut conn = redis.conn();
    let ids: Vec<String> = (0..24)
        .map(|i| conn.xadd(STREAM, &[("n", &i.to_string())]))
        .collect();
    // A has 4 deliveries in flight, all held by the receiver: kill it now.
    receiver.wait_started(4);
    a.child.signal(Signal::SIGKILL);
    a.child.wait_timeout(LONG);
    let in_flight_on_a: Vec<String> = conn
        .pending_entries(STREAM, GROUP)
        .into_iter()
        .filter(|(_, consumer, _, _)| consumer == "a")
        .map(|(id, _, _, _)| id)
        .collect();
    assert_eq!(in_flight_on_a.len(), 4, "A's slots: {in_flight_on_a:?}");
    gate.open();

    let mut b = Consumer::start(dir.path(), "b", &env("b"));
    wait_all_acked(&redis, &receiver, &ids);
    receiver.assert_no_problems();

    // Nothing lost: every entry answered 200 at least once, to a live consumer.
    let ok = receiver.succeeded();
    for id in &ids {
        assert!(ok.contains_key(id), "{id} never processed");
    }
    // Duplicates: the deliveries A had in flight ran on the receiver and were delivered again.
    let mut starts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in receiver.phase("start") {
        starts
            .entry(r["id"].as_str().unwrap().to_string())
            .or_default()
            .push(r["attempt"].as_u64().unwrap());
    }
    let duplicates: Vec<_> = starts.iter().filter(|(_, a)| a.len() > 1).collect();
    eprintln!(
        "{} entries, {} delivered more than once: {duplicates:?}",
        ids.len(),
        duplicates.len()
    );
    for id in &in_flight_on_a {
        // The redelivery after the crash counts: B's attempt is 2.
        let attempts = &starts[id];
        assert!(
            attempts.contains(&1) && attempts.contains(&2),
            "{id}: {attempts:?}"
        );
    }
    assert!(b
        .log()
        .contains("claimed entries left pending by another consumer"));
    assert_eq!(conn.cmd_str(&["XLEN", DLQ]).int(), 0);
    b.stop_cleanly();
}

#[test]
fn a_restarted_consumer_re_reads_its_own_pending_entries_at_once() {
    let dir = tmp();
    let redis = Redis::start();
    let gate = Gate::closed(dir.path(), "held");
    let receiver = Receiver::start(dir.path(), &["--hold-while", gate.arg()]);
    // A claim interval far away: only the re-read at start can deliver them quickly.
    let env = with(
        base_env(&redis, &receiver.url(), "same"),
        &[
            ("RUNR_QUEUE_CONCURRENCY", "3"),
            ("RUNR_QUEUE_CLAIM_IDLE", "10m"),
        ],
    );
    let mut first = Consumer::start(dir.path(), "first", &env);
    let mut conn = redis.conn();
    let ids: Vec<String> = (0..3)
        .map(|i| conn.xadd(STREAM, &[("n", &i.to_string())]))
        .collect();
    receiver.wait_started(3);
    first.child.signal(Signal::SIGKILL);
    first.child.wait_timeout(LONG);
    assert_eq!(conn.pending(STREAM, GROUP), 3);
    gate.open();

    let mut again = Consumer::start(dir.path(), "again", &env);
    wait_all_acked(&redis, &receiver, &ids);
    let second: Vec<u64> = receiver
        .phase("start")
        .iter()
        .skip(3)
        .map(|r| r["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(second, [2, 2, 2]);
    // Logged once the re-read is over: when a slot is free for the next read.
    again.wait_log("re-read this consumer's own pending entries entries=3");
    again.stop_cleanly();
}

#[test]
fn a_delivery_slower_than_the_claim_idle_time_is_not_taken_over() {
    let dir = tmp();
    let redis = Redis::start();
    // Each delivery takes 8 s, well past the claim idle time. The heartbeat runs every
    // CLAIM_IDLE/3: a consumer stalled for more than 2 s on a loaded machine would still lose
    // an entry, so the margin is that, not a fraction of a second.
    let receiver = Receiver::start(dir.path(), &["--sleep", "8"]);
    let env = |name: &str| {
        with(
            base_env(&redis, &receiver.url(), name),
            &[("RUNR_QUEUE_CLAIM_IDLE", "3s")],
        )
    };
    let mut a = Consumer::start(dir.path(), "a", &env("a"));
    let mut b = Consumer::start(dir.path(), "b", &env("b"));
    let mut conn = redis.conn();
    let ids: Vec<String> = (0..4)
        .map(|i| conn.xadd(STREAM, &[("n", &i.to_string())]))
        .collect();
    wait_all_acked(&redis, &receiver, &ids);
    // The heartbeat kept every entry fresh: each was delivered once, on its first attempt.
    let starts = receiver.phase("start");
    assert_eq!(starts.len(), ids.len(), "{starts:#?}");
    assert!(starts.iter().all(|r| r["attempt"] == 1));
    a.stop_cleanly();
    b.stop_cleanly();
}
