//! Thousands of entries at several concurrencies, with failures mixed in: every delivery's body
//! checked byte for byte by its digest, every entry acknowledged, nothing dead-lettered, no
//! duplicate in a run without faults.

use std::collections::BTreeMap;
use std::time::Instant;

use runr_testkit::redis::Redis;

use crate::support::*;

/// Value sizes that straddle buffer boundaries.
const SIZES: &[usize] = &[0, 1, 100, 4095, 4096, 4097, 65535, 65536, 65537];

fn stress(entries: usize, concurrency: usize) {
    let t0 = Instant::now();
    let dir = tmp();
    let redis = Redis::start();
    // Entries whose n is a multiple of 7 fail their first attempt.
    let receiver = Receiver::start(dir.path(), &["--fail-mod", "7"]);
    create_group(&redis);
    let mut conn = redis.conn();
    let mut expected = BTreeMap::new();
    let mut commands = Vec::new();
    let mut values = Vec::new();
    for n in 0..entries {
        let size = SIZES[n % SIZES.len()];
        // Text with characters JSON escapes, so escaping is checked under load too.
        let pattern = "ab\"c\\d\ne/f";
        let mut value = pattern.repeat(size / pattern.len() + 1);
        value.truncate(size);
        values.push((n.to_string(), value));
    }
    for (n, value) in &values {
        commands.push(vec![
            b"XADD".to_vec(),
            STREAM.as_bytes().to_vec(),
            b"*".to_vec(),
            b"n".to_vec(),
            n.as_bytes().to_vec(),
            b"v".to_vec(),
            value.as_bytes().to_vec(),
        ]);
    }
    let mut ids = Vec::new();
    for (chunk, vals) in commands.chunks(500).zip(values.chunks(500)) {
        for (reply, (n, value)) in conn.pipeline(chunk).into_iter().zip(vals) {
            let id = reply.text();
            let body = expected_body(&[("n", n), ("v", value)]);
            expected.insert(
                id.clone(),
                (
                    n.parse::<usize>().unwrap(),
                    sha256(body.as_bytes()),
                    body.len(),
                ),
            );
            ids.push(id);
        }
    }
    let start = Instant::now();
    let c_env = with(
        base_env(&redis, &receiver.url(), "c1"),
        &[
            ("RUNR_QUEUE_CONCURRENCY", &concurrency.to_string()),
            ("RUNR_QUEUE_BACKOFF", "10ms"),
            ("RUNR_QUEUE_BACKOFF_MAX", "20ms"),
            ("RUNR_QUEUE_LOG", "info"),
        ],
    );
    let mut c = Consumer::start(dir.path(), "c1", &c_env);
    wait_all_acked(&redis, &receiver, &ids);
    let took = start.elapsed();
    let verify = Instant::now();
    receiver.assert_no_problems();

    let mut seen: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for r in receiver.phase("end") {
        let id = r["id"].as_str().unwrap().to_string();
        let (_, sha, len) = &expected[&id];
        assert_eq!(r["sha256"], sha.as_str(), "{id}: body differs");
        assert_eq!(r["length"], *len);
        assert!(r["inflight"].as_u64().unwrap() as usize <= concurrency);
        seen.entry(id).or_default().push((
            r["attempt"].as_u64().unwrap(),
            r["status"].as_u64().unwrap(),
        ));
    }
    assert_eq!(seen.len(), entries);
    // The receiver writes its end record after the answer: a retry can be recorded first.
    for attempts in seen.values_mut() {
        attempts.sort_unstable();
    }
    for (id, (n, _, _)) in &expected {
        let want: &[(u64, u64)] = if n % 7 == 0 {
            &[(1, 500), (2, 200)]
        } else {
            &[(1, 200)]
        };
        assert_eq!(seen[id], want, "{id} (n={n})");
    }
    assert_eq!(conn.pending(STREAM, GROUP), 0);
    assert_eq!(conn.cmd_str(&["XLEN", DLQ]).int(), 0);
    c.stop_cleanly();
    eprintln!(
        "{entries} entries at concurrency {concurrency}: set up in {:?}, delivered in {took:?}, \
         checked in {:?}",
        start.duration_since(t0),
        verify.elapsed()
    );
}

#[test]
fn stress_at_concurrency_1() {
    stress(200, 1);
}

#[test]
fn stress_at_concurrency_2() {
    stress(300, 2);
}

#[test]
fn stress_at_concurrency_8() {
    stress(1000, 8);
}

#[test]
fn stress_at_concurrency_32() {
    stress(3000, 32);
}
