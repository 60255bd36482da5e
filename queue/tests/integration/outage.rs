//! Redis going away is waited out: logged once, never a crash, nothing lost.

use runr_testkit::redis::Redis;
use runr_testkit::wait_for;

use crate::support::*;

#[test]
fn redis_stopped_and_started_mid_run() {
    let dir = tmp();
    let mut redis = Redis::start();
    let receiver = Receiver::start(dir.path(), &["--sleep", "0.5"]);
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &receiver.url(), "c1"),
            &[("RUNR_QUEUE_CONCURRENCY", "4")],
        ),
    );
    let mut ids: Vec<String> = {
        let mut conn = redis.conn();
        (0..8)
            .map(|i| conn.xadd(STREAM, &[("n", &i.to_string())]))
            .collect()
    };
    // Stop Redis while deliveries are in flight: their acks have to wait for it.
    receiver.wait_started(2);
    redis.stop();
    c.wait_log("redis is unavailable");
    // The deliveries in flight finish against a Redis that is not there.
    wait_for("the deliveries in flight to end", LONG, || {
        let r = receiver.records();
        let started = r.iter().filter(|r| r["phase"] == "start").count();
        let ended = r.iter().filter(|r| r["phase"] == "end").count();
        (started == ended).then_some(())
    });
    assert!(
        c.running(),
        "the consumer exited during the outage:\n{}",
        c.log()
    );
    redis.start_again();
    {
        let mut conn = redis.conn();
        ids.extend((8..16).map(|i| conn.xadd(STREAM, &[("n", &i.to_string())])));
    }
    wait_all_acked(&redis, &receiver, &ids);
    receiver.assert_no_problems();
    c.wait_log("redis is available again");
    assert!(c.running());
    // One outage: one line when it began, one when it ended.
    assert_eq!(c.lines_with("redis is unavailable").len(), 1, "{}", c.log());
    assert_eq!(
        c.lines_with("redis is available again").len(),
        1,
        "{}",
        c.log()
    );
    let mut conn = redis.conn();
    assert_eq!(conn.cmd_str(&["XLEN", DLQ]).int(), 0);
    let status = c.terminate(LONG);
    assert!(status.success(), "{status}: {}", c.log());
    assert!(c.log().contains("redis_outages=1"), "{}", c.log());
}

#[test]
fn a_consumer_started_before_redis_waits_for_it() {
    let dir = tmp();
    let mut redis = Redis::start();
    redis.stop();
    let receiver = Receiver::start(dir.path(), &[]);
    let mut c = Consumer::spawn(dir.path(), "c1", &base_env(&redis, &receiver.url(), "c1"));
    c.wait_log("redis is unavailable");
    assert!(c.running());
    redis.start_again();
    c.wait_log("consuming");
    let id = redis.conn().xadd(STREAM, &[("k", "v")]);
    wait_all_acked(&redis, &receiver, &[id]);
    c.stop_cleanly();
}

#[test]
fn a_redis_that_lost_its_data_gets_the_group_again() {
    let dir = tmp();
    let redis = Redis::start();
    let receiver = Receiver::start(dir.path(), &[]);
    let mut c = Consumer::start(dir.path(), "c1", &base_env(&redis, &receiver.url(), "c1"));
    let mut conn = redis.conn();
    let first = conn.xadd(STREAM, &[("k", "1")]);
    wait_all_acked(&redis, &receiver, std::slice::from_ref(&first));
    // What a restart without persistence looks like: the stream and its group are gone.
    assert_eq!(conn.cmd_str(&["DEL", STREAM]).int(), 1);
    c.wait_log("created it again");
    let second = conn.xadd(STREAM, &[("k", "2")]);
    wait_all_acked(&redis, &receiver, &[first, second]);
    c.stop_cleanly();
}
