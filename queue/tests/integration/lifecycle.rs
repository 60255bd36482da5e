//! The group's lifecycle under autoscaling: created ahead (or by the consumer) where
//! `RUNR_QUEUE_START` says, so the backlog that made an autoscaler start consumers from zero is
//! delivered; created again where the consumer left off after Redis lost its data, so nothing
//! producers write after the loss is skipped; and left by a consumer that exits cleanly.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use runr_testkit::redis::{Redis, Reply};
use runr_testkit::wait_for;

use crate::support::*;

/// `runr-queue create-group` with `vars`: its exit status and stdout.
fn create_group(vars: &[(String, String)]) -> (std::process::ExitStatus, String) {
    let out = command(vars).arg("create-group").output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The consumers of the group (`XINFO CONSUMERS`), by name.
fn consumers(redis: &Redis) -> Vec<String> {
    redis
        .conn()
        .cmd_str(&["XINFO", "CONSUMERS", STREAM, GROUP])
        .items()
        .iter()
        .map(|c| {
            let kv = c.items();
            let i = kv.iter().position(|v| v.text() == "name").unwrap();
            kv[i + 1].text()
        })
        .collect()
}

/// How many times the receiver saw each id start.
fn starts(receiver: &Receiver) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in receiver.phase("start") {
        *out.entry(r["id"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    out
}

#[test]
fn scale_from_zero_with_a_backlog_of_1000() {
    let dir = tmp();
    let redis = Redis::start();
    // Producers wrote while no consumer ran and no group existed: what KEDA's lag (the stream's
    // length, as long as the group is missing) scales up on.
    let mut conn = redis.conn();
    let commands: Vec<Vec<Vec<u8>>> = (0..1000)
        .map(|i| {
            ["XADD", STREAM, "*", "n", &i.to_string()]
                .iter()
                .map(|s| s.as_bytes().to_vec())
                .collect()
        })
        .collect();
    let ids: Vec<String> = conn.pipeline(&commands).iter().map(Reply::text).collect();
    assert_eq!(ids.len(), 1000);

    let receiver = Receiver::start(dir.path(), &[]);
    let env = with(
        base_env(&redis, &receiver.url(), "pod-1"),
        &[("RUNR_QUEUE_START", "0"), ("RUNR_QUEUE_CONCURRENCY", "16")],
    );
    // The init container: the group ahead of the consumer, at the start of the stream.
    let (status, out) = create_group(&env);
    assert!(status.success(), "{status}: {out}");
    assert_eq!(out, "created group orders-api on stream orders at 0\n");
    // Every pod start runs it again: an existing group is left as it is.
    let (status, out) = create_group(&env);
    assert!(status.success(), "{status}: {out}");
    assert_eq!(
        out,
        "group orders-api on stream orders exists: left as it is\n"
    );

    let mut c = Consumer::start(dir.path(), "pod-1", &env);
    wait_all_acked(&redis, &receiver, &ids);
    receiver.assert_no_problems();
    // Exactly once: a counting function saw each entry one time, on its first attempt.
    let seen = starts(&receiver);
    assert_eq!(seen.len(), 1000);
    assert!(seen.values().all(|n| *n == 1), "duplicates: {seen:?}");
    assert!(
        !c.log().contains("created the consumer group"),
        "{}",
        c.log()
    );
    assert_eq!(consumers(&redis), ["pod-1"]);
    c.stop_cleanly();
    // Scaled in: the pod leaves the group, holding nothing.
    assert!(
        c.log()
            .contains("left the consumer group (nothing pending on this consumer)"),
        "{}",
        c.log()
    );
    assert_eq!(consumers(&redis), Vec::<String>::new());
}

#[test]
fn the_consumer_creates_its_group_at_the_start_it_is_given() {
    let dir = tmp();
    let redis = Redis::start();
    let mut conn = redis.conn();
    let old = conn.xadd(STREAM, &[("k", "before the group")]);
    let later = conn.xadd(STREAM, &[("k", "also before")]);
    let receiver = Receiver::start(dir.path(), &[]);
    // An entry id: the entries after it.
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &receiver.url(), "c1"),
            &[("RUNR_QUEUE_START", old.as_str())],
        ),
    );
    assert!(
        c.log().contains(&format!(
            "created the consumer group stream=orders group=orders-api at={old}"
        )),
        "{}",
        c.log()
    );
    let new = conn.xadd(STREAM, &[("k", "after")]);
    wait_all_acked(&redis, &receiver, &[later.clone(), new.clone()]);
    assert_eq!(
        receiver.succeeded().keys().cloned().collect::<Vec<_>>(),
        [later, new]
    );
    c.stop_cleanly();
}

#[test]
fn a_consumer_with_entries_pending_stays_in_the_group() {
    let dir = tmp();
    let redis = Redis::start();
    let gate = Gate::closed(dir.path(), "held");
    let receiver = Receiver::start(dir.path(), &["--hold-while", gate.arg()]);
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &receiver.url(), "c1"),
            &[("RUNR_QUEUE_DRAIN_TIMEOUT", "0")],
        ),
    );
    redis.conn().xadd(STREAM, &[("k", "v")]);
    receiver.wait_started(1);
    // Stopped at the drain limit with the delivery in flight: the entry stays pending on it,
    // and so does the consumer (DELCONSUMER would drop the entry).
    let status = c.terminate(LONG);
    assert!(status.success(), "{status}");
    assert!(!c.log().contains("left the consumer group"), "{}", c.log());
    assert_eq!(consumers(&redis), ["c1"]);
    assert_eq!(redis.conn().pending(STREAM, GROUP), 1);
    gate.open();
}

/// A producer writing entries one after another over its own connection, through a Redis
/// restart: it connects again when the connection fails, and records the id of every entry Redis
/// acknowledged, and how many connections it had used by then.
struct Producer {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(String, usize)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Producer {
    fn start(addr: SocketAddr) -> Producer {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let (s, a) = (stop.clone(), acked.clone());
        let thread = std::thread::spawn(move || {
            let mut n = 0u64;
            let mut connections = 0usize;
            while !s.load(Ordering::Relaxed) {
                let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200))
                else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                connections += 1;
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let mut reader = BufReader::new(stream);
                while !s.load(Ordering::Relaxed) {
                    let v = n.to_string();
                    let cmd = format!(
                        "*5\r\n$4\r\nXADD\r\n${}\r\n{STREAM}\r\n$1\r\n*\r\n$1\r\nn\r\n${}\r\n{v}\r\n",
                        STREAM.len(),
                        v.len()
                    );
                    if reader.get_mut().write_all(cmd.as_bytes()).is_err() {
                        break;
                    }
                    let mut head = String::new();
                    let mut id = String::new();
                    let ok = matches!(reader.read_line(&mut head), Ok(n) if n > 0)
                        && head.starts_with('$')
                        && matches!(reader.read_line(&mut id), Ok(n) if n > 0);
                    if !ok {
                        break;
                    }
                    n += 1;
                    a.lock()
                        .unwrap()
                        .push((id.trim_end().to_string(), connections));
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        });
        Producer {
            stop,
            acked,
            thread: Some(thread),
        }
    }

    fn acked(&self) -> Vec<(String, usize)> {
        self.acked.lock().unwrap().clone()
    }

    fn finish(&mut self) -> Vec<(String, usize)> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.acked()
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[test]
fn redis_restarted_without_persistence_while_producers_write() {
    let dir = tmp();
    let mut redis = Redis::start();
    let data = redis.conn().cmd_str(&["CONFIG", "GET", "dir"]).items()[1].text();
    let receiver = Receiver::start(dir.path(), &[]);
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &receiver.url(), "c1"),
            &[("RUNR_QUEUE_CONCURRENCY", "4")],
        ),
    );
    let mut producer = Producer::start(redis.addr());
    wait_for("deliveries before the restart", LONG, || {
        (receiver.succeeded().len() >= 20).then_some(())
    });
    // The consumer is frozen across the restart, so the new server holds entries (and the
    // stream, without its group) before the consumer notices the loss: created again at `$`,
    // the group would skip them.
    c.child.signal(Signal::SIGSTOP);
    redis.kill();
    // What a Redis without persistence comes back with: nothing.
    for f in std::fs::read_dir(&data).unwrap() {
        let f = f.unwrap();
        if f.file_name() != "redis.log" {
            let p = f.path();
            if p.is_dir() {
                std::fs::remove_dir_all(p).unwrap();
            } else {
                std::fs::remove_file(p).unwrap();
            }
        }
    }
    redis.start_again();
    wait_for("entries written to the new server", LONG, || {
        let n = redis.conn().cmd_str(&["XLEN", STREAM]).int();
        (n >= 30).then_some(())
    });
    assert_eq!(
        redis.conn().cmd_str(&["EXISTS", STREAM]).int(),
        1,
        "the stream, without its group"
    );
    c.child.signal(Signal::SIGCONT);
    c.wait_log("created it again after the last entry this consumer saw");
    // The producers go on writing for a while after the group is back.
    let more = producer.acked().len() + 50;
    wait_for("more entries written", LONG, || {
        (producer.acked().len() >= more).then_some(())
    });
    let acked = producer.finish();
    let first_connection = acked[0].1;
    let after: Vec<String> = acked
        .iter()
        .filter(|(_, conn)| *conn > first_connection)
        .map(|(id, _)| id.clone())
        .collect();
    // Everything the new server holds is what producers wrote after the restart.
    let held: Vec<String> = redis
        .conn()
        .xrange(STREAM)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(held, after, "the entries acknowledged by the new server");
    assert!(after.len() >= 80, "{}", after.len());
    // Nothing added after the restart is lost.
    wait_all_acked(&redis, &receiver, &after);
    receiver.assert_no_problems();
    let line = c.lines_with("created it again").join("\n");
    assert!(!line.contains("at=$") && !line.contains("at=0 "), "{line}");
    assert_eq!(redis.conn().cmd_str(&["XLEN", DLQ]).int(), 0);
    c.stop_cleanly();
}
