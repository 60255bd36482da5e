//! Redis Cluster: the consumer finds the master of the stream's hash slot from any node named
//! in the URL, moves dead letters (and `runr-queue redrive` moves them back) in one `MULTI` on
//! that master, and follows the slot when it is moved to another master mid-run, losing
//! nothing. Three real `redis-server --cluster-enabled yes` masters (testkit's [`Cluster`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runr_testkit::redis::{key_slot, Cluster, Conn, Reply};
use runr_testkit::wait_for;

use crate::redrive::printed;
use crate::support::*;

/// The node (0–2) that serves `key` now: the one whose answer to `XLEN` is not a redirection.
fn owner(cluster: &Cluster, key: &str) -> Option<usize> {
    (0..3).find(|&i| {
        let mut c = Conn::try_connect(cluster.addrs()[i]).expect("connect to a cluster node");
        match c.try_cmd(&[b"XLEN", key.as_bytes()]) {
            Some(Reply::Error(e)) => !(e.starts_with("MOVED") || e.starts_with("ASK")),
            Some(_) => true,
            None => false,
        }
    })
}

/// A stream name with a hash tag whose slot is not served by node 0, so that a consumer given
/// only node 0 must ask the cluster where the stream lives.
fn stream_away_from_node_0(cluster: &Cluster) -> String {
    (0..)
        .map(|i| format!("{{q{i}}}"))
        .find(|s| owner(cluster, s).is_some_and(|o| o != 0))
        .unwrap()
}

/// The environment of a consumer of `stream` that knows only node 0 of `cluster`.
fn cluster_env(cluster: &Cluster, stream: &str, target: &str, name: &str) -> Vec<(String, String)> {
    [
        (
            "RUNR_QUEUE_REDIS_URL",
            format!("redis+cluster://{}", cluster.addrs()[0]),
        ),
        ("RUNR_QUEUE_STREAM", stream.to_string()),
        ("RUNR_QUEUE_GROUP", GROUP.to_string()),
        ("RUNR_QUEUE_CONSUMER", name.to_string()),
        ("RUNR_QUEUE_TARGET", target.to_string()),
        ("RUNR_QUEUE_START", "0".to_string()),
        ("RUNR_QUEUE_LOG", "debug".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn source(stream: &str) -> String {
    format!("/redisstream/{stream}/{GROUP}")
}

fn pending(conn: &mut Conn, stream: &str) -> Option<i64> {
    match conn.try_cmd(&[b"XPENDING", stream.as_bytes(), GROUP.as_bytes()])? {
        Reply::Array(p) => match p.first() {
            Some(Reply::Int(n)) => Some(*n),
            _ => None,
        },
        _ => None,
    }
}

#[test]
fn a_consumer_that_knows_one_node_delivers_and_dead_letters_on_the_streams_master() {
    let dir = tmp();
    let cluster = Cluster::start();
    let stream = stream_away_from_node_0(&cluster);
    let dead_letters = format!("{stream}-dlq");
    assert_eq!(
        key_slot(stream.as_bytes()),
        key_slot(dead_letters.as_bytes())
    );
    let home = owner(&cluster, &stream).unwrap();
    let mut conn = cluster.conn(home);
    // A backlog written before any consumer runs (a scale from zero): every fifth entry is
    // answered 500 crash by the function and dead-lettered after its one attempt.
    for n in 0..40 {
        let n = n.to_string();
        let mut fields = vec![("n", n.as_str())];
        if n.parse::<u32>().unwrap() % 5 == 0 {
            fields.extend([("status", "500"), ("class", "crash")]);
        }
        conn.xadd(&stream, &fields);
    }
    let receiver = Receiver::start(dir.path(), &["--by-field", "--source", &source(&stream)]);
    // The first node of the URL is not there (a node that was replaced): the next one is asked.
    let url = format!(
        "redis+cluster://127.0.0.1:{},{}",
        runr_testkit::free_port(),
        cluster.addrs()[0]
    );
    let vars = with(
        cluster_env(&cluster, &stream, &receiver.url(), "c1"),
        &[
            ("RUNR_QUEUE_REDIS_URL", &url),
            ("RUNR_QUEUE_MAX_ATTEMPTS", "1"),
            ("RUNR_QUEUE_CONCURRENCY", "8"),
        ],
    );
    let mut c = Consumer::start(dir.path(), "c1", &vars);
    wait_for("32 delivered, 8 dead-lettered, none pending", LONG, || {
        let dead = conn.try_cmd(&[b"XLEN", dead_letters.as_bytes()])?;
        (receiver.succeeded().len() == 32
            && dead == Reply::Int(8)
            && pending(&mut conn, &stream) == Some(0))
        .then_some(())
    });
    receiver.assert_no_problems();
    let dead = conn.xrange(&dead_letters);
    assert_eq!(dead.len(), 8);
    for (_, fields) in &dead {
        let find = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(find("runr-error").as_deref(), Some("crash"), "{fields:?}");
        assert_eq!(find("runr-status").as_deref(), Some("500"), "{fields:?}");
        let n: u32 = find("n").unwrap().parse().unwrap();
        assert_eq!(n % 5, 0, "{fields:?}");
    }
    // Nothing of the stream on the other nodes.
    for other in (0..3).filter(|&i| i != home) {
        let r = cluster.conn(other).cmd_str(&["XLEN", &stream]);
        assert!(
            matches!(&r, Reply::Error(e) if e.starts_with("MOVED")),
            "{r:?}"
        );
    }
    c.stop_cleanly();
    assert!(c.log().contains("redis+cluster://"), "{}", c.log());

    // The redrive subcommand, also given only node 0, moves them back in the stream's slot.
    let admin: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(k, _)| k != "RUNR_QUEUE_TARGET" && k != "RUNR_QUEUE_CONSUMER")
        .collect();
    let before = conn.cmd_str(&["XLEN", &stream]).int();
    let out = command(&admin)
        .args(["redrive", "--only", "crash"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        printed(&out.stdout),
        format!("moved 8 dead letters from {dead_letters} to {stream}\n")
    );
    assert_eq!(conn.cmd_str(&["XLEN", &dead_letters]).int(), 0);
    assert_eq!(conn.cmd_str(&["XLEN", &stream]).int(), before + 8);
}

/// `XADD stream * n <n>` on whichever node takes it: while the slot moves, the nodes answer
/// `MOVED` or `ASK` until the move is complete, and the producer tries again.
fn produce(cluster: &Cluster, stream: &str, n: usize) {
    let n = n.to_string();
    loop {
        for addr in cluster.addrs() {
            let Some(mut c) = Conn::try_connect(addr) else {
                continue;
            };
            match c.try_cmd(&[b"XADD", stream.as_bytes(), b"*", b"n", n.as_bytes()]) {
                Some(Reply::Bulk(_)) => return,
                _ => continue,
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `CLUSTER MYID` of node `i`.
fn node_id(cluster: &Cluster, i: usize) -> String {
    cluster.conn(i).cmd_str(&["CLUSTER", "MYID"]).text()
}

/// Moves `slot` and its keys from node `from` to node `to`, as `redis-cli --cluster reshard`
/// does it: the target imports, the source migrates, the keys are `MIGRATE`d, and every node
/// is told the new owner.
fn move_slot(cluster: &Cluster, slot: u16, from: usize, to: usize) {
    let (from_id, to_id) = (node_id(cluster, from), node_id(cluster, to));
    let slot = slot.to_string();
    let ok = Reply::Simple("OK".into());
    assert_eq!(
        cluster
            .conn(to)
            .cmd_str(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]),
        ok
    );
    assert_eq!(
        cluster
            .conn(from)
            .cmd_str(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]),
        ok
    );
    let to_addr = cluster.addrs()[to];
    loop {
        let Reply::Array(keys) =
            cluster
                .conn(from)
                .cmd_str(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"])
        else {
            panic!("GETKEYSINSLOT");
        };
        if keys.is_empty() {
            break;
        }
        let port = to_addr.port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "10000", "KEYS"];
        let keys: Vec<String> = keys.iter().map(Reply::text).collect();
        args.extend(keys.iter().map(String::as_str));
        let r = cluster.conn(from).cmd_str(&args);
        assert_eq!(r, ok, "MIGRATE {keys:?}");
    }
    for i in [to, from, 3 - to - from] {
        assert_eq!(
            cluster
                .conn(i)
                .cmd_str(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]),
            ok
        );
    }
}

#[test]
fn the_consumer_follows_its_slot_to_another_master_mid_run_and_loses_nothing() {
    const ENTRIES: usize = 300;
    let dir = tmp();
    let cluster = Arc::new(Cluster::start());
    let stream = stream_away_from_node_0(&cluster);
    let from = owner(&cluster, &stream).unwrap();
    let to = 3 - from; // neither 0 nor `from`
    let receiver = Receiver::start(dir.path(), &["--source", &source(&stream)]);
    let vars = with(
        cluster_env(&cluster, &stream, &receiver.url(), "c1"),
        &[("RUNR_QUEUE_CONCURRENCY", "4")],
    );
    let mut c = Consumer::start(dir.path(), "c1", &vars);
    let done = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(Mutex::new(BTreeSet::new()));
    let producer = {
        let (cluster, stream, done, produced) = (
            cluster.clone(),
            stream.clone(),
            done.clone(),
            produced.clone(),
        );
        std::thread::spawn(move || {
            for n in 0..ENTRIES {
                produce(&cluster, &stream, n);
                produced.lock().unwrap().insert(n.to_string());
                std::thread::sleep(Duration::from_millis(5));
            }
            done.store(true, Ordering::Release);
        })
    };
    // The move while the producer writes and deliveries run.
    receiver.wait_started(50);
    move_slot(&cluster, key_slot(stream.as_bytes()), from, to);
    assert_eq!(owner(&cluster, &stream), Some(to));
    producer.join().unwrap();
    assert!(done.load(Ordering::Acquire));
    let produced = produced.lock().unwrap().clone();
    assert_eq!(produced.len(), ENTRIES);
    let mut conn = cluster.conn(to);
    let delivered = wait_for(
        "every entry delivered and acked on the new master",
        LONG,
        || {
            let mut counts: BTreeMap<String, usize> = BTreeMap::new();
            for r in receiver.phase("start") {
                if let Some(n) = r["data"]["n"].as_str() {
                    *counts.entry(n.to_string()).or_default() += 1;
                }
            }
            let all = produced.iter().all(|n| counts.contains_key(n));
            (all && pending(&mut conn, &stream) == Some(0)).then_some(counts)
        },
    );
    let lost: Vec<&String> = produced
        .iter()
        .filter(|n| !delivered.contains_key(*n))
        .collect();
    assert!(lost.is_empty(), "lost: {lost:?}");
    // Each entry was written once, and the pending list moved with the stream: an entry is
    // delivered again only when its delivery was cut by the move (counted, not expected).
    let again: usize = delivered.values().map(|k| k - 1).sum();
    eprintln!("slot moved: {ENTRIES} entries, 0 lost, {again} delivered again");
    receiver.assert_no_problems();
    assert_eq!(receiver.succeeded().len(), ENTRIES);
    assert!(c.running(), "{}", c.log());
    // The consumer saw the move (its old master answered MOVED or ASK: an outage, logged once
    // when it began and once when it ended) and never created the group again at the old master
    // (the stream moved with its group).
    c.wait_log("redis is available again");
    assert!(
        !c.lines_with("redis is unavailable").is_empty(),
        "{}",
        c.log()
    );
    assert!(!c.log().contains("created it again"), "{}", c.log());
    let status = c.terminate(LONG);
    assert!(status.success(), "{status}: {}", c.log());
}

#[test]
fn a_dead_letter_stream_in_another_slot_exits_2_naming_both_variables() {
    // No cluster is needed: the names are checked before anything is connected.
    let vars: Vec<(String, String)> = [
        (
            "RUNR_QUEUE_REDIS_URL",
            "redis+cluster://127.0.0.1:1,127.0.0.1:2",
        ),
        ("RUNR_QUEUE_STREAM", "orders"),
        ("RUNR_QUEUE_GROUP", GROUP),
        ("RUNR_QUEUE_CONSUMER", "c1"),
        ("RUNR_QUEUE_TARGET", "http://127.0.0.1:1/"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let out = command(&vars).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("RUNR_QUEUE_DEAD_LETTER_STREAM=\\\"orders-dlq\\\"")
            && lines[0].contains("RUNR_QUEUE_STREAM=orders")
            && lines[0].contains("e.g. RUNR_QUEUE_DEAD_LETTER_STREAM={orders}-dlq"),
        "{err}"
    );
    // With the suggested name it starts (and waits for the cluster that is not there).
    let fixed = with(vars, &[("RUNR_QUEUE_DEAD_LETTER_STREAM", "{orders}-dlq")]);
    let dir = tmp();
    let mut c = Consumer::spawn(dir.path(), "c1", &fixed);
    c.wait_log("redis is unavailable");
    let status = c.terminate(LONG);
    assert!(status.success(), "{status}: {}", c.log());
}
