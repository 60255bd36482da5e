//! RUNR_QUEUE_CONCURRENCY bounds the deliveries in flight: the bound is reached, never passed.

use runr_testkit::redis::Redis;

use crate::support::*;

fn max_in_flight(concurrency: usize, entries: usize) -> (usize, Vec<String>, Vec<String>) {
    let dir = tmp();
    let redis = Redis::start();
    // The first `concurrency` deliveries wait until that many are in flight together (the
    // bound is reached however slow the machine is); the rest take 0.2 s each, so more would
    // show if the bound let them through.
    let n = concurrency.to_string();
    let receiver = Receiver::start(dir.path(), &["--barrier", &n, "--sleep", "0.2"]);
    create_group(&redis);
    // Every entry is there before the consumer starts, so it could take them all at once.
    let mut conn = redis.conn();
    let ids: Vec<String> = (0..entries)
        .map(|i| conn.xadd(STREAM, &[("n", &i.to_string())]))
        .collect();
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &receiver.url(), "c1"),
            &[("RUNR_QUEUE_CONCURRENCY", &n)],
        ),
    );
    wait_all_acked(&redis, &receiver, &ids);
    receiver.assert_no_problems();
    let starts = receiver.phase("start");
    assert_eq!(starts.len(), entries, "one delivery per entry");
    let max = starts
        .iter()
        .map(|r| r["inflight"].as_u64().unwrap() as usize)
        .max()
        .unwrap();
    let order = starts
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    c.stop_cleanly();
    (max, ids, order)
}

#[test]
fn the_bound_is_reached_and_never_exceeded() {
    let (max, _, _) = max_in_flight(4, 40);
    assert_eq!(max, 4);
    let (max, _, _) = max_in_flight(16, 80);
    assert_eq!(max, 16);
}

#[test]
fn one_at_a_time_keeps_the_stream_order() {
    let (max, ids, order) = max_in_flight(1, 12);
    assert_eq!(max, 1);
    assert_eq!(order, ids);
}
