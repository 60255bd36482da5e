//! Redis Sentinel: the consumer asks the sentinels for the master and follows a failover.
//! A real master, a real replica and one real `redis-sentinel` (Debian's packages), each on a
//! free port with its files in the test's directory.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runr_testkit::redis::{Conn, Reply};
use runr_testkit::{free_port, wait_for, Child};

use crate::support::*;

const SERVICE: &str = "runrmain";

/// A master, its replica and a sentinel that watches them.
struct Topology {
    _servers: Vec<Child>,
    sentinel_port: u16,
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn redis_server(dir: &Path, port: u16, replica_of: Option<u16>) -> Child {
    let data = dir.join(format!("redis-{port}"));
    std::fs::create_dir_all(&data).unwrap();
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1"])
        .args(["--protected-mode", "no"])
        .arg("--dir")
        .arg(&data)
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .arg("--logfile")
        .arg(data.join("redis.log"));
    if let Some(master) = replica_of {
        cmd.args(["--replicaof", "127.0.0.1", &master.to_string()]);
    }
    let child = Child::spawn(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("spawn redis-server");
    wait_for(&format!("redis-server on {port}"), LONG, || {
        let mut c = Conn::try_connect(addr(port))?;
        matches!(c.try_cmd(&[b"PING"]), Some(Reply::Simple(s)) if s == "PONG").then_some(())
    });
    child
}

impl Topology {
    fn start(dir: &Path) -> Topology {
        let (m, r, s) = (free_port(), free_port(), free_port());
        let master = redis_server(dir, m, None);
        let replica = redis_server(dir, r, Some(m));
        wait_for("the replica in sync", LONG, || {
            let info = Conn::try_connect(addr(r))?.try_cmd(&[b"INFO", b"replication"])?;
            matches!(info, Reply::Bulk(b) if String::from_utf8_lossy(&b).contains("master_link_status:up"))
                .then_some(())
        });
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {s}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                 sentinel monitor {SERVICE} 127.0.0.1 {m} 1\n\
                 sentinel down-after-milliseconds {SERVICE} 1000\n\
                 sentinel failover-timeout {SERVICE} 10000\n",
                dir = dir.display()
            ),
        )
        .unwrap();
        let sentinel = Child::spawn(
            Command::new("redis-sentinel")
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .expect("spawn redis-sentinel");
        let t = Topology {
            _servers: vec![master, replica, sentinel],
            sentinel_port: s,
        };
        wait_for("the sentinel to know the replica", LONG, || {
            let Reply::Array(replicas) = t.sentinel(&["SENTINEL", "REPLICAS", SERVICE])? else {
                return None;
            };
            let text = format!("{replicas:?}");
            (!replicas.is_empty() && !text.contains("s_down")).then_some(())
        });
        t
    }

    fn sentinel(&self, args: &[&str]) -> Option<Reply> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        Conn::try_connect(addr(self.sentinel_port))?.try_cmd(&args)
    }

    /// The master's port as the sentinel names it now.
    fn master_port(&self) -> Option<u16> {
        let Reply::Array(items) =
            self.sentinel(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE])?
        else {
            return None;
        };
        match items.get(1)? {
            Reply::Bulk(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        }
    }

    fn url(&self) -> String {
        format!(
            "redis+sentinel://127.0.0.1:{}/{SERVICE}",
            self.sentinel_port
        )
    }
}

/// `XADD` to the master of the moment until one is confirmed by the replica too (`WAIT 1`): an
/// entry only the old master took when the sentinel promoted the replica is not confirmed, and
/// is written again (its first copy may still be delivered: a duplicate, counted).
fn produce(t: &Topology, n: usize) {
    let n = n.to_string();
    loop {
        let confirmed = (|| {
            let mut c = Conn::try_connect(addr(t.master_port()?))?;
            let id = c.try_cmd(&[b"XADD", STREAM.as_bytes(), b"*", b"n", n.as_bytes()])?;
            if matches!(id, Reply::Error(_)) {
                return None;
            }
            let acks = c.try_cmd(&[b"WAIT", b"1", b"1000"])?;
            matches!(acks, Reply::Int(k) if k >= 1).then_some(())
        })();
        if confirmed.is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_failover_mid_run_loses_nothing() {
    const ENTRIES: usize = 400;
    let dir = tmp();
    let t = Arc::new(Topology::start(dir.path()));
    let first_master = t.master_port().unwrap();
    let receiver = Receiver::start(dir.path(), &[]);
    let vars: Vec<(String, String)> = [
        ("RUNR_QUEUE_REDIS_URL", t.url()),
        ("RUNR_QUEUE_STREAM", STREAM.to_string()),
        ("RUNR_QUEUE_GROUP", GROUP.to_string()),
        ("RUNR_QUEUE_CONSUMER", "c1".to_string()),
        ("RUNR_QUEUE_TARGET", receiver.url()),
        ("RUNR_QUEUE_START", "0".to_string()),
        ("RUNR_QUEUE_CONCURRENCY", "4".to_string()),
        // An ack only the old master took leaves the entry pending on the new one: it is claimed
        // back after this (the default, 60 s, outlasts the test's wait).
        ("RUNR_QUEUE_CLAIM_IDLE", "2s".to_string()),
        ("RUNR_QUEUE_LOG", "debug".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut c = Consumer::start(dir.path(), "c1", &vars);
    let produced = Arc::new(Mutex::new(BTreeSet::new()));
    let done = Arc::new(AtomicBool::new(false));
    let producer = {
        let (t, produced, done) = (t.clone(), produced.clone(), done.clone());
        std::thread::spawn(move || {
            for n in 0..ENTRIES {
                produce(&t, n);
                produced.lock().unwrap().insert(n.to_string());
                std::thread::sleep(Duration::from_millis(5));
            }
            done.store(true, Ordering::Release);
        })
    };
    // The failover while the producer writes and deliveries run.
    receiver.wait_started(50);
    wait_for("the sentinel to accept the failover", LONG, || {
        matches!(
            t.sentinel(&["SENTINEL", "FAILOVER", SERVICE]),
            Some(Reply::Simple(_))
        )
        .then_some(())
    });
    wait_for("the replica promoted", LONG, || {
        t.master_port().filter(|p| *p != first_master)
    });
    producer.join().unwrap();
    assert!(done.load(Ordering::Acquire));
    let produced = produced.lock().unwrap().clone();
    assert_eq!(produced.len(), ENTRIES);
    // Every confirmed entry delivered, and all acknowledged on the new master.
    let delivered = wait_for("every confirmed entry delivered and acked", LONG, || {
        // n → (deliveries, the entry ids that carried it).
        let mut counts: BTreeMap<String, (usize, BTreeSet<String>)> = BTreeMap::new();
        for r in receiver.phase("start") {
            if let Some(n) = r["data"]["n"].as_str() {
                let e = counts.entry(n.to_string()).or_default();
                e.0 += 1;
                e.1.insert(r["id"].as_str().unwrap_or_default().to_string());
            }
        }
        let all = produced.iter().all(|n| counts.contains_key(n));
        let mut m = Conn::try_connect(addr(t.master_port()?))?;
        let pending = m.try_cmd(&[b"XPENDING", STREAM.as_bytes(), GROUP.as_bytes()])?;
        let idle = matches!(&pending, Reply::Array(p) if p.first() == Some(&Reply::Int(0)));
        (all && idle).then_some(counts)
    });
    let lost: Vec<&String> = produced
        .iter()
        .filter(|n| !delivered.contains_key(*n))
        .collect();
    assert!(lost.is_empty(), "lost: {lost:?}");
    // A duplicate is either the same entry delivered again (its ack was lost with the old
    // master, or the delivery was cut by the failover) or a second entry with the same `n`
    // (the producer wrote it again, unconfirmed, and the first copy survived).
    let deliveries: usize = delivered.values().map(|(k, _)| k).sum();
    let entries: usize = delivered.values().map(|(_, ids)| ids.len()).sum();
    eprintln!(
        "failover: {} confirmed, 0 lost, {} duplicate deliveries: {} of an entry delivered again, {} of an entry written again",
        produced.len(),
        deliveries - produced.len(),
        deliveries - entries,
        entries - produced.len(),
    );
    receiver.assert_no_problems();
    c.wait_log("redis is available again");
    assert!(c.running(), "{}", c.log());
    assert_eq!(c.lines_with("redis is unavailable").len(), 1, "{}", c.log());
    assert_eq!(
        c.lines_with("redis is available again").len(),
        1,
        "{}",
        c.log()
    );
    let status = c.terminate(LONG);
    assert!(status.success(), "{status}: {}", c.log());
}
